"""Partition reassignment's rules, sans-I/O (Kafka 2.8's ``KafkaController.
onPartitionReassignment`` with KIP-455's adding/removing replicas): plain broker ids
in, decisions out. The controller (``partition_reassigner``) reads ZooKeeper, asks
these functions, and writes what they say.

Rules (each names its Kafka 2.8 source; each has a table test)
---------------------------------------------------------------
* **A request is refused whole** (``KafkaController.validateReassignment``, and
  ``ReassignPartitionsCommand`` which checks before writing): a partition that does
  not exist, a replica list that is empty or repeats a broker, a broker that is
  not registered (:func:`check_request`).
* **The moving assignment** (``ReplicaAssignment.reassignTo``): from the partition's
  *origin* replicas (its replicas without those being added, when a move is under
  way already) to the *target*: the replica set RS = target ++ (origin − target),
  ``adding`` = target − origin, ``removing`` = origin − target
  (:func:`moving_assignment`). A new request for a partition that is moving
  replaces the old target: replicas the old move was adding that the new one does
  not want are dropped at once (Kafka's cancellation of the adding replicas).
* **Starting** (phase A of ``onPartitionReassignment``): the assignment is written
  as RS with its adding and removing replicas, and the leader epoch goes + 1 (the
  leader and ISR kept: ``updateLeaderEpochAndSendRequest``), so every replica
  sees the new assignment: the added ones start following (from their log start,
  as any new follower), the leader counts them.
* **Completing** (phase B, ``isReassignmentComplete``: every target replica is in
  the ISR): the leader is kept when it is a live target replica, else the first
  target replica that is live and in the ISR is elected
  (``ReassignPartitionLeaderElectionStrategy``: ``reassignPartitionLeaderElection``);
  the ISR loses the removed replicas (``removeReplicasFromIsr``), the assignment
  becomes the target with no adding or removing replicas, the leader epoch goes
  + 1 once (Kafka bumps it at the election and again at each ISR removal; one
  atomic write of both znodes needs one), and the partition leaves the request.
* **Reverting** (``--cancel``: ``cancelPartitionReassignment``): a target equal to
  the origin completes at once, whatever the ISR: the adding replicas leave the
  ISR and the assignment (Kafka's cancellation does not wait either). The origin
  is the moving set without the adding replicas, in the moving set's order (as
  Kafka's ``originReplicas``): the znodes do not keep the order before the move, so
  a cancelled move may leave another preferred leader.
* **Waiting**: a target replica outside the ISR, or no live target replica in
  the ISR to lead: nothing is written; a later ISR change or broker change asks
  again.
* A partition already at its target with nothing moving completes at once (Kafka
  removes it from the znode without a step).

Theory of operation
-------------------
Everything the controller needs survives in ZooKeeper: the request in
``/admin/reassign_partitions`` and the moving assignment (RS, adding, removing) in
the topic znode, so a controller elected mid-way resumes from them (Kafka's
``initializePartitionReassignments``): :func:`step` is a pure function of the
request, the assignment and the state, and gives the same answer to whichever
controller asks.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Mapping, Sequence

from ...common.errors import InvalidReassignmentError
from ..zk.paths import NO_LEADER, PartitionState

__all__ = ["MovingAssignment", "StepKind", "Step", "ReassignmentStatus", "check_request",
           "moving_assignment", "origin_replicas", "step", "status",
           "leader_throttled_replicas", "follower_throttled_replicas"]


@dataclasses.dataclass(frozen=True)
class MovingAssignment:
    """One partition's assignment during a move (Kafka's ``ReplicaAssignment``):
    its replica set and which of them are joining and leaving."""
    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def origin(self) -> tuple[int, ...]:
        """The replicas before the move (``originReplicas``)."""
        return tuple(replica for replica in self.replicas if replica not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas after it (``targetReplicas``)."""
        return tuple(replica for replica in self.replicas if replica not in self.removing)

    @property
    def is_moving(self) -> bool:
        return bool(self.adding or self.removing)


class StepKind(enum.Enum):
    """What the controller does for one partition of a request."""
    START = "start"          # write the moving assignment, bump the leader epoch
    WAIT = "wait"            # a target replica is not in the ISR yet
    COMPLETE = "complete"    # write the target assignment and the new state; drop the request


@dataclasses.dataclass(frozen=True)
class Step:
    """The controller's next write for one partition: ``assignment`` is what its
    topic znode must say, ``state`` the partition state to write (None: keep it)."""
    kind: StepKind
    assignment: MovingAssignment
    state: PartitionState | None = None


class ReassignmentStatus(enum.Enum):
    """``--verify``'s verdict on one partition (``ReassignPartitionsCommand``'s)."""
    COMPLETE = "complete"
    IN_PROGRESS = "in progress"
    FAILED = "failed"


def check_request(request: Mapping[tuple[str, int], Sequence[int]],
                  partitions: Mapping[str, int], brokers: Iterable[int]) -> None:
    """Refuse a request whole (see the module's rules).

    Parameters
    ----------
    request : mapping of (topic, partition) to target replicas
    partitions : mapping of topic to its partition count
    brokers : iterable of int
        The registered brokers.

    Raises
    ------
    InvalidReassignmentError
        Naming every partition at fault and why.
    """
    brokers = set(brokers)
    faults = []
    for (topic, partition), replicas in sorted(request.items()):
        name = f"{topic}-{partition}"
        if not 0 <= partition < partitions.get(topic, 0):
            faults.append(f"{name} does not exist")
        elif not replicas:
            faults.append(f"{name} has an empty replica list")
        elif len(set(replicas)) != len(replicas):
            faults.append(f"{name}'s replicas {list(replicas)} repeat a broker")
        elif not set(replicas) <= brokers:
            faults.append(f"{name}'s replicas {list(replicas)} name brokers not registered: "
                          f"{sorted(set(replicas) - brokers)}")
    if faults:
        raise InvalidReassignmentError("the reassignment is refused: " + "; ".join(faults))


def origin_replicas(replicas: Sequence[int], adding: Sequence[int]) -> tuple[int, ...]:
    """The replicas a partition had before its move (``originReplicas``)."""
    return MovingAssignment(tuple(replicas), tuple(adding)).origin


def moving_assignment(origin: Sequence[int], target: Sequence[int]) -> MovingAssignment:
    """The assignment of a move from ``origin`` to ``target`` (``reassignTo``):
    RS = target ++ (origin − target), adding = target − origin, removing =
    origin − target."""
    target = tuple(target)
    kept_origin = tuple(replica for replica in origin if replica not in target)
    return MovingAssignment(target + kept_origin,
                            tuple(replica for replica in target if replica not in origin),
                            kept_origin)


def step(current: MovingAssignment, target: Sequence[int], state: PartitionState,
         live: Iterable[int], controller_epoch: int) -> Step:
    """The next step of moving one partition to ``target`` (see the module's rules).

    Parameters
    ----------
    current : MovingAssignment
        What the topic znode says of the partition now.
    target : sequence of int
        The request's replicas.
    state : PartitionState
        The partition's state now.
    live : iterable of int
        The live brokers.
    controller_epoch : int
        Stamped on a state written.
    """
    target = tuple(target)
    live = set(live)
    moving = moving_assignment(current.origin, target)
    if moving != current:
        if not moving.is_moving:
            return _complete(moving, target, state, live, controller_epoch, revert=True)
        return Step(StepKind.START, moving, _started(moving, state, live, controller_epoch))
    if not moving.is_moving:
        return Step(StepKind.COMPLETE, moving)               # at its target already
    if not set(target) <= set(state.isr):
        return Step(StepKind.WAIT, moving)
    return _complete(moving, target, state, live, controller_epoch, revert=False)


def _started(moving: MovingAssignment, state: PartitionState, live: set[int],
             controller_epoch: int) -> PartitionState:
    """Phase A's state: the epoch + 1, the leader and ISR kept, but for replicas a
    replaced move was adding and the new one drops (they leave the ISR; one that
    led gives way to the first live in-sync replica of the new set)."""
    isr = tuple(replica for replica in state.isr if replica in moving.replicas) or state.isr
    leader = state.leader
    if leader != NO_LEADER and leader not in moving.replicas:
        leader = next((replica for replica in moving.replicas
                       if replica in live and replica in isr), NO_LEADER)
    return PartitionState(leader, state.leader_epoch + 1, isr, controller_epoch)


def _complete(moving: MovingAssignment, target: tuple[int, ...], state: PartitionState,
              live: set[int], controller_epoch: int, revert: bool) -> Step:
    """Phase B: the leader from the target, the ISR without the removed replicas."""
    isr = tuple(replica for replica in state.isr if replica in target)
    leader = state.leader
    if leader not in target or leader not in live:
        leader = next((replica for replica in target if replica in live and replica in isr),
                      NO_LEADER)
    if leader == NO_LEADER:
        if not revert:
            return Step(StepKind.WAIT, moving)
        isr = isr or state.isr                   # offline: keep who was last in sync
    done = MovingAssignment(target)
    return Step(StepKind.COMPLETE, done,
                PartitionState(leader, state.leader_epoch + 1, isr, controller_epoch))


def status(target: Sequence[int], replicas: Sequence[int], moving: bool,
           requested: bool) -> ReassignmentStatus:
    """``--verify``'s verdict (``ReassignPartitionsCommand.checkIfPartitionReassignmentSucceeded``):
    complete when the assignment is the target and nothing moves, in progress while
    the request still names the partition, failed otherwise (the request went but
    the assignment is not the one asked for: refused, or replaced by another)."""
    if tuple(replicas) == tuple(target) and not moving:
        return ReassignmentStatus.COMPLETE
    if requested:
        return ReassignmentStatus.IN_PROGRESS
    return ReassignmentStatus.FAILED


def leader_throttled_replicas(moves: Mapping[int, tuple[Sequence[int], Sequence[int]]]) -> str:
    """The ``leader.replication.throttled.replicas`` value of one topic: every
    origin replica of each moving partition, ``partition:broker`` pairs (Kafka's
    ``ReassignPartitionsCommand.calculateLeaderThrottles``: any of them may be the
    leader the new replicas fetch from).

    ``moves`` maps a partition to its (origin, target) replicas; partitions whose
    replicas do not change are left out."""
    return ",".join(f"{partition}:{broker}" for partition, (origin, target)
                    in sorted(moves.items()) if set(origin) != set(target)
                    for broker in origin)


def follower_throttled_replicas(moves: Mapping[int, tuple[Sequence[int], Sequence[int]]]) -> str:
    """The ``follower.replication.throttled.replicas`` value of one topic: the
    replicas each moving partition gains (``calculateFollowerThrottles``)."""
    return ",".join(f"{partition}:{broker}" for partition, (origin, target)
                    in sorted(moves.items()) for broker in target if broker not in origin)
