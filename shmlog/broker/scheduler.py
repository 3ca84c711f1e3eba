"""The broker loop's periodic work: a list of (interval, task), each run when due,
and the services' ticks; the one place that runs either, and so the one place
that survives their failures.

Rules
-----
* Time is the caller's: milliseconds since the epoch (``records.now_ms``), passed
  in, so the loop reads the clock once per turn and tests can drive it.
* A task that is due runs once per :meth:`Scheduler.run_due`, however late it is,
  and is due again ``interval`` after that turn: a loop held up by a long request
  does not run a task several times to catch up.
* Tasks run in the order they were added.
* Periodic work (a task, or a service's tick through :meth:`Scheduler.tick`) that
  fails with an operating error (a :class:`ShmlogError` or an ``OSError``: a full
  disk, the open-files limit) is logged and runs again at its next turn, as
  Kafka's scheduler does: periodic housekeeping never stops the broker. A
  programming error still propagates.
* A process or host limit (``EMFILE``, ``ENFILE``, ``ENOMEM``, ``ENOSPC``: found by
  ``process_limits.limit_error``) is logged ONCE per limit, naming it and how to
  raise it, until every piece of work that hit it has run cleanly again (then one
  line says so): at the limit the same refusal comes every second from each task,
  and a log of thousands of identical lines (itself written to a full disk) hides
  what happened. Other failures are logged each time: they are rare and each may
  differ.
* A service whose tick failed is not ticked again before
  ``limits.PERIODIC_RETRY_MS``: its deadline has not moved, and the loop, which
  sleeps until the earliest deadline, would otherwise spin on it.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from ..common import limits
from ..common.errors import ShmlogError
from ..common.process_limits import limit_error

log = logging.getLogger(__name__)

__all__ = ["Scheduler"]


class _Task:
    __slots__ = ("interval_ms", "due", "run")

    def __init__(self, interval_ms: int, due: int, run: Callable[[int], None]):
        self.interval_ms, self.due, self.run = interval_ms, due, run


def _name(work: Callable) -> str:
    return getattr(work, "__qualname__", None) or repr(work)


class Scheduler:
    """Periodic tasks, each called with the time of the turn that runs it, and the
    guarded ticks of the broker's services."""

    def __init__(self) -> None:
        self._tasks: list[_Task] = []
        self._limits_hit: dict[str, set[str]] = {}    # limit -> the work refused by it
        self._held: dict[int, int] = {}              # id(service) -> not ticked before

    def every(self, interval_ms: int, run: Callable[[int], None], now: int) -> None:
        """Run ``run(now)`` every ``interval_ms``, first ``interval_ms`` after ``now``."""
        self._tasks.append(_Task(interval_ms, now + interval_ms, run))

    def run_due(self, now: int) -> None:
        """Run every task that is due at ``now``."""
        for task in self._tasks:
            if now >= task.due:
                task.due = now + task.interval_ms
                self._run(task.run, now, f"it runs again in {task.interval_ms} ms")

    def tick(self, services: Iterable, now: int) -> None:
        """Tick each service (``broker.service``) whose deadline came by ``now``."""
        for service in services:
            deadline = self._deadline(service)
            if deadline is not None and now >= deadline:
                self._held.pop(id(service), None)
                if not self._run(service.tick, now,
                                 f"it is ticked again in {limits.PERIODIC_RETRY_MS} ms"):
                    self._held[id(service)] = now + limits.PERIODIC_RETRY_MS

    def next_due(self, services: Iterable = ()) -> int | None:
        """When the next task is due, or the next of ``services`` is to be ticked
        (None without either)."""
        due = [task.due for task in self._tasks]
        due += [deadline for deadline in map(self._deadline, services) if deadline is not None]
        return min(due, default=None)

    def _deadline(self, service) -> int | None:
        deadline = service.next_deadline()
        held = self._held.get(id(service))
        return deadline if deadline is None or held is None else max(deadline, held)

    def _run(self, work: Callable[[int], None], now: int, again: str) -> bool:
        """Run one piece of periodic work; False when it failed (logged)."""
        name = _name(work)
        try:
            work(now)
        except (ShmlogError, OSError) as error:
            limit = limit_error(error)
            if limit is None:
                log.error("periodic work %s failed (%s); %s", name, error, again)
            else:
                self._limit_hit(limit.limit, name, limit)
            return False
        self._ran(name)
        return True

    def _limit_hit(self, limit: str, name: str, error: ShmlogError) -> None:
        refused = self._limits_hit.setdefault(limit, set())
        if not refused:
            log.error("periodic work is refused by a limit (%s): %s. The broker goes on "
                      "serving and retries it every turn; this is said once until it "
                      "runs again (first refused: %s)", limit, error, name)
        refused.add(name)

    def _ran(self, name: str) -> None:
        for limit, refused in list(self._limits_hit.items()):
            refused.discard(name)
            if not refused:
                del self._limits_hit[limit]
                log.warning("periodic work runs again: the limit (%s) no longer refuses it",
                            limit)
