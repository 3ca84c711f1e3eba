"""How far ahead of its write position a partition keeps room reserved: the pace of
its reservations, following its write rate.

Rules
-----
* A partition that takes a record now and then holds
  :data:`limits.SEGMENT_RESERVE_AHEAD_MIN` beyond its data; one that fills as fast
  as memory goes holds up to :data:`limits.SEGMENT_RESERVE_AHEAD_MAX`. Nothing is
  reserved for a partition that was never written to.
* The distance grows when, and only when, an append found the reserved room used
  up (it had to reserve inline, stalling the writer): the partition fills faster
  than the prefaulter populates at the current distance.
* It shrinks by half for every :data:`limits.SEGMENT_RESERVE_DECAY_S` without such a
  stall, so a partition that was busy once holds little ahead once it is quiet.

Theory of operation
-------------------
Reserving is ``posix_fallocate`` plus ``MADV_POPULATE_WRITE`` (``mapped_file``): the
pages it populates are page cache that counts in the broker's resident memory for
as long as the file is mapped. A fixed distance either costs every partition tens
of MiB (thousands of partitions then need more memory than the host has) or makes
a hot partition fault on every page. One pace per partition, carried from each
active segment to the next, gives each what its own rate needs: the appender's
background prefault (``Segment.prefault_ahead``) keeps :attr:`ahead` reserved past
the write position, and an inline reservation (``Segment.make_room``) reports a
stall with :meth:`stalled`. The clock is passed in, so the rules are testable alone.
"""

from __future__ import annotations

from ..common import limits

__all__ = ["ReservePace"]


class ReservePace:
    """The distance one partition keeps reserved ahead of its write position."""

    __slots__ = ("ahead", "_changed_at")

    def __init__(self, now: float):
        self.ahead = limits.SEGMENT_RESERVE_AHEAD_MIN
        self._changed_at = now

    def stalled(self, now: float) -> None:
        """An append found the room used up: keep twice as much ahead from now on."""
        self.ahead = min(self.ahead * 2, limits.SEGMENT_RESERVE_AHEAD_MAX)
        self._changed_at = now

    def settle(self, now: float) -> int:
        """The distance to keep now, halved once per decay interval without a stall."""
        if now - self._changed_at >= limits.SEGMENT_RESERVE_DECAY_S:
            self.ahead = max(self.ahead // 2, limits.SEGMENT_RESERVE_AHEAD_MIN)
            self._changed_at = now
        return self.ahead
