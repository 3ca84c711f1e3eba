"""The controller's partition reassignment: it carries out ``/admin/reassign_partitions``
by the rules of ``reassignment`` (Kafka 2.8's ``KafkaController.onPartitionReassignment``,
KIP-455).

Rules
-----
* **One checked multi per round**: each partition of the request is moved one step
  on (``reassignment.step``), and the topic znodes' moving assignments, the
  partition states and the request without the partitions done (deleted when
  empty) are written together, fenced by the controller epoch.
* **When a round runs**: after the reconciliation on the request's changes, on any
  partition state's (an ISR that grew may complete a move: Kafka's
  ``PartitionReassignmentIsrChangeHandler``), on broker changes, and right after an
  election, which resumes a move from the znodes
  (``initializePartitionReassignments``). A round that failed is run again at the
  next event (:attr:`PartitionReassigner.pending`).
* **A request refused whole** (a partition or broker that does not exist, repeating
  replicas: ``reassignment.check_request``) or that does not decode is deleted, as
  Kafka's controller deletes what it cannot carry out.
* A round races the leaders' ISR writes and the operator's ``--cancel``: a multi
  refused for a stale version is read and decided again (bounded).

Theory of operation
-------------------
Everything a move needs is in ZooKeeper (the request, the moving assignment in the
topic znode, the states), so a round is a pure function of fresh reads and a
controller elected mid-way goes on where the last one stopped. A partition not
created yet, or whose step says wait, is left for a later round.
"""

from __future__ import annotations

import logging

from ...common import limits
from ...common.errors import (
    InvalidReassignmentError,
    ShmlogError,
    StaleStateVersionError,
    ZnodeFormatError,
    ZooKeeperConflictError,
)
from ..zk import paths as zk_paths
from ..zk.client import ClusterZooKeeper
from ..zk.paths import TopicAssignment
from ..zk.session import DeleteOp, SetDataOp
from ..zk.state_changes import state_set_op
from . import reassignment
from .controller_context import ControllerEpoch
from .reassignment import MovingAssignment, StepKind

__all__ = ["PartitionReassigner"]

log = logging.getLogger(__name__)


class PartitionReassigner:
    """Controller ``broker_id``'s partition reassignment (see the module's rules).

    Parameters
    ----------
    zookeeper : ClusterZooKeeper
        The broker's started session.
    broker_id : int
        This broker's id (for the log).

    Attributes
    ----------
    pending : bool
        A round failed (or is under way): run one again at the next event.
    """

    def __init__(self, zookeeper: ClusterZooKeeper, broker_id: int):
        self.zookeeper = zookeeper
        self.broker_id = broker_id
        self.pending = False

    def reassign_partitions(self, elected: ControllerEpoch) -> None:
        """One round of every partition the request names (see the module's rules),
        retried when a leader's ISR write or an operator got in between.

        Raises
        ------
        StaleStateVersionError
            The znodes kept changing: :attr:`pending` stays set.
        ControllerMovedError
            The fence refused a write.
        """
        self.pending = True                             # until a round went through
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            try:
                self._round(elected)
                self.pending = False
                return
            except ZooKeeperConflictError as error:
                log.info("controller %d: %s; reading the reassignment again", self.broker_id,
                         error)
        raise StaleStateVersionError(f"controller {self.broker_id}: the reassignment's znodes "
                                     f"kept changing under {limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX}"
                                     f" writes", path=zk_paths.REASSIGN_PARTITIONS_PATH)

    def _round(self, elected: ControllerEpoch) -> None:
        try:
            found = self.zookeeper.read_reassignment()
        except ZnodeFormatError as error:
            self._refuse(error, -1, elected)
            return
        if found is None:
            return
        request, version = found
        live = set(self.zookeeper.read_brokers())
        assignments = {}
        for topic in sorted({topic for topic, _ in request}):
            assignments[topic] = self.zookeeper.read_assignment_versioned(topic)
        try:
            reassignment.check_request(request, {topic: len(held[0].partitions) for topic, held
                                                 in assignments.items() if held is not None},
                                       live)
        except InvalidReassignmentError as error:
            self._refuse(error, version, elected)
            return
        ops, done = [], set()
        for topic, (assignment, topic_version) in assignments.items():
            targets = {partition: replicas for (name, partition), replicas in request.items()
                       if name == topic}
            topic_ops, topic_done = self._reassign_topic(assignment, topic_version, targets, live,
                                                         elected.epoch)
            ops += topic_ops
            done |= {(topic, partition) for partition in topic_done}
        if done:
            left = {key: replicas for key, replicas in request.items() if key not in done}
            ops.append(SetDataOp(zk_paths.REASSIGN_PARTITIONS_PATH,
                                 zk_paths.encode_reassignment(left), version) if left
                       else DeleteOp(zk_paths.REASSIGN_PARTITIONS_PATH, version))
        if ops:
            self.zookeeper.checked_multi(ops, elected.zk_version)
            log.info("controller %d: reassignment: %d writes, done %s", self.broker_id,
                     len(ops), sorted(done))

    def _reassign_topic(self, assignment: TopicAssignment, topic_version: int,
                        targets: dict[int, tuple[int, ...]], live: set[int],
                        controller_epoch: int) -> tuple[list, set[int]]:
        """The ops that move one topic's partitions a step on, and the partitions
        whose move is complete."""
        topic = assignment.topic
        states = self.zookeeper.read_partition_states(topic)
        replicas = dict(assignment.partitions)
        adding, removing = dict(assignment.adding_replicas), dict(assignment.removing_replicas)
        ops, done = [], set()
        for partition, target in sorted(targets.items()):
            if partition not in states:
                continue                                    # not created yet: wait
            state, state_version = states[partition]
            current = MovingAssignment(replicas[partition], adding.get(partition, ()),
                                       removing.get(partition, ()))
            found = reassignment.step(current, target, state, live, controller_epoch)
            if found.kind is StepKind.WAIT:
                continue
            replicas[partition] = found.assignment.replicas
            adding[partition], removing[partition] = found.assignment.adding, \
                found.assignment.removing
            if found.state is not None:
                ops.append(state_set_op(topic, assignment.topic_id, partition, found.state,
                                        state_version))
            if found.kind is StepKind.COMPLETE:
                done.add(partition)
            log.info("controller %d: reassigning %s-%d to %s: %s %s", self.broker_id, topic,
                     partition, list(target), found.kind.value, found.assignment)
        moved = TopicAssignment(topic, assignment.topic_id, replicas, adding, removing)
        if moved != assignment:
            ops.insert(0, SetDataOp(zk_paths.topic_path(topic),
                                    zk_paths.encode_topic_assignment(moved), topic_version))
        return ops, done

    def _refuse(self, error: ShmlogError, version: int, elected: ControllerEpoch) -> None:
        """Delete a request that cannot be carried out (at ``version``, -1: any)."""
        log.error("controller %d: %s: deleting %s", self.broker_id, error,
                  zk_paths.REASSIGN_PARTITIONS_PATH)
        self.zookeeper.checked_multi([DeleteOp(zk_paths.REASSIGN_PARTITIONS_PATH, version)],
                                     elected.zk_version)
