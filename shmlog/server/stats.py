"""The broker's ``stats`` request: what an operator (``shmlog status``) and a
Prometheus scrape (``prometheus``) read about a running broker.

Rules
-----
* One reply holds everything, read on the loop's thread when the request is
  answered (offsets, sizes, rings, groups, the cleaner, the cluster), so the
  numbers agree with each other; the Prometheus endpoint asks this same request at
  each scrape, so both views always show the same numbers.
* Nothing is counted on the hot path. The appender's drain is timed once per pass
  (``PartitionHost.drain_seconds``); everything else is read when asked or sampled
  once a second (``limits.METRICS_SAMPLE_INTERVAL_MS``) by :meth:`StatsService.tick`:
  a vectorised read of the state table's rows and each group's committed offsets.
* **Produce rates** are per partition and broker-wide, records/s and bytes/s over
  the last ``limits.METRICS_RATE_WINDOW_S`` seconds (``metrics.RateWindow``):
  records from the movement of each partition's log end offset, bytes from the
  growth of its active segment (across a roll: the segments since the one active
  at the last sample). Follower appends count too (a replica's bytes in). A
  truncation or a compaction swap within one sample counts as no growth, never
  as negative. What the logs held when the broker started is not counted; a
  partition hosted later (a topic created, a replica assigned) counts from its
  log start.
* **Appends refused by the log** (``appender.appends_refused_storage``: a full
  disk, an I/O error) are counted since the start where they are refused, off the
  hot path (``log_appends.RefusalLog``); the log shows them a line per half minute
  at most, this counter shows every one.
* **Consume rates** are what the broker can see: consumers read the mapped
  segments without asking it, so consumption is the movement of committed offsets
  (records/s per group and partition, and broker-wide; a group's first commit
  seen is where it starts from). Bytes/s of consumption are
  estimated from each partition's stored bytes per record; ``Consumer.metrics()``
  counts a consumer's exact bytes.
* **Group lag** per partition is the log end offset minus the committed offset
  (``GroupCoordinator.describe_group``, Kafka's kafka-consumer-groups LAG), for the
  groups this broker coordinates (in a cluster, those whose offsets partition it
  leads).
* **Transactions**: each partition's last stable offset (what ``read_committed``
  consumers read up to) and the transactions open in it that wrote; broker-wide
  the coordinator's transactional ids by state, the transactions it ended since
  the start (committed, aborted, of them timed out), and the hanging transactions
  (``transaction_operations``: open past their own timeout, or not held by the
  coordinator), with those operators aborted. A cluster member's figures are its
  own coordinator's, its hanging transactions judged against every coordinator's
  (``cluster.transaction_operations``).
* **In a cluster** (Kafka 2.8's ReplicaManager and controller metrics, as this
  broker's metadata cache sees them): the partitions it leads (LeaderCount), those
  of them under-replicated (UnderReplicatedPartitions: the ISR smaller than the
  replicas), the offline partitions of the whole cluster (no live leader;
  Kafka reports OfflinePartitionsCount from the controller only, here every broker
  does, from its own view, and says whether it is the controller), and the ISR
  shrinks and expands it wrote as leader (IsrShrinksPerSec/IsrExpandsPerSec, as
  totals; a dead broker is taken out of the ISRs by the controller, as in Kafka,
  which no leader counts). The cluster summary itself is ``cluster_status.summarize`` over the
  view: one definition of under-replicated and offline.

Theory of operation
-------------------
:class:`StatsService` is one more service of ``broker.BrokerCore``: its handler
table is ``{"stats": ...}`` and its deadline the next sample. A sample keeps, per
partition, the last (log end, active segment base, active segment size) seen and
records the differences into rate windows; per (group, topic, partition) it keeps
the last committed offset. Partitions and groups that went are forgotten at the
next sample.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..broker.partition_host import HostedPartition, PartitionHost
from ..broker.producer_registry import ProducerRegistry
from ..broker.service import ImmediateService
from ..broker.transaction_operations import TransactionOperations
from ..cluster.replication.rules import IsrChangeKind
from ..cluster.status import summarize
from ..common import limits
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.metrics import RateWindow
from ..record.records import now_ms
from ..shm import state_layout as S
from ..shm.ring_layout import PRODUCER_PID_WORD, PUBLISHED_WORD, TAIL_WORD

__all__ = ["StatsService", "STATS_VERSION"]

# The layout of the reply; a reader (shmlog status, the Prometheus collector) checks it.
STATS_VERSION = 1

# The words of a partition's row a sample reads (see _row_words_of).
_SAMPLED_WORDS = np.array([S.LOG_END_OFFSET_WORD, S.ACTIVE_SEGMENT_BASE_OFFSET_WORD,
                           S.ACTIVE_SEGMENT_SIZE_WORD], np.int64)


class _PartitionRates:
    """One partition's last sample and its rate windows."""

    __slots__ = ("log_end_offset", "segment_base", "segment_size", "records", "bytes")

    def __init__(self, log_end_offset: int, segment_base: int, segment_size: int, now: float):
        self.log_end_offset = log_end_offset
        self.segment_base = segment_base
        self.segment_size = segment_size
        self.records = RateWindow(now=now)
        self.bytes = RateWindow(now=now)


class StatsService(ImmediateService):
    """The ``stats`` request over a broker's parts (see the module's rules).

    Parameters
    ----------
    host : PartitionHost
    producers : ProducerRegistry
    coordinator : group_coordinator.GroupCoordinator
        The broker's group coordinator (a single broker's, or a cluster member's).
    cluster : cluster.ClusterNode, optional
        The broker's membership of a cluster (None: a single broker).
    transactions : transaction_operations.TransactionOperations, optional
        The broker's transactions as operators see them (a cluster member's judged
        against every coordinator: ``cluster.transaction_operations``).

    Attributes
    ----------
    metrics_url : str or None
        Where the broker's Prometheus endpoint serves (``serve`` sets it), shown by
        ``shmlog status``.
    kafka_listeners : list of str
        The host:port each Kafka listener is bound to (``serve`` sets them).
    """

    def __init__(self, host: PartitionHost, producers: ProducerRegistry, coordinator,
                 cluster=None, transactions: TransactionOperations | None = None):
        self.host = host
        self.producers = producers
        self.coordinator = coordinator
        self.cluster = cluster
        self.transactions = transactions
        self.metrics_url: str | None = None
        self.kafka_listeners: list[str] = []
        now = time.monotonic()
        self._partitions: dict[tuple[str, int, str | None], _PartitionRates] = {}
        # The hosted list last sampled, its rows and the words seen in them (n x 3):
        # a sample visits only the rows whose words moved.
        self._hosted: list[HostedPartition] | None = None
        self._rows = np.zeros(0, np.int64)
        self._seen = np.zeros((0, 3), np.int64)
        self._committed: dict[tuple[str, str, int], int] = {}
        self._consumed: dict[tuple[str, str, int], RateWindow] = {}
        self.produced_records = RateWindow(now=now)
        self.produced_bytes = RateWindow(now=now)
        self.consumed_records = RateWindow(now=now)
        self._sample_partitions(now, existing=True)     # what the logs held at the start
        self._next_sample = now_ms() + limits.METRICS_SAMPLE_INTERVAL_MS

    # -- the service ---------------------------------------------------------------------
    def handlers(self) -> dict:
        return {"stats": self.stats}

    def next_deadline(self) -> int | None:
        return self._next_sample

    def tick(self, now: int) -> None:
        """Sample the partitions' offsets and the groups' commits (once a second)."""
        self._next_sample = now + limits.METRICS_SAMPLE_INTERVAL_MS
        self.sample()

    # -- sampling ------------------------------------------------------------------------
    def sample(self, now: float | None = None) -> None:
        """Record what was appended and committed since the last sample."""
        now = time.monotonic() if now is None else now
        self._sample_partitions(now)
        self._sample_commits(now)

    def _sample_partitions(self, now: float, existing: bool = False) -> None:
        """Record each partition's appends since the last sample. A partition not
        seen before counts from its log start (hosted since the start: everything in
        it was appended since), unless ``existing``: the first sample, of what the
        logs held when the broker started. Only the partitions whose row moved since
        the last sample are visited (one vectorised compare finds them)."""
        hosted = self.host.partition_list()
        if hosted is not self._hosted:
            self._follow_partitions(hosted, now, existing)
        words = self._row_words_of(self._rows)
        moved = np.flatnonzero((words != self._seen).any(axis=1))
        all_records = all_bytes = 0
        for index, (end, base, size) in zip(moved.tolist(), words[moved].tolist()):
            partition = hosted[index]
            rates = self._partitions[(partition.topic, partition.partition,
                                      partition.log.topic_id)]
            records = max(0, end - rates.log_end_offset)
            grown = self._grown_bytes(partition, rates, base, size)
            rates.log_end_offset, rates.segment_base, rates.segment_size = end, base, size
            if records or grown:
                rates.records.record(records, now)
                rates.bytes.record(grown, now)
                all_records += records
                all_bytes += grown
        self._seen[moved] = words[moved]
        self.produced_records.record(all_records, now)
        self.produced_bytes.record(all_bytes, now)

    def _follow_partitions(self, hosted: list[HostedPartition], now: float,
                           existing: bool) -> None:
        """The set of partitions changed: rates for the new ones (see
        :meth:`_sample_partitions`), the gone ones forgotten, and the words seen
        taken from each partition's rates."""
        self._rows = np.fromiter((partition.row for partition in hosted), np.int64,
                                 len(hosted))
        words = self._row_words_of(self._rows).tolist()
        rates_of = {}
        for partition, (end, base, size) in zip(hosted, words):
            key = (partition.topic, partition.partition, partition.log.topic_id)
            rates = self._partitions.get(key)
            if rates is None:
                rates = _PartitionRates(end, base, size, now) if existing else \
                    _PartitionRates(partition.log.log_start_offset,
                                    partition.log.segments[0].base_offset, 0, now)
            rates_of[key] = rates
        self._partitions = rates_of
        self._seen = np.array([(rates.log_end_offset, rates.segment_base, rates.segment_size)
                               for rates in rates_of.values()], np.int64).reshape(-1, 3)
        self._hosted = hosted

    def _row_words_of(self, rows: np.ndarray) -> np.ndarray:
        """(log end, active segment base, active segment size) of each of ``rows``,
        in one gather from the state table (n x 3)."""
        table = self.host.table.rows.reshape(-1, S.ROW_WORDS)
        return table[rows[:, None], _SAMPLED_WORDS]       # three words a row, not whole rows

    @staticmethod
    def _grown_bytes(partition: HostedPartition, rates: _PartitionRates, base: int,
                     size: int) -> int:
        """Bytes appended since the last sample: the active segment's growth, or
        after a roll, the segments from the one active then on, less what it held."""
        if base == rates.segment_base:
            return max(0, size - rates.segment_size)
        since = sum(segment.size for segment in partition.log.segments[:-1]
                    if segment.base_offset >= rates.segment_base)
        return max(0, since + size - rates.segment_size)

    def _sample_commits(self, now: float) -> None:
        seen = set()
        for group in self.coordinator.list_groups(ticket=None, now=now_ms())["groups"]:
            group_id = group["group_id"]
            fetched = self.coordinator.fetch_offsets(group_id, ticket=None, now=now_ms())
            for topic, partition, offset, _ in fetched["offsets"]:
                key = (group_id, topic, partition)
                seen.add(key)
                previous = self._committed.get(key)
                self._committed[key] = offset
                if previous is None:
                    self._consumed[key] = RateWindow(now=now)
                elif offset > previous:
                    self._consumed[key].record(offset - previous, now)
                    self.consumed_records.record(offset - previous, now)
        for key in self._committed.keys() - seen:
            del self._committed[key]
            del self._consumed[key]

    # -- the request -----------------------------------------------------------------------
    def stats(self) -> dict:
        """Everything about this broker now (the module's rules say what each is)."""
        now = time.monotonic()
        transactions, open_counts = (None, {}) if self.transactions is None \
            else self.transactions.summary()
        partitions = [self._partition(hosted, now, open_counts)
                      for hosted in self.host.partitions()]
        return {"version": STATS_VERSION, "broker": self._broker(),
                "rate_window_s": limits.METRICS_RATE_WINDOW_S,
                "totals": self._totals(partitions, now),
                "partitions": partitions,
                "producers": self._producers(),
                "appender": {"drain_seconds": self.host.drain_seconds.as_dict(),
                             "entries_drained": self.host.entries_drained,
                             "appends_refused_storage":
                                 self.host.appender.appends_refused_storage},
                "groups": self._groups(partitions, now),
                "cleaner": self._cleaner(partitions),
                "transactions": transactions,
                "cluster": self._cluster()}

    def _broker(self) -> dict:
        started_ms = self.host.table.broker_epoch // 1_000_000     # the epoch is ns
        return {"pid": os.getpid(), "data_dir": self.host.data_dir,
                "started_ms": started_ms, "uptime_s": max(0.0, (now_ms() - started_ms) / 1000),
                "metrics_url": self.metrics_url, "kafka_listeners": self.kafka_listeners}

    def _partition(self, hosted: HostedPartition, now: float,
                   open_counts: dict[tuple[str, int], int]) -> dict:
        log = hosted.log
        rates = self._partitions.get((hosted.topic, hosted.partition, log.topic_id))
        segments = log.segments
        entry = {"topic": hosted.topic, "partition": hosted.partition,
                 "internal": hosted.topic in INTERNAL_TOPICS,
                 "log_start_offset": log.log_start_offset, "log_end_offset": log.log_end_offset,
                 "high_watermark": self.host.appender.high_watermark(hosted.row),
                 "last_stable_offset": self.host.appender.last_stable_offset(hosted.row),
                 "open_transactions": open_counts.get((hosted.topic, hosted.partition), 0),
                 "size_bytes": sum(segment.size for segment in segments),
                 "segments": len(segments),
                 "records_total": 0 if rates is None else rates.records.total,
                 "bytes_total": 0 if rates is None else rates.bytes.total,
                 "records_per_s": 0.0 if rates is None else rates.records.rate(now),
                 "bytes_per_s": 0.0 if rates is None else rates.bytes.rate(now)}
        if log.config.compact:
            entry["clean_offset"] = log.clean_offset
        return entry

    def _totals(self, partitions: list[dict], now: float) -> dict:
        return {"partitions": len(partitions),
                "size_bytes": sum(entry["size_bytes"] for entry in partitions),
                "produced_records": self.produced_records.total,
                "produced_bytes": self.produced_bytes.total,
                "produced_records_per_s": self.produced_records.rate(now),
                "produced_bytes_per_s": self.produced_bytes.rate(now),
                "consumed_records": self.consumed_records.total,
                "consumed_records_per_s": self.consumed_records.rate(now),
                "producers": len(self.producers.rings)}

    def _producers(self) -> list[dict]:
        """Every registered ring: its producer, how full it is, what went through it."""
        appender = self.host.appender
        found = []
        for name, (ring, producer_id) in sorted(self.producers.rings.items()):
            index = appender.index_of(ring)
            if index is None:              # poisoned: unmapped, its producer told
                continue
            used = ring.used
            found.append({"ring": name, "producer_id": producer_id,
                          "pid": int(ring.words[PRODUCER_PID_WORD]),
                          # acks=all rings complete at the high watermark; 0 and 1 alike
                          # at the append (the registry keeps no more than that).
                          "acks_all": appender.awaits_high_watermark(index),
                          "capacity_bytes": ring.capacity, "used_bytes": used,
                          "fill": used / ring.capacity,
                          "bytes_total": int(ring.words[TAIL_WORD]),
                          "entries_total": int(ring.words[PUBLISHED_WORD])})
        return found

    def _groups(self, partitions: list[dict], now: float) -> list[dict]:
        """Each group's lag per partition, and its consumption rate."""
        # Stored bytes per record, for the estimate of bytes consumed.
        per_record = {(entry["topic"], entry["partition"]): entry["size_bytes"]
                      / max(1, entry["log_end_offset"] - entry["log_start_offset"])
                      for entry in partitions}
        found = []
        for group in self.coordinator.list_groups(ticket=None, now=now_ms())["groups"]:
            described = self.coordinator.describe_group(group["group_id"], ticket=None,
                                                        now=now_ms())
            lags = []
            for entry in described["partitions"]:
                window = self._consumed.get((group["group_id"], entry["topic"],
                                             entry["partition"]))
                records_per_s = 0.0 if window is None else window.rate(now)
                lags.append({"topic": entry["topic"], "partition": entry["partition"],
                             "committed": entry["committed"],
                             "log_end_offset": entry["log_end_offset"], "lag": entry["lag"],
                             "records_per_s": records_per_s,
                             "bytes_per_s_estimated": records_per_s * per_record.get(
                                 (entry["topic"], entry["partition"]), 0.0)})
            found.append({"group_id": group["group_id"], "state": group["state"],
                          "members": group["members"], "partitions": lags,
                          "lag": sum(entry["lag"] or 0 for entry in lags)})
        return found

    def _cleaner(self, partitions: list[dict]) -> dict:
        progress = self.host.cleaner_progress
        return {"cleanings": progress.cleanings, "failures": progress.failures,
                "bytes_before": progress.bytes_before, "bytes_after": progress.bytes_after,
                "last_seconds": progress.last_seconds,
                "cleaning": None if progress.cleaning is None else list(progress.cleaning),
                "partitions": [{"topic": entry["topic"], "partition": entry["partition"],
                                "clean_offset": entry["clean_offset"],
                                "dirty_records": max(0, entry["log_end_offset"]
                                                     - max(entry["clean_offset"],
                                                           entry["log_start_offset"]))}
                               for entry in partitions if "clean_offset" in entry]}

    def _cluster(self) -> dict[str, Any] | None:
        if self.cluster is None:
            return None
        replication = self.cluster.replication
        view = replication.view
        broker_id = replication.broker_id
        status = summarize({number: live.registration for number, live in view.brokers.items()},
                           None, view.topics,
                           {key: state for key, (state, _) in view.states.items()})
        return {"broker_id": broker_id,
                "zookeeper_connect": self.cluster.config.zookeeper_connect,
                "controller": self.cluster.controller.is_active,
                "live_brokers": sorted(view.brokers),
                "leader_count": len(replication.partitions_led()),
                "under_replicated_partitions": sum(
                    1 for partition in status.under_replicated
                    if partition.leader == broker_id and not partition.offline),
                "offline_partitions": len(status.offline),
                "isr_shrinks": replication.isr_changes[IsrChangeKind.SHRINK],
                "isr_expands": replication.isr_changes[IsrChangeKind.EXPAND]}
