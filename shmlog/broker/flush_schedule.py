"""When each partition's ``flush.ms`` comes due: the flush check visits only the
partitions whose time came, not every partition it hosts.

Rules
-----
* A log is watched while it holds unflushed records: it tells the schedule
  (``PartitionLog.flush_listener``) when it takes its first unflushed record, when
  its configuration changes and when a flush fails (it is retried later); the
  schedule asks it when it is due (``PartitionLog.flush_due_ms``) and keeps the
  earliest such time per log.
* :meth:`FlushSchedule.run` flushes, through ``PartitionLog.maybe_flush`` (the
  policy's one judge), every log whose time came; a log still unflushed after
  (its time moved on: a ``flush.messages`` flush in between, a failed flush) is
  scheduled again at its new time.
* A log that stops being hosted is forgotten (:meth:`FlushSchedule.forget`); what
  it left in the heap is skipped when it surfaces.

Theory of operation
-------------------
Kafka's flush scheduler looks at every log at each ``log.flush.scheduler.interval.ms``;
with the default ``flush.ms`` (never) and thousands of partitions that is all the
work an idle broker does. Here a heap holds (due, sequence, log) and a dict the
due time each log is scheduled at; an entry whose time no longer matches its
log's is stale and dropped when popped, so a log is never flushed twice for one
due time and rescheduling is a push. An idle broker's check is one look at the
heap's top; the default ``flush.ms`` puts a log at the end of time, where it stays.
"""

from __future__ import annotations

import heapq
import itertools

from ..segments import PartitionLog

__all__ = ["FlushSchedule"]


class FlushSchedule:
    """The flush due times of the logs holding unflushed records."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, PartitionLog]] = []
        self._due: dict[PartitionLog, int] = {}
        self._sequence = itertools.count()       # orders equal times; logs are not ordered

    def watch(self, partition_log: PartitionLog) -> None:
        """Flush ``partition_log`` when its flush policy says (from now on, and
        again at every change it tells)."""
        partition_log.flush_listener = self.reschedule
        self.reschedule(partition_log)

    def forget(self, partition_log: PartitionLog) -> None:
        """Stop watching ``partition_log`` (it is no longer hosted)."""
        partition_log.flush_listener = None
        self._due.pop(partition_log, None)

    def reschedule(self, partition_log: PartitionLog) -> None:
        """``partition_log`` may be due earlier than scheduled (the log calls this)."""
        due = partition_log.flush_due_ms()
        if due is None:
            return
        scheduled = self._due.get(partition_log)
        if scheduled is not None and scheduled <= due:
            return
        self._due[partition_log] = due
        heapq.heappush(self._heap, (due, next(self._sequence), partition_log))

    def run(self, now: int) -> int:
        """Flush the logs whose time came by ``now``; how many were looked at."""
        looked = 0
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, partition_log = heapq.heappop(heap)
            if self._due.get(partition_log) != due:
                continue                             # stale: rescheduled or forgotten
            del self._due[partition_log]
            looked += 1
            partition_log.maybe_flush(now)
            self.reschedule(partition_log)
        return looked

    def scheduled(self) -> int:
        """How many logs are waiting for their flush time."""
        return len(self._due)
