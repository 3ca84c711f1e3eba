"""How far ahead of its write position a partition keeps room reserved: the pace of
its reservations, following its write rate.

Rules
-----
* A partition that takes a record now and then holds
  :data:`limits.SEGMENT_RESERVE_AHEAD_MIN` beyond its data; one that fills as fast
  as memory goes holds up to :data:`limits.SEGMENT_RESERVE_AHEAD_MAX`. Nothing is
  reserved for a partition that was never written to.
* The distance grows to cover :data:`limits.SEGMENT_RESERVE_HORIZON_S` of writing
  at the rate measured between two background reservations, so a partition taking
  a steady stream is reserved for a few times a second, not for every few pages.
* It doubles when an append found the reserved log room used up (it had to reserve
  inline, stalling the writer): the partition fills faster than the prefaulter
  populates at the current distance.
* It shrinks by half for every :data:`limits.SEGMENT_RESERVE_DECAY_S` without
  growing, so a partition that was busy once holds little ahead once it is quiet.

Theory of operation
-------------------
Reserving is ``posix_fallocate`` plus ``MADV_POPULATE_WRITE`` (``mapped_file``): the
pages it populates are page cache that counts in the broker's resident memory for
as long as the file is mapped. A fixed distance either costs every partition tens
of MiB (thousands of partitions then need more memory than the host has) or makes
a hot partition fault on every page; a small distance on a steady stream wakes the
prefaulter thread every few pages, and each wake-up takes the broker's GIL from the
appender (e2e latency's p99 showed it). One pace per partition, carried from each
active segment to the next, gives each what its own rate needs: the appender's
background prefault (``Segment.prefault_ahead``) keeps :attr:`ahead` reserved past
the write position, and an inline reservation (``Segment.make_room``) reports a
stall with :meth:`stalled`, and each background reservation queued reports the
write position with :meth:`prefaulting`. The clock is passed in, so the rules are testable alone.
"""

from __future__ import annotations

from ..common import limits

__all__ = ["ReservePace"]


class ReservePace:
    """The distance one partition keeps reserved ahead of its write position."""

    __slots__ = ("ahead", "_changed_at", "_sampled_at", "_sampled_position")

    def __init__(self, now: float):
        self.ahead = limits.SEGMENT_RESERVE_AHEAD_MIN
        self._changed_at = now
        self._sampled_at: float | None = None
        self._sampled_position = 0

    def prefaulting(self, now: float, position: int) -> None:
        """A background reservation is queued at write ``position`` (of the active
        segment): keep what the rate since the last one writes in the horizon."""
        last_at, last_position = self._sampled_at, self._sampled_position
        self._sampled_at, self._sampled_position = now, position
        # A roll since the last sample starts the position again: no rate then.
        if last_at is None or position <= last_position or now <= last_at:
            return
        wanted = (position - last_position) / (now - last_at) * limits.SEGMENT_RESERVE_HORIZON_S
        if wanted > self.ahead:
            grown = self.ahead
            while grown < wanted:
                grown *= 2
            self.ahead = min(grown, limits.SEGMENT_RESERVE_AHEAD_MAX)
            self._changed_at = now

    def stalled(self, now: float) -> None:
        """An append found the room used up: keep twice as much ahead from now on."""
        self.ahead = min(self.ahead * 2, limits.SEGMENT_RESERVE_AHEAD_MAX)
        self._changed_at = now

    def settle(self, now: float) -> int:
        """The distance to keep now, halved once per decay interval without growth."""
        if now - self._changed_at >= limits.SEGMENT_RESERVE_DECAY_S:
            self.ahead = max(self.ahead // 2, limits.SEGMENT_RESERVE_AHEAD_MIN)
            self._changed_at = now
        return self.ahead
