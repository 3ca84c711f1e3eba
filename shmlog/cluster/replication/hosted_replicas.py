"""The partitions this broker hosts and what it is to each, as the cluster view says
(Kafka's ``ReplicaManager.becomeLeaderOrFollower``, with its partition map and its
high-watermark checkpoints).

Rules
-----
* **ZooKeeper is the one truth.** Topics, assignments, configs and partition states
  come from its watches (``cluster.zk.view``); a topic appears on this broker when its
  assignment does (with the cluster-wide topic id, so ring entries name it the same
  everywhere), and goes when it does. Every broker hosts every partition: as
  leader, follower, or observer (a copy for this host's readers, see
  ``partition``). A local topic of the name with another id is another topic: it
  is deleted first.
* **A suspended ZooKeeper session changes no ISR; a lost one resigns** (Kafka's
  rule). SUSPENDED (the connection is gone, the session may live on: ZooKeeper
  expires it T after its last word): :attr:`HostedReplicas.suspended` says so, no
  ISR change is written, and everything else goes on: a leader appends acks=0/1/all
  and moves its high watermark with the ISR it holds, followers fetch. A ZooKeeper
  outage so stops only what needs a ZooKeeper write. It stays safe when this
  broker alone was cut off and replaced: its ISR cannot shrink, and the followers
  that learn the new leader stop fetching from it, so its acks=all entries wait
  (``partition``'s rules). LOST (the session expired: the controller may have
  elected others) resigns every leadership and fails the acks=all entries parked;
  the states are applied again as the new session reads them.
* **min.insync.replicas** is the topic's config, else the broker's; a value that is
  not a number is the broker's.
* **High watermarks are checkpointed** (``high_watermark_checkpoint``) every
  ``replica.high.watermark.checkpoint.interval.ms``, when a topic is hosted, and at
  :meth:`HostedReplicas.close`; a partition the checkpoint names is fenced to its
  checkpointed high watermark as soon as this is made (before the loop serves a
  reader), and every replica starts from it when hosted.

Theory of operation
-------------------
The dispatch (``dispatch``) hands this the cluster view's changes of topics,
partition states, topic configs and the session, on the loop thread. Each
:class:`~shmlog.cluster.replication.partition.PartitionReplica` is found by its name,
its wire key (``(topic_key, partition)``) and its appender row. A partition state
applied may move leadership and the high watermark: the :class:`LeadershipListener`
(the leader's fetch serving) is told, to answer the fetches waiting on it.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ...broker.appender import HighWatermarkPolicy
from ...broker.partition_host import PartitionHost
from ...common.errors import ShmlogError
from ...config.cluster import ClusterConfig
from ...shm.state import topic_key
from ..zk.events import SessionState
from ..zk.view import ClusterView, PartitionStateChanged
from .high_watermark_checkpoint import HighWatermarkCheckpoint
from .partition import PartitionReplica, Role

log = logging.getLogger("shmlog.broker")

__all__ = ["MIN_INSYNC_REPLICAS", "LeadershipListener", "HostedReplicas", "partition_name"]

MIN_INSYNC_REPLICAS = "min.insync.replicas"


def partition_name(replica: PartitionReplica) -> tuple[str, int]:
    """The replica's ``(topic, partition)``."""
    return replica.hosted.topic, replica.hosted.partition


class LeadershipListener(Protocol):
    """Who hears of the partition states applied (the leader's fetch serving)."""

    def leadership_changed(self, replica: PartitionReplica) -> None:
        """The replica's leader or epoch changed, or it is no longer hosted."""

    def maybe_advance_high_watermark(self, replica: PartitionReplica, now: int) -> None:
        """A state was applied: the leader's high watermark may move."""

    def isr_changed(self, replica: PartitionReplica) -> None:
        """A state was applied: its ISR may have changed."""


class HostedReplicas:
    """Every partition this broker hosts, and its role (see the module's rules).

    Parameters
    ----------
    host : PartitionHost
    config : ClusterConfig
    view : ClusterView
        The cluster as ZooKeeper's watches showed it.
    suspended : bool
        Is the ZooKeeper session suspended now?

    The :class:`LeadershipListener` is given by :meth:`listen`, before the first change.
    """

    def __init__(self, host: PartitionHost, config: ClusterConfig, view: ClusterView,
                 suspended: bool):
        self.host = host
        self.appender = host.appender
        self.config = config
        self.broker_id = config.broker_id
        self.view = view
        self.suspended = suspended
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._by_key: dict[tuple[int, int], PartitionReplica] = {}
        self._by_row: dict[int, PartitionReplica] = {}
        self._listener: LeadershipListener | None = None
        #: Bumped whenever a replica is hosted or dropped, or its role or leader may
        #: have changed: what the fetcher's grouping by leader is cached against.
        self.generation = 0
        self.checkpoint = HighWatermarkCheckpoint(host.data_dir)
        self.next_checkpoint = 0
        self._fence_checkpointed()

    def listen(self, listener: LeadershipListener) -> None:
        """Tell ``listener`` of every state applied from now on."""
        self._listener = listener

    def by_key(self, key: tuple[int, int]) -> PartitionReplica | None:
        """The replica of a wire key ``(topic_key, partition)``, if hosted."""
        return self._by_key.get(key)

    def by_row(self, row: int) -> PartitionReplica | None:
        """The replica of an appender row, if hosted."""
        return self._by_row.get(row)

    def partitions_led(self) -> list[tuple[str, int]]:
        """The partitions whose state, as this broker applied it, names it leader."""
        return sorted(name for name, replica in self.replicas.items()
                      if replica.state is not None and replica.state.leader == self.broker_id)

    def partitions_movable(self, led: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Those of ``led`` that have another replica on a live broker (as this
        broker's view has it): the ones a controlled shutdown could move."""
        return [name for name in led
                if any(broker_id != self.broker_id and broker_id in self.view.brokers
                       for broker_id in self.view.replicas(*name))]

    # -- the high-watermark checkpoint -------------------------------------------------------
    def high_watermarks(self) -> dict[tuple[str, int], int]:
        """The published high watermark of every replicated partition, and of every
        hosted one the checkpoint named (fenced, its replica not hosted yet: a
        checkpoint written before must not forget it), {(topic, partition): hw}."""
        named = self.checkpoint.checkpointed
        return {(hosted.topic, hosted.partition): self.appender.high_watermark(hosted.row)
                for hosted in self.host.partitions()
                if (hosted.topic, hosted.partition) in self.replicas
                or (hosted.topic, hosted.partition) in named}

    def checkpoint_if_due(self, now: int) -> None:
        """Hand the high watermarks to the checkpoint's writer, if its interval passed."""
        if now >= self.next_checkpoint:
            self.next_checkpoint = now + self.config.replica_high_watermark_checkpoint_interval_ms
            self.checkpoint.write_soon(self.high_watermarks())

    def close(self) -> None:
        """Checkpoint the high watermarks (a clean stop)."""
        self.checkpoint.close(self.high_watermarks())

    def _fence_checkpointed(self) -> None:
        """Hold every hosted partition the checkpoint names at its checkpointed high
        watermark, and take no producer's entry for it (it was replicated: until its
        state is read this broker does not know whether it leads it, as a Kafka
        broker leads nothing before its LeaderAndIsr, and its log end may hold
        records never committed)."""
        for hosted in self.host.partitions():
            if (hosted.topic, hosted.partition) in self.checkpoint.checkpointed:
                self.appender.set_high_watermark_policy(
                    hosted.row, HighWatermarkPolicy.EXTERNAL,
                    high_watermark=self._start_high_watermark(hosted))
                self.appender.set_is_leader(hosted.row, False)

    def _start_high_watermark(self, hosted) -> int:
        return self.checkpoint.start(hosted.topic, hosted.partition,
                                     hosted.log.log_start_offset, hosted.log.log_end_offset)

    # -- ZooKeeper's changes --------------------------------------------------------------------
    def apply_partition_state(self, change: PartitionStateChanged, now: int) -> None:
        """A partition's state znode changed: lead, follow or observe it as it says."""
        replica = self.replicas.get((change.topic, change.partition))
        if replica is not None:
            self._apply_state(replica, change.state, change.version, now)

    def _apply_state(self, replica: PartitionReplica, state, version: int, now: int) -> None:
        if replica.apply_state(state, version, self.view.replicas(*partition_name(replica)),
                               now):
            self.generation += 1
            replica.update_min_insync()
            self._listener.leadership_changed(replica)
        self._listener.maybe_advance_high_watermark(replica, now)
        self._listener.isr_changed(replica)

    def host_topic(self, assignment, now: int) -> None:
        """Host the topic's partitions as ZooKeeper assigns them (its id is the
        cluster's: a local topic of the name with another id is another topic)."""
        name = assignment.topic
        config = self.view.configs.get(name, {})
        if self.host.logs.has_topic(name) and \
                self.host.logs.describe_topic(name).topic_id != assignment.topic_id:
            self.drop_topic(name)
        count = len(assignment.partitions)
        if not self.host.logs.has_topic(name):
            self.host.create_topic(name, count, config, topic_id=assignment.topic_id)
        elif self.host.logs.describe_topic(name).partitions < count:
            self.host.add_partitions(name, count)
        key = topic_key(assignment.topic_id)
        for partition in range(count):
            if (name, partition) in self.replicas:
                continue
            hosted = self.host.partition(name, partition)
            replica = PartitionReplica(self.broker_id, hosted, self.appender, key,
                                       self.config.replica_lag_time_max_ms,
                                       high_watermark=self._start_high_watermark(hosted))
            self.next_checkpoint = now         # a crash soon after must find it there
            self.generation += 1
            replica.min_insync_replicas = self._min_insync(config)
            self.replicas[(name, partition)] = replica
            self._by_key[replica.key] = replica
            self._by_row[replica.row] = replica
            held = self.view.state(name, partition)
            if held is not None:
                self._apply_state(replica, held[0], held[1], now)

    def drop_topic(self, name: str) -> None:
        """The topic is gone from ZooKeeper: resign its partitions, delete its logs."""
        self.generation += 1
        for (topic, partition), replica in list(self.replicas.items()):
            if topic == name:
                replica.resign()
                self._listener.leadership_changed(replica)
                del self.replicas[(topic, partition)]
                del self._by_key[replica.key]
                del self._by_row[replica.row]
        if self.host.logs.has_topic(name):
            self.host.delete_topic(name)
            log.info("deleted topic %s (gone from ZooKeeper)", name)

    def configure_topic(self, name: str, config: dict) -> None:
        """Take the topic's config from ZooKeeper (and its min.insync.replicas)."""
        if not self.host.logs.has_topic(name):
            return
        held = self.host.logs.describe_topic(name).config.overrides()
        try:
            self.host.alter_topic_config(name, dict(config),
                                         tuple(key for key in held if key not in config))
        except ShmlogError as error:
            log.warning("topic %s: cannot take its config %s from ZooKeeper: %s", name, config,
                        error)
        for (topic, _), replica in self.replicas.items():
            if topic == name:
                replica.min_insync_replicas = self._min_insync(config)
                replica.update_min_insync()

    def _min_insync(self, config: dict) -> int:
        try:
            return int(config.get(MIN_INSYNC_REPLICAS, self.config.min_insync_replicas))
        except ValueError:
            return self.config.min_insync_replicas

    def session_changed(self, state: SessionState) -> None:
        """The ZooKeeper session was suspended, lost or reconnected."""
        self.suspended = state is not SessionState.CONNECTED
        if state is SessionState.LOST:
            self.generation += 1
            log.warning("ZooKeeper session lost: resigning every leadership")
            for replica in self.replicas.values():
                if replica.role is Role.LEADER:
                    replica.resign()
