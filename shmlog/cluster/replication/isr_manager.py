"""The leader's ISR changes: when it shrinks or expands a partition's ISR, and how the
change reaches ZooKeeper (Kafka 2.8's ``ReplicaManager.maybeShrinkIsr``,
``Partition.maybeExpandIsr`` and ``ZkIsrManager``; KIP-497's AlterIsr).

Rules
-----
* **The leader writes its ISR changes** to its partitions' state znodes,
  conditionally on the zkVersion it holds, without blocking the loop (kazoo's async
  multi, its outcome queued back): a loop turn's changes go in one multi, with one
  state-change notice (``zk.state_changes``). One change at a time per partition
  (``rules.LeaderReplicaState``). A multi is refused whole when one of its states
  was written since (a new election): that one's change is refused, the others are
  written again at the next turn.
* **Shrink** is checked for every partition every ``replica.lag.time.max.ms / 2``
  (Kafka's ``isr-expiration`` task); **expand** as a follower's fetch is served.
* **While the ZooKeeper session is suspended** nothing is written: the change is
  dropped as refused (this broker may have been replaced), and asked again later.
* A refused write (a newer state took the znode) leaves the committed ISR as it
  was: the watch brings the newer state.

Theory of operation
-------------------
:meth:`IsrManager.write` queues the change and :meth:`IsrManager.send` (at the end of
each loop turn) hands the turn's changes to ZooKeeper; the outcome comes back on a
kazoo thread, which only queues it and rings the appender doorbell.
:meth:`IsrManager.apply_written`, on the loop thread, drains that queue into each
partition's state and counts the changes ZooKeeper took.
"""

from __future__ import annotations

import logging
import queue
from typing import Callable

from ...common.errors import ShmlogError
from ...config.cluster import ClusterConfig
from ..zk.client import ClusterZooKeeper
from .hosted_replicas import HostedReplicas, partition_name
from .partition import PartitionReplica
from .rules import IsrChangeKind, PendingIsrChange

log = logging.getLogger("shmlog.broker")

__all__ = ["IsrManager"]


class IsrManager:
    """The ISR changes of the partitions this broker leads (see the module's rules).

    Parameters
    ----------
    hosted : HostedReplicas
    zookeeper : ClusterZooKeeper
    config : ClusterConfig
    wake : callable
        Rings the appender doorbell (from any thread), so the loop drains the outcomes.
    """

    def __init__(self, hosted: HostedReplicas, zookeeper: ClusterZooKeeper,
                 config: ClusterConfig, wake: Callable[[], None]):
        self.hosted = hosted
        self.zookeeper = zookeeper
        self.config = config
        self._wake = wake
        self._unsent: list[tuple[PartitionReplica, PendingIsrChange]] = []   # this turn's
        self._written: queue.SimpleQueue = queue.SimpleQueue()     # ISR write outcomes
        self.next_shrink_check = 0
        #: ISR changes this broker wrote as leader and ZooKeeper took, by kind (Kafka's
        #: IsrShrinksPerSec and IsrExpandsPerSec, as totals: broker_stats reports them).
        self.changes = dict.fromkeys(IsrChangeKind, 0)
        self._changed: Callable[[PartitionReplica], None] = lambda replica: None

    def listen(self, changed: Callable[[PartitionReplica], None]) -> None:
        """Tell ``changed`` of each partition whose ISR change ZooKeeper took (the
        leader's fetch serving: a follower dropped is served again until it joins)."""
        self._changed = changed

    def work_pending(self) -> bool:
        """Are outcomes queued for :meth:`apply_written`?"""
        return not self._written.empty()

    def maybe_shrink(self, now: int) -> None:
        """Drop the out-of-sync followers of every partition led, if the check is due."""
        if now >= self.next_shrink_check:
            self.next_shrink_check = now + max(1, self.config.replica_lag_time_max_ms // 2)
            for replica in self.hosted.replicas.values():
                self.write(replica, replica.isr_change(now))

    def maybe_expand(self, replica: PartitionReplica, follower_id: int, now: int) -> None:
        """Let ``follower_id``, whose fetch was just served, join the ISR if it may."""
        self.write(replica, replica.isr_change(now, follower_id))

    def write(self, replica: PartitionReplica, change: PendingIsrChange | None) -> None:
        """Queue an ISR change for the partition's state znode: :meth:`send` writes
        the turn's changes together, and their outcomes come back through
        :meth:`apply_written`."""
        if change is None:
            return
        if self.hosted.suspended:
            replica.isr_change_written(change, None)
            return
        self._unsent.append((replica, change))

    def send(self) -> None:
        """Write the queued ISR changes in one multi, with one notice, without
        waiting (a follower rejoining thousands of partitions is one write, and one
        notice for every broker to read, not thousands)."""
        batch, self._unsent = self._unsent, []
        writes, sent = [], []
        for replica, change in batch:
            topic, partition = partition_name(replica)
            assignment = self.hosted.view.topics.get(topic)
            if assignment is None:                   # deleted meanwhile: nothing to write
                replica.isr_change_written(change, None)
                continue
            writes.append((topic, assignment.topic_id, partition, replica.state_for(change),
                           replica.state_version))
            sent.append((replica, change))
        if not writes:
            return
        wake = self._wake

        def done(outcomes) -> None:                  # on a kazoo thread: queue only
            self._written.put((sent, outcomes))
            wake()
        self.zookeeper.update_partition_states_async(writes, done)

    def apply_written(self) -> None:
        """Apply the outcomes of the writes ZooKeeper answered (on the loop thread); a
        change refused only because another of its multi was is queued again."""
        while not self._written.empty():
            sent, outcomes = self._written.get_nowait()
            for index, (replica, change) in enumerate(sent):
                outcome = outcomes if isinstance(outcomes, ShmlogError) else outcomes[index]
                if outcome is None:
                    self._unsent.append((replica, change))
                else:
                    self._isr_written(replica, change, outcome)

    def _isr_written(self, replica: PartitionReplica, change: PendingIsrChange, outcome) -> None:
        if isinstance(outcome, ShmlogError):
            log.info("%r: isr change %s refused (%s): a newer state is coming", replica,
                     sorted(change.proposed_isr), outcome)
            replica.isr_change_written(change, None)
            return
        replica.isr_change_written(change, outcome)
        self.changes[change.kind] += 1
        replica.update_min_insync(self.hosted.suspended)
        self._changed(replica)
