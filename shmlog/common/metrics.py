"""Counters with a windowed rate, and histograms: the numbers behind the broker's
``stats``, its Prometheus endpoint, and ``Producer.metrics()`` / ``Consumer.metrics()``.

Rules
-----
* Counting is cheap and never per record in Python: callers record once per
  batch, per drain pass or per poll, with the amount that pass handled
  (a record count, a byte count). A hot loop stays compiled.
* A :class:`RateWindow` keeps a total (since it was made) and the amounts of the
  last ``limits.METRICS_RATE_WINDOW_S`` seconds in one-second buckets; its rate is
  what those buckets hold over the time they cover (shorter while the window is
  younger than its span, never less than one bucket). Time is ``time.monotonic``
  unless passed in (tests pass it).
* A :class:`Histogram` has fixed upper bounds and counts as Prometheus does: an
  observation goes into the first bucket whose bound it does not exceed (``le``);
  above the last bound it counts only in ``+Inf``.
* No locks: each object belongs to one thread (the broker's loop; a client's
  lock-holding caller) or is read racily for display only, where a torn read is
  off by one pass.

Theory of operation
-------------------
Prometheus wants monotonic ``_total`` counters and computes rates itself; an
operator at a terminal (``shmlog status``) and kafka-python's ``metrics()`` want
rates already. A bounded deque of per-second buckets gives both from one record
call: the total grows, the bucket of the current second grows, and buckets older
than the window fall off when recorded into or read. Memory is bounded by the
window (ten numbers).
"""

from __future__ import annotations

import bisect
import collections
import time
from typing import Sequence

from . import limits

__all__ = ["RateWindow", "Histogram", "FlowCounts"]


class RateWindow:
    """A total and its rate per second over the last ``window_s`` seconds.

    Parameters
    ----------
    window_s, bucket_s : float
        The window's span and its buckets' (defaults: ``limits``).
    now : float, optional
        When counting starts (monotonic seconds; default: now).
    """

    __slots__ = ("window_s", "bucket_s", "total", "_buckets", "_started", "_bucket",
                 "_bucket_end", "_amount")

    def __init__(self, window_s: float = limits.METRICS_RATE_WINDOW_S,
                 bucket_s: float = limits.METRICS_RATE_BUCKET_S, now: float | None = None):
        assert window_s >= bucket_s > 0, "a window holds at least one bucket"
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.total = 0
        self._buckets: collections.deque = collections.deque()   # closed: (number, amount)
        self._started = time.monotonic() if now is None else now
        # The open bucket: its number, when it ends, what it holds. A recording inside
        # it is two additions (the common case: many batches a second).
        self._bucket = int(self._started // bucket_s)
        self._bucket_end = (self._bucket + 1) * bucket_s
        self._amount = 0

    def record(self, amount: int | float, now: float | None = None) -> None:
        """Count ``amount`` (records, bytes, passes) now."""
        if now is None:
            now = time.monotonic()
        self.total += amount
        if now >= self._bucket_end:
            self._open(now)
        self._amount += amount

    def _open(self, now: float) -> None:
        """Close the open bucket (if it holds anything) and open the one of ``now``."""
        if self._amount:
            self._buckets.append((self._bucket, self._amount))
        self._bucket = int(now // self.bucket_s)
        self._bucket_end = (self._bucket + 1) * self.bucket_s
        self._amount = 0
        self._expire(self._bucket)

    def rate(self, now: float | None = None) -> float:
        """The amount per second recorded over the last window."""
        if now is None:
            now = time.monotonic()
        if now >= self._bucket_end:
            self._open(now)
        covered_from = max(self._started, self._first_bucket(self._bucket) * self.bucket_s)
        elapsed = max(now - covered_from, self.bucket_s)
        return (sum(amount for _, amount in self._buckets) + self._amount) / elapsed

    def _first_bucket(self, bucket: int) -> int:
        return bucket - int(round(self.window_s / self.bucket_s)) + 1

    def _expire(self, bucket: int) -> None:
        first = self._first_bucket(bucket)
        while self._buckets and self._buckets[0][0] < first:
            self._buckets.popleft()


class Histogram:
    """Observations counted into buckets of fixed upper bounds (Prometheus' ``le``).

    Parameters
    ----------
    bounds : sequence of float
        Increasing upper bounds; ``+Inf`` is implied after the last.
    """

    __slots__ = ("bounds", "counts", "count", "sum")

    def __init__(self, bounds: Sequence[float]):
        assert list(bounds) == sorted(bounds), "bounds increase"
        assert len(set(bounds)) == len(bounds), "bounds are distinct"
        self.bounds = tuple(float(bound) for bound in bounds)
        self.counts = [0] * (len(self.bounds) + 1)    # per bucket; the last is +Inf's own
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """[(upper bound, observations at or below it)], ``+Inf`` last (== count)."""
        running = 0
        pairs = []
        for bound, count in zip(self.bounds + (float("inf"),), self.counts):
            running += count
            pairs.append((bound, running))
        return pairs

    def as_dict(self) -> dict:
        """JSON-ready: {"buckets": [[bound or "+Inf", cumulative count]], "count", "sum"}."""
        return {"buckets": [["+Inf" if bound == float("inf") else bound, count]
                            for bound, count in self.cumulative()],
                "count": self.count, "sum": self.sum}


class FlowCounts:
    """Records and bytes through a client (a producer's sends, a consumer's fetches),
    overall and per topic, with their rates; the batches (or fetches) that carried
    them; and records that failed. Recorded once per batch or fetch.

    Attributes
    ----------
    records, bytes, errors : RateWindow
        Overall.
    batches : int
        How many :meth:`record` calls (batches put, fetches that found records).
    topics : dict
        {topic: (records, bytes, errors)}, a RateWindow each.
    """

    __slots__ = ("records", "bytes", "errors", "batches", "topics")

    def __init__(self) -> None:
        now = time.monotonic()
        self.records = RateWindow(now=now)
        self.bytes = RateWindow(now=now)
        self.errors = RateWindow(now=now)
        self.batches = 0
        self.topics: dict[str, tuple[RateWindow, RateWindow, RateWindow]] = {}

    def _topic(self, topic: str, now: float) -> tuple[RateWindow, RateWindow, RateWindow]:
        windows = self.topics.get(topic)
        if windows is None:
            windows = self.topics[topic] = (RateWindow(now=now), RateWindow(now=now),
                                            RateWindow(now=now))
        return windows

    def record(self, topic: str, records: int, size: int) -> None:
        """One batch (or fetch) of ``records`` records, ``size`` bytes, of ``topic``."""
        now = time.monotonic()
        self.batches += 1
        self.records.record(records, now)
        self.bytes.record(size, now)
        windows = self.topics.get(topic) or self._topic(topic, now)
        windows[0].record(records, now)
        windows[1].record(size, now)

    def record_errors(self, topic: str, records: int) -> None:
        """``records`` records of ``topic`` failed."""
        now = time.monotonic()
        self.errors.record(records, now)
        self._topic(topic, now)[2].record(records, now)
