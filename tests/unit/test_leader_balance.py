"""The rules of ``shmlog.cluster.controller.leader_balance``, one Kafka rule per test, as
tables of plain
numbers:

* ``controlled_shutdown_leader``: Kafka 2.8's
  ``PartitionLeaderElectionAlgorithms.controlledShutdownPartitionLeaderElection``;
* ``state_during_shutdown``: ``KafkaController.doControlledShutdown`` (leaders via
  ``Election.leaderForControlledShutdown``, followers via ``OfflineReplica`` /
  ``removeReplicasFromIsr``), with the design's difference: no epoch bump for an
  ISR shrink;
* ``ControlledShutdown``: the broker's retry loop (``KafkaServer.controlledShutdown``,
  ``controlled.shutdown.max.retries`` and ``.retry.backoff.ms``);
* ``preferred_election``: ``Election.leaderForPreferredReplica``;
* ``imbalance_ratios`` / ``rebalance_candidates``:
  ``KafkaController.checkAndTriggerAutoLeaderRebalance``.

Method: no ZooKeeper; states in, states out.
"""

from __future__ import annotations

import pytest

from shmlog.cluster.controller.leader_balance import (
    ControlledShutdown,
    PreferredOutcome,
    ShutdownStep,
    controlled_shutdown_leader,
    imbalance_ratios,
    preferred_election,
    preferred_election_result,
    rebalance_candidates,
    state_during_shutdown,
)
from shmlog.cluster.zk.paths import NO_LEADER, PartitionState

CONTROLLER_EPOCH = 9


def state(leader, epoch, isr, controller_epoch=CONTROLLER_EPOCH - 1):
    return PartitionState(leader, epoch, tuple(isr), controller_epoch)


@pytest.mark.parametrize("assignment, isr, live, shutting, expected", [
    ([1, 2, 3], [1, 2, 3], [1, 2, 3], [1], 2),      # the next in assignment order
    ([1, 3, 2], [1, 2, 3], [1, 2, 3], [1], 3),      # assignment order, not ISR order
    ([1, 2, 3], [1, 3], [1, 2, 3], [1], 3),         # must be in the ISR
    ([1, 2, 3], [1, 2, 3], [1, 3], [1], 3),         # must be live
    ([1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2], 3),   # never one shutting down
    ([1, 2, 3], [1], [1, 2, 3], [1], None),         # nobody else in sync
    ([1, 2, 3], [1, 2], [1, 2, 3], [1, 2], None),
])
def test_controlled_shutdown_leader_is_kafkas_election(assignment, isr, live, shutting,
                                                       expected):
    assert controlled_shutdown_leader(assignment, isr, live, shutting) == expected


@pytest.mark.parametrize("before, live, shutting, after", [
    # nobody shuts down: the same state back
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [], None),
    # the leader shuts down: the next in-sync replica leads, epoch + 1, ISR without it
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [1], state(2, 5, [2, 3], CONTROLLER_EPOCH)),
    (state(1, 4, [3, 1]), [1, 2, 3], [1], state(3, 5, [3], CONTROLLER_EPOCH)),
    # ... nobody else eligible: the leader stays (the broker leaves anyway later)
    (state(1, 4, [1]), [1, 2, 3], [1], None),
    (state(1, 4, [1, 2]), [1, 3], [1], None),
    # a follower shuts down: it leaves the ISR, the epoch is kept (Kafka bumps it)
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [3], state(1, 4, [1, 2], CONTROLLER_EPOCH)),
    # a follower outside the ISR: nothing to change
    (state(1, 4, [1, 2]), [1, 2, 3], [3], None),
    # a partition without a leader is the offline election's, not this rule's
    (state(NO_LEADER, 4, [1]), [1, 2, 3], [1], None),
])
def test_state_during_shutdown_is_kafkas_do_controlled_shutdown(before, live, shutting, after):
    result = state_during_shutdown(before, [1, 2, 3], live, shutting, CONTROLLER_EPOCH)
    if after is None:
        assert result is before
    else:
        assert result == after
        assert result.leader in result.isr


@pytest.mark.parametrize("now, led, movable, attempts_before, step, attempts_after", [
    (0, 0, 0, 1, ShutdownStep.DONE, 1),            # leads nothing: leave at once
    (4_999, 2, 2, 1, ShutdownStep.WAIT, 1),        # within the first attempt's backoff
    (5_000, 2, 1, 1, ShutdownStep.RETRY, 2),       # the attempt ran out: the next one
    (9_999, 2, 2, 2, ShutdownStep.WAIT, 2),
    (14_999, 1, 1, 3, ShutdownStep.WAIT, 3),
    (15_000, 1, 1, 3, ShutdownStep.GIVE_UP, 3),    # max.retries attempts: leave anyway
    (15_000, 0, 0, 3, ShutdownStep.DONE, 3),
    # no other live replica to move them to (ours, not Kafka's): leave at once
    (0, 2, 0, 1, ShutdownStep.GIVE_UP, 1),
])
def test_controlled_shutdown_retries_as_kafkas_broker(now, led, movable, attempts_before, step,
                                                      attempts_after):
    shutdown = ControlledShutdown(max_retries=3, retry_backoff_ms=5_000, started_ms=0,
                                  attempts=attempts_before)
    assert shutdown.step(now, led, movable) is step
    assert shutdown.attempts == attempts_after


@pytest.mark.parametrize("before, live, shutting, outcome, after", [
    (state(2, 4, [1, 2, 3]), [1, 2, 3], [], PreferredOutcome.ELECTED,
     state(1, 5, [1, 2, 3], CONTROLLER_EPOCH)),               # ISR unchanged, epoch + 1
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [], PreferredOutcome.ALREADY_PREFERRED, None),
    (state(2, 4, [2, 3]), [2, 3], [], PreferredOutcome.NOT_ALIVE, None),
    (state(2, 4, [2, 3]), [1, 2, 3], [], PreferredOutcome.NOT_IN_SYNC, None),
    (state(2, 4, [1, 2, 3]), [1, 2, 3], [1], PreferredOutcome.SHUTTING_DOWN, None),
    (None, [1, 2, 3], [], PreferredOutcome.NO_STATE, None),
])
def test_preferred_election_is_kafkas_leader_for_preferred_replica(before, live, shutting,
                                                                   outcome, after):
    assert preferred_election(before, [1, 2, 3], live, shutting, CONTROLLER_EPOCH) == \
        (outcome, after)


@pytest.mark.parametrize("before, after, live, outcome", [
    (state(2, 4, [1, 2]), state(1, 5, [1, 2]), [1, 2, 3], PreferredOutcome.ELECTED),
    (state(1, 4, [1, 2]), state(1, 4, [1, 2]), [1, 2, 3], PreferredOutcome.ALREADY_PREFERRED),
    (state(2, 4, [2, 3]), state(2, 4, [2, 3]), [2, 3], PreferredOutcome.NOT_ALIVE),
    (state(2, 4, [2, 3]), state(2, 4, [2, 3]), [1, 2, 3], PreferredOutcome.NOT_IN_SYNC),
    # in sync only after the controller looked: not elected, and not "elected"
    (state(2, 4, [2, 3]), state(2, 4, [2, 3, 1]), [1, 2, 3], PreferredOutcome.NOT_ELECTED),
    (None, None, [1, 2, 3], PreferredOutcome.NO_STATE),
])
def test_the_operator_reads_an_elections_outcome_back(before, after, live, outcome):
    # kafka-leader-election.sh's answers (ElectLeadersResponse), read from the states.
    assert preferred_election_result(before, after, [1, 2, 3], live) is outcome
    assert outcome.ok == (outcome in (PreferredOutcome.ELECTED,
                                      PreferredOutcome.ALREADY_PREFERRED))


ASSIGNMENTS = {0: (1, 2, 3), 1: (2, 3, 1), 2: (3, 1, 2), 3: (1, 3, 2)}


@pytest.mark.parametrize("leaders, ratios", [
    ({0: 1, 1: 2, 2: 3, 3: 1}, {1: 0.0, 2: 0.0, 3: 0.0}),      # balanced
    ({0: 2, 1: 2, 2: 3, 3: 1}, {1: 0.5, 2: 0.0, 3: 0.0}),      # 1 leads one of its two
    ({0: 2, 1: 2, 2: 2, 3: 3}, {1: 1.0, 2: 0.0, 3: 1.0}),
    ({0: NO_LEADER, 1: 2, 2: 3, 3: 1}, {1: 0.5, 2: 0.0, 3: 0.0}),   # no leader: not led
    ({1: 2, 2: 3, 3: 3}, {1: 0.5, 2: 0.0, 3: 0.0}),            # no state yet: not counted
])
def test_imbalance_is_kafkas_per_broker_ratio(leaders, ratios):
    assert imbalance_ratios(ASSIGNMENTS, leaders) == ratios


@pytest.mark.parametrize("leaders, percentage, candidates", [
    ({0: 1, 1: 2, 2: 3, 3: 1}, 10, []),
    ({0: 2, 1: 2, 2: 3, 3: 1}, 10, [0]),       # 50 % > 10 %
    ({0: 2, 1: 2, 2: 3, 3: 1}, 50, []),        # not above the threshold: Kafka's '>'
    ({0: 2, 1: 2, 2: 2, 3: 3}, 10, [0, 2, 3]),
    ({1: 3, 2: 3, 3: 3}, 10, [1, 3]),          # partition 0 has no state: not a candidate
])
def test_rebalance_elects_above_the_imbalance_threshold(leaders, percentage, candidates):
    assert rebalance_candidates(ASSIGNMENTS, leaders, percentage) == candidates


def test_only_live_brokers_not_shutting_down_get_their_partitions_back():
    # Kafka's check skips a preferred replica offline or shutting down: a dead
    # broker's partitions are not tried (and refused) at every check.
    assignments = {("t", 0): [1, 2], ("t", 1): [2, 1], ("t", 2): [3, 1]}
    leaders = {("t", 0): 2, ("t", 1): 1, ("t", 2): 1}
    assert rebalance_candidates(assignments, leaders, 10) == [("t", 0), ("t", 1), ("t", 2)]
    assert rebalance_candidates(assignments, leaders, 10, eligible={1, 2}) == \
        [("t", 0), ("t", 1)]
    assert rebalance_candidates(assignments, leaders, 10, eligible=set()) == []
