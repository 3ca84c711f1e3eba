"""Where leadership goes when it is not a failure that moves it (sans-I/O): controlled
shutdown, preferred leader election, and the leader imbalance that triggers it.

Rules (Kafka 2.8; each function names its Kafka source)
--------------------------------------------------------
* **Controlled shutdown** (``KafkaController.doControlledShutdown``,
  ``Election.leaderForControlledShutdown``): a partition led by a broker that is
  shutting down is given the first replica in assignment order that is live, in
  the ISR and not shutting down, with leader epoch + 1 and the ISR without the
  shutting brokers (:func:`controlled_shutdown_leader`,
  :func:`state_during_shutdown`). A partition with no such replica keeps its
  leader: the broker gives up waiting on it and leaves anyway (its failover then
  is an ordinary one). A partition the shutting broker only follows loses it from
  its ISR (Kafka's ``OfflineReplica`` transition, ``removeReplicasFromIsr``); as for
  a dead follower (``partition_state_machine.partition_state_after``) the leader
  epoch is kept, where Kafka bumps it, and the last member of an ISR is never
  removed (Kafka's rule). A broker shutting down is never elected by any election
  meanwhile.
* **The broker's wait** (``KafkaServer.controlledShutdown``):
  :class:`ControlledShutdown` counts attempts; each lasts
  ``controlled.shutdown.retry.backoff.ms``, and after
  ``controlled.shutdown.max.retries`` attempts that left the broker leading
  something it gives up and shuts down anyway, as Kafka does. It gives up at once
  when no partition it still leads has another live replica (the last broker of a
  cluster stopping): no attempt could move them, and Kafka's broker would wait out
  every retry for nothing.
* **Preferred replica** = the first of the assignment. Its election
  (``Election.leaderForPreferredReplica``) succeeds when it is live, in the ISR and
  not shutting down: leader epoch + 1, ISR unchanged. A partition it leads already
  is left alone (Kafka answers ``ELECTION_NOT_NEEDED``).
* **Imbalance** (``KafkaController.checkAndTriggerAutoLeaderRebalance``): per
  broker, the partitions it is preferred for but does not lead, over the
  partitions it is preferred for. A broker above
  ``leader.imbalance.per.broker.percentage`` / 100 has its preferred replicas
  elected where they can be (:func:`rebalance_candidates`).

Theory of operation
-------------------
The controller (``partition_state_machine``, ``preferred_leader_elector``) reads the
live brokers, the brokers shutting down (``/admin/controlled_shutdown/<id>``,
``zk_paths``) and fresh partition states, and applies these functions; the
results are written in its fenced multi-ops.
Everything here is plain data in, plain data out, so every rule is tested with
numbers (tests/unit/test_leader_balance.py).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Mapping, Sequence

from ..zk.paths import PartitionState

__all__ = ["controlled_shutdown_leader", "state_during_shutdown", "ControlledShutdown",
           "ShutdownStep", "preferred_replica", "PreferredOutcome", "preferred_election",
           "preferred_election_result",
           "imbalance_ratios", "rebalance_candidates", "RebalancePolicy"]


def controlled_shutdown_leader(assignment: Sequence[int], isr: Iterable[int],
                               live: Iterable[int], shutting_down: Iterable[int]) -> int | None:
    """The new leader of a partition whose leader shuts down (Kafka's
    ``PartitionLeaderElectionAlgorithms.controlledShutdownPartitionLeaderElection``):
    the first replica in assignment order that is live, in ``isr`` and not in
    ``shutting_down``; None when there is none."""
    live, isr, shutting_down = set(live), set(isr), set(shutting_down)
    for replica in assignment:
        if replica in live and replica in isr and replica not in shutting_down:
            return replica
    return None


def state_during_shutdown(state: PartitionState, assignment: Sequence[int],
                          live: Iterable[int], shutting_down: Iterable[int],
                          controller_epoch: int) -> PartitionState:
    """A partition's state once the brokers ``shutting_down`` are taken out of its
    leadership and ISR (module rules); ``state`` itself when nothing changes.

    * Its leader shuts down: :func:`controlled_shutdown_leader` leads, epoch + 1,
      ISR = the ISR without the shutting brokers. Nobody eligible: unchanged.
    * A follower shuts down: it leaves the ISR, the epoch is kept, the last ISR
      member stays (Kafka's ``removeReplicasFromIsr``).
    """
    shutting_down = set(shutting_down)
    if not shutting_down or not state.has_leader:
        return state
    kept = tuple(replica for replica in state.isr if replica not in shutting_down)
    if state.leader in shutting_down:
        leader = controlled_shutdown_leader(assignment, state.isr, live, shutting_down)
        if leader is None:
            return state
        return PartitionState(leader, state.leader_epoch + 1, kept, controller_epoch)
    if kept == state.isr:
        return state
    return PartitionState(state.leader, state.leader_epoch, kept, controller_epoch)


class ShutdownStep(enum.Enum):
    """What a broker shutting down does next (:meth:`ControlledShutdown.step`)."""
    WAIT = "wait"              # leaderships are still moving: keep serving
    RETRY = "retry"            # an attempt ran out: ask the controller again
    DONE = "done"              # it leads nothing: leave
    GIVE_UP = "give_up"        # attempts exhausted: leave anyway (Kafka's rule)


@dataclasses.dataclass
class ControlledShutdown:
    """A broker's controlled shutdown, in attempts (Kafka's ``controlledShutdown``
    loop, whose request is here the ``/admin/controlled_shutdown/<id>`` znode).

    Parameters
    ----------
    max_retries : int
        ``controlled.shutdown.max.retries``: attempts before giving up.
    retry_backoff_ms : int
        ``controlled.shutdown.retry.backoff.ms``: how long one attempt waits for the
        controller before the next.
    started_ms : int
        When the first attempt was made.
    """
    max_retries: int
    retry_backoff_ms: int
    started_ms: int
    attempts: int = 1

    def step(self, now_ms: int, partitions_led: int, partitions_movable: int) -> ShutdownStep:
        """The next step, given how many partitions this broker still leads, and how
        many of those have another live replica (that could take over once in
        sync)."""
        if partitions_led == 0:
            return ShutdownStep.DONE
        if partitions_movable == 0:
            return ShutdownStep.GIVE_UP
        if now_ms < self.started_ms + self.attempts * self.retry_backoff_ms:
            return ShutdownStep.WAIT
        if self.attempts >= self.max_retries:
            return ShutdownStep.GIVE_UP
        self.attempts += 1
        return ShutdownStep.RETRY

    def deadline_ms(self) -> int:
        """When the current attempt runs out."""
        return self.started_ms + self.attempts * self.retry_backoff_ms


def preferred_replica(assignment: Sequence[int]) -> int:
    """The preferred leader: the first replica of the assignment (Kafka's rule)."""
    return assignment[0]


class PreferredOutcome(enum.Enum):
    """What a preferred leader election did to one partition (the
    ``kafka-leader-election.sh`` answers, in words)."""
    ELECTED = "elected"
    ALREADY_PREFERRED = "already the preferred leader"
    NOT_ALIVE = "preferred replica not alive"
    NOT_IN_SYNC = "preferred replica not in sync"
    SHUTTING_DOWN = "preferred replica is shutting down"
    NO_STATE = "partition has no state yet"
    # Eligible when looked at after the election, not when the controller elected.
    NOT_ELECTED = "preferred replica was not eligible when the controller elected"

    @property
    def ok(self) -> bool:
        """Whether the preferred replica leads now."""
        return self in (PreferredOutcome.ELECTED, PreferredOutcome.ALREADY_PREFERRED)


def preferred_election(state: PartitionState | None, assignment: Sequence[int],
                       live: Iterable[int], shutting_down: Iterable[int] = (),
                       controller_epoch: int = 0
                       ) -> tuple[PreferredOutcome, PartitionState | None]:
    """Elect the preferred replica of one partition (Kafka's
    ``Election.leaderForPreferredReplica``): (outcome, new state or None when
    nothing is to be written). Epoch + 1, ISR unchanged."""
    if state is None:
        return PreferredOutcome.NO_STATE, None
    preferred = preferred_replica(assignment)
    if state.leader == preferred:
        return PreferredOutcome.ALREADY_PREFERRED, None
    if preferred not in set(live):
        return PreferredOutcome.NOT_ALIVE, None
    if preferred in set(shutting_down):
        return PreferredOutcome.SHUTTING_DOWN, None
    if preferred not in state.isr:
        return PreferredOutcome.NOT_IN_SYNC, None
    return PreferredOutcome.ELECTED, PartitionState(preferred, state.leader_epoch + 1,
                                                    state.isr, controller_epoch)


def preferred_election_result(before: PartitionState | None, after: PartitionState | None,
                              assignment: Sequence[int], live: Iterable[int],
                              shutting_down: Iterable[int] = ()) -> PreferredOutcome:
    """What an election did to one partition, judged by the operator's side from
    its state before and after (Kafka's AdminClient gets it in the
    ElectLeadersResponse; over ZooKeeper it is read back)."""
    if after is None:
        return PreferredOutcome.NO_STATE
    if after.leader == preferred_replica(assignment):
        return PreferredOutcome.ALREADY_PREFERRED \
            if before is not None and before.leader == after.leader else PreferredOutcome.ELECTED
    outcome, _ = preferred_election(after, assignment, live, shutting_down)
    return PreferredOutcome.NOT_ELECTED if outcome is PreferredOutcome.ELECTED else outcome


def imbalance_ratios(assignments: Mapping[object, Sequence[int]],
                     leaders: Mapping[object, int]) -> dict[int, float]:
    """Each broker's leader imbalance (Kafka's ``checkAndTriggerAutoLeaderRebalance``):
    of the partitions it is the preferred replica of, the share it does not lead.

    Parameters
    ----------
    assignments : mapping of partition key to replicas
        Every partition (any hashable key, e.g. (topic, partition)).
    leaders : mapping of partition key to leader
        Each partition's current leader (``NO_LEADER``: none, which counts as not
        led by the preferred replica); a partition without a state yet is left out
        of the count of the not led, as Kafka counts only those with leadership
        information.
    """
    preferred_of: dict[int, int] = {}
    not_led: dict[int, int] = {}
    for key, assignment in assignments.items():
        preferred = preferred_replica(assignment)
        preferred_of[preferred] = preferred_of.get(preferred, 0) + 1
        if key in leaders and leaders[key] != preferred:
            not_led[preferred] = not_led.get(preferred, 0) + 1
    return {broker: not_led.get(broker, 0) / count for broker, count in
            sorted(preferred_of.items())}


@dataclasses.dataclass(frozen=True)
class RebalancePolicy:
    """Kafka's automatic leader rebalance settings: ``auto.leader.rebalance.enable``,
    ``leader.imbalance.per.broker.percentage``,
    ``leader.imbalance.check.interval.seconds``."""
    enable: bool = True
    imbalance_percentage: int = 10
    check_interval_s: int = 300


def rebalance_candidates(assignments: Mapping[object, Sequence[int]],
                         leaders: Mapping[object, int], imbalance_percentage: int,
                         eligible: Iterable[int] | None = None) -> list:
    """The partitions whose preferred replica should be elected: those of every
    broker whose imbalance is above ``imbalance_percentage`` / 100 that it is
    preferred for and does not lead (whether it can lead is
    :func:`preferred_election`'s to say), in key order. With ``eligible`` (the
    live brokers not shutting down), only those brokers' partitions: as Kafka's
    check skips a preferred replica offline or shutting down, so a dead broker's
    thousands of partitions are not tried, and refused, at every check."""
    ratios = imbalance_ratios(assignments, leaders)
    above = {broker for broker, ratio in ratios.items() if ratio > imbalance_percentage / 100}
    if eligible is not None:
        above &= set(eligible)
    return sorted(key for key, assignment in assignments.items()
                  if preferred_replica(assignment) in above and key in leaders
                  and leaders[key] != preferred_replica(assignment))
