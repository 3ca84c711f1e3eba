"""The controller's pure rules (``shmlog.cluster.controller.partition_state_machine``),
one Kafka rule per test, as tables of plain numbers:

* ``elect_leader``: Kafka 2.8's ``Election.offlinePartitionLeaderElection``;
* ``initial_partition_state``: ``PartitionStateMachine.initializeLeaderAndIsrForPartitions``;
* ``partition_state_after``: ``onBrokerFailure`` (``removeReplicasFromIsr``, then
  ``OfflinePartitionLeaderElectionStrategy``) and ``onBrokerStartup`` (offline
  partitions elected again), with the design's two differences: no epoch bump for
  an ISR shrink, and ``NO_LEADER`` written when nobody is eligible.

Method: no ZooKeeper; states in, states out.
"""

from __future__ import annotations

import pytest

from shmlog.cluster.controller.partition_state_machine import (
    elect_leader,
    initial_partition_state,
    partition_state_after,
)
from shmlog.cluster.zk.paths import NO_LEADER, PartitionState

CONTROLLER_EPOCH = 9


@pytest.mark.parametrize("assignment, isr, live, unclean, expected", [
    ([1, 2, 3], [1, 2, 3], [1, 2, 3], False, 1),     # the preferred replica first
    ([1, 2, 3], [2, 3], [1, 2, 3], False, 2),        # in ISR beats assignment position
    ([3, 1, 2], [1, 2], [1, 2, 3], False, 1),        # assignment order, not ISR order
    ([1, 2, 3], [2, 1], [1, 2, 3], False, 1),
    ([1, 2, 3], [1, 2], [3], False, None),           # no live ISR member: clean refuses
    ([1, 2, 3], [1, 2], [3], True, 3),               # unclean: the first live replica
    ([1, 2, 3], [1], [2, 3], True, 2),
    ([1, 2, 3], [], [], True, None),                 # nobody live at all
    ([1, 2, 3], [4], [4], True, None),               # never a broker outside the assignment
])
def test_elect_leader_is_kafkas_offline_partition_leader_election(assignment, isr, live,
                                                                   unclean, expected):
    assert elect_leader(assignment, isr, live, unclean) == expected


@pytest.mark.parametrize("assignment, live, expected", [
    ([2, 1, 3], [1, 2, 3], PartitionState(2, 0, (2, 1, 3), CONTROLLER_EPOCH)),
    ([2, 1, 3], [1, 3], PartitionState(1, 0, (1, 3), CONTROLLER_EPOCH)),
    ([2, 1, 3], [], None),                           # waits for a live replica
])
def test_a_new_partition_is_led_by_its_first_live_replica(assignment, live, expected):
    assert initial_partition_state(assignment, live, CONTROLLER_EPOCH) == expected


def state(leader, epoch, isr, controller_epoch=CONTROLLER_EPOCH - 1):
    return PartitionState(leader, epoch, tuple(isr), controller_epoch)


@pytest.mark.parametrize("before, live, bounced, unclean, after", [
    # nothing changed: the same object back, nothing to write
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [], False, None),
    # a follower died: it leaves the ISR, the epoch stays (Kafka 2.8 bumps it)
    (state(1, 4, [1, 2, 3]), [1, 2], [], False, state(1, 4, [1, 2], CONTROLLER_EPOCH)),
    # a follower bounced: it leaves the ISR too (it rejoins by catching up)
    (state(1, 4, [1, 2, 3]), [1, 2, 3], [3], False, state(1, 4, [1, 2], CONTROLLER_EPOCH)),
    # the leader died: the next live ISR member in assignment order, epoch + 1
    (state(1, 4, [1, 2, 3]), [2, 3], [], False, state(2, 5, [2, 3], CONTROLLER_EPOCH)),
    (state(1, 4, [1, 3]), [2, 3], [], False, state(3, 5, [3], CONTROLLER_EPOCH)),
    # the leader bounced with followers in sync: they take over
    (state(1, 4, [1, 2]), [1, 2], [1], False, state(2, 5, [2], CONTROLLER_EPOCH)),
    # the leader bounced and was alone in the ISR: it leads again, at a new epoch
    (state(1, 4, [1]), [1, 2], [1], False, state(1, 5, [1], CONTROLLER_EPOCH)),
    # the leader died alone in the ISR, clean: no leader, epoch + 1, ISR kept
    (state(1, 4, [1]), [2, 3], [], False, state(NO_LEADER, 5, [1], CONTROLLER_EPOCH)),
    # ... and it stays so while nobody eligible comes back (nothing to write)
    (state(NO_LEADER, 5, [1]), [2, 3], [], False, None),
    # ... and the last in-sync replica's return elects it
    (state(NO_LEADER, 5, [1]), [1, 2, 3], [], False, state(1, 6, [1], CONTROLLER_EPOCH)),
    # unclean: a live replica outside the ISR leads, alone in the ISR
    (state(1, 4, [1]), [2, 3], [], True, state(2, 5, [2], CONTROLLER_EPOCH)),
    (state(NO_LEADER, 5, [1]), [3], [], True, state(3, 6, [3], CONTROLLER_EPOCH)),
])
def test_partition_state_after_broker_changes(before, live, bounced, unclean, after):
    result = partition_state_after(before, [1, 2, 3], live, bounced, unclean, CONTROLLER_EPOCH)
    if after is None:
        assert result is before
    else:
        assert result == after
        assert result.leader == NO_LEADER or result.leader in result.isr
