"""Topics and partition states in ZooKeeper: the assignments under
``/brokers/topics``, each partition's state (leader, leader epoch, ISR), and the
deletion marks (Kafka's ``KafkaZkClient`` topic and ``TopicPartitionStateZNode``
requests, ``AdminZkClient.createTopicWithAssignment`` and ``deleteTopic``).

Rules
-----
* **Partition states are written conditionally only** (Kafka's ZkIsrManager before
  KIP-497): a write names the zkVersion it read, so a zombie leader holding an old
  one is refused (:class:`StaleStateVersionError`) instead of overwriting the
  controller's election.
* **What the controller writes, it writes in its fenced multi**: this module only
  builds those ops (:meth:`TopicZnodes.partition_state_creation_ops`,
  :meth:`TopicZnodes.topic_deletion_ops`); ``controller_election.ControllerElection.
  checked_multi`` applies them.
* A topic is created whole: its config and assignment in one transaction; the
  controller then creates its partition states.

Theory of operation
-------------------
A topic's partition states are read in one pipeline (``ZooKeeperSession.get_many``),
not one round trip each: a controller's pass over 10,000 partitions costs the
answers' decoding, not 10,000 waits. Reads return what exists now, with the
zkVersion a conditional write is checked against. A leader's ISR changes
(:meth:`TopicZnodes.update_partition_states_async`) do not block the broker's
loop: their outcomes arrive on a kazoo thread, to be queued. Every state written
carries its notice (``state_changes``), which is how the brokers learn it. A re-created topic
restarts its state versions at 0 (its ``topic_id`` is new).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ...common.errors import (
    ShmlogError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    ZnodeExistsError,
    ZooKeeperConflictError,
)
from . import paths as zk_paths
from .paths import PartitionState, TopicAssignment
from .session import CreateOp, DeleteOp, Op, ZooKeeperSession
from .state_changes import STATE_CHANGES_PATH, state_create_op, state_set_op

__all__ = ["TopicZnodes"]


class TopicZnodes:
    """The topics' znodes, read and written in ``session``."""

    def __init__(self, session: ZooKeeperSession):
        self._session = session

    # --- reads -------------------------------------------------------------------------

    def read_topics(self) -> list[str]:
        """The topics (children of ``/brokers/topics``), sorted."""
        return sorted(self._session.children(zk_paths.TOPICS_PATH))

    def read_assignment(self, topic: str) -> TopicAssignment | None:
        """Topic ``topic``'s assignment, None if it does not exist."""
        found = self._session.get(zk_paths.topic_path(topic))
        return None if found is None else zk_paths.decode_topic_assignment(topic, found[0])

    def read_assignment_versioned(self, topic: str) -> tuple[TopicAssignment, int] | None:
        """(assignment, zkVersion) of ``topic``, None if it does not exist: what a
        conditional rewrite of the assignment (a reassignment's) is checked against."""
        found = self._session.get(zk_paths.topic_path(topic))
        return None if found is None else (zk_paths.decode_topic_assignment(topic, found[0]),
                                           found[1].version)

    def read_assignments(self) -> dict[str, TopicAssignment]:
        """Every topic's assignment, by name."""
        assignments = {}
        for topic in self.read_topics():
            assignment = self.read_assignment(topic)
            if assignment is not None:
                assignments[topic] = assignment
        return assignments

    def read_partition_state(self, topic: str,
                             partition: int) -> tuple[PartitionState, int] | None:
        """(state, zkVersion) of one partition, None if it has no state yet."""
        path = zk_paths.partition_state_path(topic, partition)
        found = self._session.get(path)
        return None if found is None else (zk_paths.decode_partition_state(found[0], path),
                                           found[1].version)

    def read_partition_states(self, topic: str) -> dict[int, tuple[PartitionState, int]]:
        """Every partition state of ``topic`` that exists: partition → (state, zkVersion)."""
        partitions = sorted(
            zk_paths.decode_partition_number(name, zk_paths.partitions_path(topic))
            for name in self._session.children(zk_paths.partitions_path(topic)))
        found = self.read_partition_states_of((topic, partition) for partition in partitions)
        return {partition: found[(topic, partition)] for partition in partitions
                if (topic, partition) in found}

    def read_partition_states_of(self, partitions) -> dict[tuple[str, int],
                                                           tuple[PartitionState, int]]:
        """(state, zkVersion) of each ``(topic, partition)`` that has a state, read in
        one pipeline (``ZooKeeperSession.get_many``), not one round trip each."""
        paths = {name: zk_paths.partition_state_path(*name) for name in partitions}
        found = self._session.get_many(paths.values())
        return {name: (zk_paths.decode_partition_state(found[path][0], path),
                       found[path][1].version)
                for name, path in paths.items() if found[path] is not None}

    def read_topics_to_delete(self) -> list[str]:
        """The topics marked for deletion, sorted."""
        return sorted(self._session.children(zk_paths.DELETE_TOPICS_PATH))

    def read_state_change_notices(self) -> list[str]:
        """The names of the state-change notices there now (``state_changes``)."""
        return self._session.children(STATE_CHANGES_PATH)

    # --- writes ------------------------------------------------------------------------

    def delete_state_change_notices(self, names: Sequence[str]) -> None:
        """Delete these notices (the controller's clean-up); one gone already (a
        previous controller's clean-up) leaves the others of its multi for the next.

        Raises
        ------
        ZooKeeperConflictError, ZooKeeperConnectionError
            As ``ZooKeeperSession.multi``.
        """
        self._session.multi_chunked([DeleteOp(f"{STATE_CHANGES_PATH}/{name}") for name in names])

    def create_topic(self, assignment: TopicAssignment, config: dict[str, str]) -> None:
        """Write the topic's config and assignment in one transaction (the
        controller then creates its partition states).

        Raises
        ------
        TopicExistsError
            The topic (or a leftover config of it) exists.
        """
        try:
            self._session.multi([
                CreateOp(zk_paths.topic_config_path(assignment.topic),
                         zk_paths.encode_topic_config(config)),
                CreateOp(zk_paths.topic_path(assignment.topic),
                         zk_paths.encode_topic_assignment(assignment))])
        except ZooKeeperConflictError:
            raise TopicExistsError(f"topic {assignment.topic!r} already exists") from None

    def mark_topic_deleted(self, topic: str) -> None:
        """Ask the controller to delete ``topic`` (``/admin/delete_topics/<t>``); a
        topic marked already stays marked.

        Raises
        ------
        UnknownTopicOrPartitionError
            No such topic.
        """
        if self._session.exists(zk_paths.topic_path(topic)) is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        try:
            self._session.create(zk_paths.delete_topic_path(topic))
        except ZnodeExistsError:
            pass

    def update_partition_state(self, topic: str, topic_id: str, partition: int,
                               state: PartitionState, version: int) -> int:
        """Write a partition's state if its zkVersion is still ``version`` (a
        leader's ISR change: it keeps the leader, the leader epoch and the
        ``controller_epoch`` of the state it read), with its notice. Blocks: call
        from a thread that may, or use :meth:`update_partition_states_async`.

        Returns
        -------
        int
            The new zkVersion.

        Raises
        ------
        StaleStateVersionError
            The state was written since ``version`` (a new election, say): re-read.
        ZooKeeperConflictError
            The state does not exist (the topic was deleted).
        ZooKeeperConnectionError
            The outcome is unknown: re-read.
        """
        op = state_set_op(topic, topic_id, partition, state, version)
        return self._session.multi([op])[0].version

    def update_partition_states_async(
            self, writes: Sequence[tuple[str, str, int, PartitionState, int]],
            done: Callable[[list | ShmlogError], None]) -> None:
        """Write states as :meth:`update_partition_state` does, each (topic, topic id,
        partition, state, zkVersion) of ``writes``, in one multi with one notice,
        without blocking. ``done`` gets, on a kazoo thread (so it must only queue),
        one outcome per write (its new zkVersion; the refusal of the one refused,
        which refuses them all; None for one refused only with it: write it again)
        or the :class:`ZooKeeperConnectionError` when the outcome is unknown."""
        def finished(outcomes: list | ShmlogError) -> None:
            if isinstance(outcomes, ShmlogError):
                done(outcomes)
            else:
                done([outcome if outcome is None or isinstance(outcome, ShmlogError)
                      else outcome.version for outcome in outcomes])

        self._session.multi_async([state_set_op(*write) for write in writes], finished)

    # --- the controller's ops ----------------------------------------------------------

    def partition_state_creation_ops(self, topic: str, topic_id: str,
                                     states: dict[int, PartitionState]) -> list[Op]:
        """The ops that create ``states`` of the topic incarnation ``topic_id`` (and
        the ``partitions`` znodes above them that do not exist yet), for
        ``ControllerElection.checked_multi``."""
        ops: list[Op] = []
        if self._session.exists(zk_paths.partitions_path(topic)) is None:
            ops.append(CreateOp(zk_paths.partitions_path(topic)))
        existing = set(self._session.children(zk_paths.partitions_path(topic)))
        for partition, state in sorted(states.items()):
            if str(partition) not in existing:
                ops.append(CreateOp(zk_paths.partition_path(topic, partition)))
            ops.append(state_create_op(topic, topic_id, partition, state))
        return ops

    def topic_deletion_ops(self, topic: str) -> list[Op]:
        """The ops that delete every znode of ``topic`` that exists (children first:
        states, partitions, assignment, config) and its deletion mark."""
        ops: list[Op] = []
        partitions = zk_paths.partitions_path(topic)
        names = sorted(self._session.children(partitions))
        children = self._session.children_many(f"{partitions}/{name}" for name in names)
        for name in names:
            for child in sorted(children[f"{partitions}/{name}"]):
                ops.append(DeleteOp(f"{partitions}/{name}/{child}"))
            ops.append(DeleteOp(f"{partitions}/{name}"))
        for path in (partitions, zk_paths.topic_path(topic), zk_paths.topic_config_path(topic),
                     zk_paths.delete_topic_path(topic)):
            listed = path == partitions and ops         # it has children, so it exists
            if listed or self._session.exists(path) is not None:
                ops.append(DeleteOp(path))
        return ops
