"""The broker loop's periodic work: a list of (interval, task), each run when due.

Rules
-----
* Time is the caller's: milliseconds since the epoch (``records.now_ms``), passed
  in, so the loop reads the clock once per turn and tests can drive it.
* A task that is due runs once per :meth:`Scheduler.run_due`, however late it is,
  and is due again ``interval`` after that turn: a loop held up by a long request
  does not run a task several times to catch up.
* Tasks run in the order they were added.
* A task that fails with an operating error (a :class:`ShmlogError` or an
  ``OSError``: a full disk, the open-files limit) is logged and runs again at its
  next interval, as Kafka's scheduler does: periodic housekeeping never stops the
  broker. A programming error still propagates.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..common.errors import ShmlogError

log = logging.getLogger(__name__)

__all__ = ["Scheduler"]


class _Task:
    __slots__ = ("interval_ms", "due", "run")

    def __init__(self, interval_ms: int, due: int, run: Callable[[int], None]):
        self.interval_ms, self.due, self.run = interval_ms, due, run


class Scheduler:
    """Periodic tasks, each called with the time of the turn that runs it."""

    def __init__(self) -> None:
        self._tasks: list[_Task] = []

    def every(self, interval_ms: int, run: Callable[[int], None], now: int) -> None:
        """Run ``run(now)`` every ``interval_ms``, first ``interval_ms`` after ``now``."""
        self._tasks.append(_Task(interval_ms, now + interval_ms, run))

    def run_due(self, now: int) -> None:
        """Run every task that is due at ``now``."""
        for task in self._tasks:
            if now >= task.due:
                task.due = now + task.interval_ms
                try:
                    task.run(now)
                except (ShmlogError, OSError) as error:
                    log.error("periodic task %s failed (%s); it runs again in %d ms",
                              getattr(task.run, "__qualname__", task.run), error,
                              task.interval_ms)

    def next_due(self) -> int | None:
        """When the next task is due (None without tasks)."""
        return min((task.due for task in self._tasks), default=None)
