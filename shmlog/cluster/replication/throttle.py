"""Replication throttling, sans-I/O: the bytes/s a broker lets moving replicas copy
(Kafka 2.8's ``ReplicationQuotaManager`` for the LEADER and FOLLOWER quota types),
with the clock passed in (milliseconds).

Rules (each names its Kafka 2.8 source; each has a table test)
---------------------------------------------------------------
* **Rates** are dynamic broker configs in ``/config/brokers/<id>``:
  ``leader.replication.throttled.rate`` bounds what this broker sends as leader,
  ``follower.replication.throttled.rate`` what it fetches as follower, in bytes/s
  (``DynamicConfig.Broker``). Absent: unlimited (Kafka's default, Long.MaxValue).
* **Which replicas** are topic configs: ``leader.replication.throttled.replicas`` and
  ``follower.replication.throttled.replicas``, a list of ``partition:broker`` pairs
  or ``*`` for all (``ThrottledReplicaListValidator``). A broker throttles a
  partition as leader when the leader list names (partition, itself), as follower
  when the follower list does (``ReplicationQuotaManager.isThrottled`` over the
  pairs ``ConfigHandler.parseThrottledPartitions`` kept for this broker).
* **Observers** (``partition_replica``: a broker's copy of a partition it holds no
  replica of) are never in sync: a listed pair throttles an observer's copy as a
  follower's (Kafka has no observers).
* **Only replicas out of sync are slowed** (``ReplicaManager.shouldLeaderThrottle``,
  ``ReplicaFetcherThread.shouldFollowerThrottle``: ``!isReplicaInSync &&
  isThrottled && isQuotaExceeded``): a follower in the ISR is never held back, so
  acks=all and the rest of replication keep their pace.
* **A token bucket per direction**: it holds at most ``rate × REPLICATION_THROTTLE_BURST_MS``
  bytes and refills at ``rate``; what is sent (leader) or received (follower) is
  taken from it after the fact, and may drive it below zero (a read returns whole
  batches). While it is empty, a throttled partition gets no records: the leader
  answers it empty, the follower leaves it out of its fetch; otherwise the leader
  sends and the follower asks for at most what the bucket holds. Kafka's quota is
  a rate over sampled windows (``replication.quota.window.*``); a bucket gives the
  same long-run bound and a time to wake up at.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ...common import limits
from ...common.errors import InvalidConfigError
from ...storage.topic_config import ALL_REPLICAS, parse_throttled_replicas

__all__ = ["TokenBucket", "ReplicationThrottle", "LEADER_RATE_CONFIG", "FOLLOWER_RATE_CONFIG",
           "LEADER_REPLICAS_CONFIG", "FOLLOWER_REPLICAS_CONFIG"]

LEADER_RATE_CONFIG = "leader.replication.throttled.rate"
FOLLOWER_RATE_CONFIG = "follower.replication.throttled.rate"
LEADER_REPLICAS_CONFIG = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS_CONFIG = "follower.replication.throttled.replicas"
# The throttled-replicas value that names every replica (Kafka's wildcard).


class TokenBucket:
    """Bytes a throttled direction may move: refilled at ``rate_bytes_per_s``, at most
    ``rate × burst_ms`` held, full when made.

    Parameters
    ----------
    rate_bytes_per_s : int
        Positive.
    now_ms : int
        The clock at creation.
    burst_ms : int
    """

    def __init__(self, rate_bytes_per_s: int, now_ms: int,
                 burst_ms: int = limits.REPLICATION_THROTTLE_BURST_MS):
        assert rate_bytes_per_s > 0, rate_bytes_per_s
        assert burst_ms > 0, burst_ms
        self.rate_bytes_per_s = rate_bytes_per_s
        self.capacity = max(1, rate_bytes_per_s * burst_ms // 1000)
        self.tokens = float(self.capacity)
        self.updated_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self.updated_ms:
            self.tokens = min(float(self.capacity), self.tokens +
                              (now_ms - self.updated_ms) * self.rate_bytes_per_s / 1000)
            self.updated_ms = now_ms

    def available(self, now_ms: int) -> int:
        """Whole bytes that may move now (0 while empty or in debt)."""
        self._refill(now_ms)
        return max(0, int(self.tokens))

    def take(self, size: int, now_ms: int) -> None:
        """``size`` bytes moved: taken, even below zero."""
        assert size >= 0, size
        self._refill(now_ms)
        self.tokens -= size

    def ready_at_ms(self, now_ms: int) -> int:
        """When at least one byte may move again (``now_ms`` if it may now)."""
        self._refill(now_ms)
        if self.tokens >= 1:
            return now_ms
        missing = 1 - self.tokens
        return now_ms + max(1, int(-(-missing * 1000 // self.rate_bytes_per_s)))


def _rate(config: Mapping[str, str], name: str) -> int | None:
    text = config.get(name)
    if text is None:
        return None
    try:
        rate = int(text)
    except ValueError:
        raise InvalidConfigError(f"{name}={text!r}: expected bytes per second") from None
    if rate <= 0:
        raise InvalidConfigError(f"{name}={rate}: must be positive")
    return rate


@dataclasses.dataclass
class _Direction:
    bucket: TokenBucket | None = None
    partitions: dict[str, frozenset[tuple[int, int]] | str] = dataclasses.field(
        default_factory=dict)

    def throttles(self, topic: str, partition: int, broker_id: int) -> bool:
        listed = self.partitions.get(topic)
        if self.bucket is None or not listed:
            return False
        return listed == ALL_REPLICAS or (partition, broker_id) in listed

    def set_rate(self, rate: int | None, now_ms: int) -> None:
        if rate is None:
            self.bucket = None
        elif self.bucket is None or self.bucket.rate_bytes_per_s != rate:
            self.bucket = TokenBucket(rate, now_ms)


class ReplicationThrottle:
    """One broker's two quotas (see the module's rules): what it sends as leader
    and fetches as follower for the throttled replicas out of sync.

    Parameters
    ----------
    broker_id : int
        This broker: the throttled-replicas pairs that name it apply.
    """

    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self._leader = _Direction()
        self._follower = _Direction()

    def set_rates(self, config: Mapping[str, str], now_ms: int) -> None:
        """Take the broker's dynamic configs (``/config/brokers/<id>``).

        Raises
        ------
        InvalidConfigError
            A rate is not a positive integer (nothing is changed).
        """
        leader, follower = _rate(config, LEADER_RATE_CONFIG), _rate(config, FOLLOWER_RATE_CONFIG)
        self._leader.set_rate(leader, now_ms)
        self._follower.set_rate(follower, now_ms)

    def set_topic(self, topic: str, config: Mapping[str, str]) -> None:
        """Take a topic's throttled-replicas configs (absent or gone: none).

        Raises
        ------
        InvalidConfigError
            A value does not parse (nothing is changed).
        """
        leader = parse_throttled_replicas(config.get(LEADER_REPLICAS_CONFIG, ""))
        follower = parse_throttled_replicas(config.get(FOLLOWER_REPLICAS_CONFIG, ""))
        self._leader.partitions[topic] = leader
        self._follower.partitions[topic] = follower

    def forget_topic(self, topic: str) -> None:
        self._leader.partitions.pop(topic, None)
        self._follower.partitions.pop(topic, None)

    @property
    def rates(self) -> tuple[int | None, int | None]:
        """(leader, follower) rates in bytes/s, None: unlimited."""
        return tuple(None if direction.bucket is None else direction.bucket.rate_bytes_per_s
                     for direction in (self._leader, self._follower))

    def leader_budget(self, topic: str, partition: int, in_sync: bool, max_bytes: int,
                      now_ms: int) -> int:
        """What the leader may send a replica of ``topic-partition`` now:
        ``max_bytes``, or less (0 included) when it is throttled and out of sync."""
        return self._budget(self._leader, topic, partition, in_sync, max_bytes, now_ms)

    def leader_sent(self, topic: str, partition: int, in_sync: bool, size: int,
                    now_ms: int) -> None:
        """The leader sent ``size`` bytes of the partition to a replica."""
        self._record(self._leader, topic, partition, in_sync, size, now_ms)

    def follower_budget(self, topic: str, partition: int, in_sync: bool, max_bytes: int,
                        now_ms: int) -> int:
        """What this follower may ask of ``topic-partition`` now (0: leave it out of
        the fetch)."""
        return self._budget(self._follower, topic, partition, in_sync, max_bytes, now_ms)

    def follower_received(self, topic: str, partition: int, in_sync: bool, size: int,
                          now_ms: int) -> None:
        """This follower received ``size`` bytes of the partition."""
        self._record(self._follower, topic, partition, in_sync, size, now_ms)

    def follower_ready_at_ms(self, now_ms: int) -> int | None:
        """When a follower's throttled partition may be fetched again (None: no
        follower quota)."""
        bucket = self._follower.bucket
        return None if bucket is None else bucket.ready_at_ms(now_ms)

    def _budget(self, direction: _Direction, topic: str, partition: int, in_sync: bool,
                max_bytes: int, now_ms: int) -> int:
        if in_sync or not direction.throttles(topic, partition, self.broker_id):
            return max_bytes
        return min(max_bytes, direction.bucket.available(now_ms))

    def _record(self, direction: _Direction, topic: str, partition: int, in_sync: bool,
                size: int, now_ms: int) -> None:
        if not in_sync and direction.throttles(topic, partition, self.broker_id):
            direction.bucket.take(size, now_ms)

