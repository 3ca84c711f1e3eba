"""The long poll, sans-I/O: which fetches a leader answers at once, and where the
others wait (Kafka's ``DelayedFetch`` in its fetch purgatory).

Rules
-----
* **Long poll** (``DelayedFetch``): a fetch with nothing to return waits in
  :class:`FetchPurgatory` until bytes arrive, the high watermark passes the one last
  sent, leadership changes, or its wait ends (:func:`partition_ready` says which
  partitions have something to return).
* A parked fetch holds no data, only what it waits for: the caller builds its
  answer when it fires, so the answer reads the log as it is then.

Theory of operation
-------------------
The leader's fetch serving (``fetch_serving``) parks a fetch under a key of its own
and tells the purgatory what moved (a log end, a high watermark, a leadership) and
when (``expire``); each call returns the keys to answer now. Deadlines sit in a heap
whose stale entries (fetches answered before their deadline) are skipped lazily.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Hashable, Mapping

from .messages import ErrorCode

__all__ = ["partition_ready", "FetchPurgatory"]


def partition_ready(*, error: ErrorCode, fetch_offset: int, log_end_offset: int,
                    high_watermark: int, high_watermark_last_sent: int) -> bool:
    """Must a fetch be answered at once for this partition (Kafka 2.8's
    ``ReplicaManager.fetchMessages``: "respond immediately if ... has enough data,
    some error happens while reading data, any of the requested partitions need HW
    update", with ``replica.fetch.min.bytes`` 1)? A fetch is answered at once if it
    asks to wait 0 ms, names no partition, or any partition is ready; otherwise it
    is parked in :class:`FetchPurgatory`."""
    return error is not ErrorCode.NONE or log_end_offset > fetch_offset \
        or high_watermark > high_watermark_last_sent


@dataclasses.dataclass
class _ParkedFetch:
    deadline_ms: int
    partitions: dict[Hashable, tuple[int, int]]     # partition -> (fetch offset, HW sent)


class FetchPurgatory:
    """Fetches that found nothing to return (no partition :func:`partition_ready`),
    parked until the first of (Kafka's ``DelayedFetch``, plus the high-watermark rule
    of the design note §3.2, which Kafka applies only as a fetch arrives):

    * :meth:`log_end_moved`: one of its partitions' log end passed its fetch offset
      (a follower's ``min_bytes`` is 1, Kafka's ``replica.fetch.min.bytes`` default:
      any record is enough);
    * :meth:`high_watermark_moved`: a partition's high watermark passed the one last
      sent to that fetcher (so a follower's HW, and what its readers see, does not lag
      ``max_wait_ms`` on a quiet partition);
    * :meth:`leadership_changed`: its answer now carries errors;
    * :meth:`expire`: its deadline passed (answered empty).

    Keys are the caller's (for example ``(peer, correlation id)``); partitions are
    any hashable name (``(topic_key, partition)``). Each method returns the keys to
    answer now, each once, in the order they were parked, and forgets them. A parked
    fetch holds no data: the caller builds the answer when it fires.
    """

    def __init__(self) -> None:
        self._parked: dict[Hashable, _ParkedFetch] = {}
        self._by_partition: dict[Hashable, dict[Hashable, None]] = {}
        self._deadlines: list[tuple[int, int, Hashable]] = []
        self._order = itertools.count()
        self._rank: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._parked

    def park(self, key: Hashable, deadline_ms: int,
             partitions: Mapping[Hashable, tuple[int, int]]) -> None:
        """Park fetch ``key`` until ``deadline_ms``; ``partitions`` maps each
        partition it asks for to ``(fetch_offset, high_watermark_last_sent)``."""
        assert key not in self._parked, f"fetch {key!r} is already parked"
        rank = next(self._order)
        self._parked[key] = _ParkedFetch(deadline_ms, dict(partitions))
        self._rank[key] = rank
        for partition in partitions:
            self._by_partition.setdefault(partition, {})[key] = None
        heapq.heappush(self._deadlines, (deadline_ms, rank, key))

    def remove(self, key: Hashable) -> bool:
        """Forget a parked fetch (its peer is gone); was it parked?"""
        fetch = self._parked.pop(key, None)
        if fetch is None:
            return False
        del self._rank[key]
        for partition in fetch.partitions:
            waiting = self._by_partition[partition]
            del waiting[key]
            if not waiting:
                del self._by_partition[partition]
        return True

    def log_end_moved(self, partition: Hashable, log_end_offset: int) -> list[Hashable]:
        """A partition's log end is now ``log_end_offset``: fetches with records to read."""
        return self._fire(partition, lambda offsets: log_end_offset > offsets[0])

    def high_watermark_moved(self, partition: Hashable, high_watermark: int) -> list[Hashable]:
        """A partition's high watermark is now ``high_watermark``: fetches last sent a
        lower one."""
        return self._fire(partition, lambda offsets: high_watermark > offsets[1])

    def leadership_changed(self, partition: Hashable) -> list[Hashable]:
        """A partition's leader or epoch changed: every fetch waiting on it."""
        return self._fire(partition, lambda offsets: True)

    def expire(self, now_ms: int) -> list[Hashable]:
        """Fetches whose deadline is at or before ``now_ms``."""
        fired = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, rank, key = heapq.heappop(self._deadlines)
            if self._rank.get(key) == rank:        # not answered meanwhile
                self.remove(key)
                fired.append(key)
        return fired

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a parked fetch (for the loop's sleep), or None."""
        while self._deadlines and self._rank.get(self._deadlines[0][2]) != self._deadlines[0][1]:
            heapq.heappop(self._deadlines)         # answered before its deadline
        return self._deadlines[0][0] if self._deadlines else None

    def _fire(self, partition: Hashable, fires) -> list[Hashable]:
        waiting = self._by_partition.get(partition)
        if not waiting:
            return []
        fired = [key for key in waiting if fires(self._parked[key].partitions[partition])]
        fired.sort(key=self._rank.__getitem__)
        for key in fired:
            self.remove(key)
        return fired

