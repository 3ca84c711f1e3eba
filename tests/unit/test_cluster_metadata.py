"""Replica assignment and the describe format (cluster_metadata), one Kafka rule per test.

Goal: a new topic's replicas are placed as Kafka 2.8's
``AdminUtils.assignReplicasToBrokers`` places them (rack-unaware and rack-aware), its
refusals carry Kafka's messages, and ``describe_lines`` prints ``kafka-topics
--describe``'s format (``TopicCommand.TopicDescription``/``PartitionDescription``).

Method: plain numbers, table-style, against the examples of AdminUtils' doc comment
and of Kafka's AdminRackAwareTest at 2.8.2; distribution properties (Kafka's
``RackAwareTest.checkReplicaDistribution``) for every start index; the lightness of
the module in a fresh interpreter.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from shmlog.cluster.metadata import (
    NO_LEADER,
    assign_replicas,
    describe_lines,
    rack_alternated_brokers,
)
from shmlog.common.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
)

FIVE_BROKERS = {broker: None for broker in range(5)}
# AdminUtils' doc comment (and AdminRackAwareTest): broker -> rack.
DOC_RACKS = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
# AdminRackAwareTest's usual six brokers on three racks.
TEST_RACKS = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"}


def test_rack_unaware_matches_the_doc_comments_table():
    # AdminUtils' doc comment: five brokers, ten partitions, three replicas; each row
    # of its table lists, per broker 0..4, the partition of which it holds that replica.
    table = [("1st", [0, 1, 2, 3, 4]), ("1st", [5, 6, 7, 8, 9]),
             ("2nd", [4, 0, 1, 2, 3]), ("2nd", [8, 9, 5, 6, 7]),
             ("3rd", [3, 4, 0, 1, 2]), ("3rd", [7, 8, 9, 5, 6])]
    assignment = assign_replicas(FIVE_BROKERS, 10, 3, start_index=0)
    for which, partitions in table:
        replica = ["1st", "2nd", "3rd"].index(which)
        for broker, partition in enumerate(partitions):
            assert assignment[partition][replica] == broker, (which, partition)


def test_rack_unaware_matches_kafkas_test_replica_assignment():
    # AdminRackAwareTest.testReplicaAssignment's expected map (fixedStartIndex 0).
    assert assign_replicas(FIVE_BROKERS, 10, 3, start_index=0) == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}


def test_rack_alternated_list_is_kafkas_example():
    # getRackAlternatedBrokerList: racks by name, brokers by id, one rack at a time.
    assert rack_alternated_brokers(DOC_RACKS) == [0, 3, 1, 5, 4, 2]
    without_five = {broker: rack for broker, rack in DOC_RACKS.items() if broker != 5}
    assert rack_alternated_brokers(without_five) == [0, 3, 1, 4, 2]


def test_rack_aware_matches_the_doc_comments_example():
    # The doc comment's six partitions, then partition 6 with the followers shifted
    # (AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers).
    assert assign_replicas(DOC_RACKS, 7, 3, start_index=0) == {
        0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0],
        5: [2, 0, 3], 6: [0, 4, 2]}


def replica_distribution(assignment):
    leaders = collections.Counter(replicas[0] for replicas in assignment.values())
    replicas = collections.Counter(broker for brokers in assignment.values() for broker in brokers)
    return leaders, replicas


@pytest.mark.parametrize("racks, partitions, replication_factor", [
    (TEST_RACKS, 6, 3),          # testAssignmentWithRackAware
    (TEST_RACKS, 12, 2),         # testAssignmentWith2ReplicasRackAware
    (TEST_RACKS, 6, 2),          # ...With6Partitions
    ({0: "rack1", 1: "rack2", 4: "rack3"}, 6, 2),    # ...With6PartitionsAnd3Brokers
])
@pytest.mark.parametrize("start_index", range(6))
def test_rack_aware_spreads_leaders_replicas_and_racks_evenly(racks, partitions,
                                                              replication_factor, start_index):
    # RackAwareTest.checkReplicaDistribution: each partition on distinct racks, and
    # leaders and replicas spread evenly when the counts divide.
    start_index %= len(racks)
    assignment = assign_replicas(racks, partitions, replication_factor, start_index=start_index)
    assert sorted(assignment) == list(range(partitions))
    for replicas in assignment.values():
        assert len({racks[broker] for broker in replicas}) == replication_factor
    leaders, replicas = replica_distribution(assignment)
    assert set(leaders.values()) == {partitions // len(racks)}
    assert set(replicas.values()) == {partitions * replication_factor // len(racks)}


def test_rack_aware_with_more_replicas_than_racks_covers_every_rack():
    # testMoreReplicasThanRacks: RF 5 over three racks puts a replica on each rack.
    racks = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack2"}
    for replicas in assign_replicas(racks, 6, 5).values():
        assert len(replicas) == len(set(replicas)) == 5
        assert {racks[broker] for broker in replicas} == {"rack1", "rack2", "rack3"}


def test_rack_aware_with_fewer_replicas_than_racks_uses_distinct_racks():
    # testLessReplicasThanRacks: RF 2 over three racks puts its replicas on two racks.
    racks = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack2"}
    for replicas in assign_replicas(racks, 6, 2).values():
        assert len({racks[broker] for broker in replicas}) == 2


def test_one_rack_still_spreads_leaders():
    # testSingleRack: every rack holds a replica already, so brokers alone decide.
    racks = {broker: "rack1" for broker in range(6)}
    assignment = assign_replicas(racks, 6, 3)
    leaders, _ = replica_distribution(assignment)
    assert set(leaders.values()) == {1}


def test_a_broker_is_never_picked_twice_when_racks_run_out():
    # testSkipBrokerWithReplicaAlreadyAssigned: RF 4 over three racks of 5 brokers.
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "a"}
    for replicas in assign_replicas(racks, 6, 4, start_index=2).values():
        assert len(set(replicas)) == 4


@pytest.mark.parametrize("brokers", [FIVE_BROKERS, TEST_RACKS])
def test_a_random_start_gives_valid_assignments(brokers):
    for _ in range(50):
        assignment = assign_replicas(brokers, 7, 3)
        assert sorted(assignment) == list(range(7))
        for replicas in assignment.values():
            assert len(set(replicas)) == 3 and set(replicas) <= set(brokers)


def test_broker_ids_are_used_in_id_order_whatever_the_mapping_order():
    # AdminZkClient.getBrokerMetadatas sorts brokers by id.
    assignment = assign_replicas({3: None, 1: None, 2: None}, 3, 3, start_index=0)
    assert assignment == {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}


@pytest.mark.parametrize("brokers", [FIVE_BROKERS, TEST_RACKS])
def test_more_partitions_continue_the_round_robin(brokers):
    # startPartitionId: adding partitions 5.. continues where 0..4 stopped.
    whole = assign_replicas(brokers, 12, 2, start_index=1, start_shift=3)
    head = assign_replicas(brokers, 5, 2, start_index=1, start_shift=3)
    tail = assign_replicas(brokers, 7, 2, start_index=1, start_shift=3, first_partition=5)
    assert {**head, **tail} == whole


def test_start_shift_moves_only_the_followers():
    shifted = assign_replicas(FIVE_BROKERS, 5, 3, start_index=0, start_shift=1)
    assert [replicas[0] for replicas in shifted.values()] == [0, 1, 2, 3, 4]
    assert shifted[0] == [0, 2, 3]


def test_replication_factor_above_the_brokers_is_refused_with_kafkas_message():
    with pytest.raises(InvalidReplicationFactorError,
                       match=r"^Replication factor: 3 larger than available brokers: 2\.$"):
        assign_replicas({1: None, 2: None}, 1, 3)


@pytest.mark.parametrize("replication_factor", [0, -1])
def test_replication_factor_below_one_is_refused(replication_factor):
    with pytest.raises(InvalidReplicationFactorError, match="must be larger than 0"):
        assign_replicas(FIVE_BROKERS, 3, replication_factor)


def test_no_partitions_is_refused():
    with pytest.raises(InvalidPartitionsError, match="Number of partitions must be larger than 0"):
        assign_replicas(FIVE_BROKERS, 0, 1)


def test_mixed_racks_are_refused_unless_racks_are_ignored():
    mixed = {0: "r1", 1: None, 2: "r2"}
    with pytest.raises(InvalidReplicaAssignmentError,
                       match=r"Not all brokers have rack information.*no rack: \[1\]"):
        assign_replicas(mixed, 3, 2, start_index=0)
    assert assign_replicas(mixed, 3, 2, start_index=0, rack_aware=False) == \
        assign_replicas({0: None, 1: None, 2: None}, 3, 2, start_index=0)


def test_describe_prints_kafka_topics_format():
    lines = describe_lines("T", "3f2a", {
        1: (NO_LEADER, [2, 3, 1], [2]),
        0: (1, [1, 2, 3], [1, 2, 3]),
        2: (3, [3, 1, 2], [3, 1]),
    }, {"min.insync.replicas": 2}, live_brokers=[1, 2, 3])
    assert lines == [
        "Topic: T\tTopicId: 3f2a\tPartitionCount: 3\tReplicationFactor: 3\t"
        "Configs: min.insync.replicas=2",
        "\tTopic: T\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3",
        "\tTopic: T\tPartition: 1\tLeader: none\tReplicas: 2,3,1\tIsr: 2",
        "\tTopic: T\tPartition: 2\tLeader: 3\tReplicas: 3,1,2\tIsr: 3,1",
    ]


def test_describe_prints_none_for_a_leader_that_is_not_live():
    lines = describe_lines("T", None, {0: (2, [2, 1], [2, 1])}, {}, live_brokers={1})
    assert lines[1] == "\tTopic: T\tPartition: 0\tLeader: none\tReplicas: 2,1\tIsr: 2,1"


def test_describe_without_topic_id_or_configs_and_marked_for_deletion():
    lines = describe_lines("T", None, {0: (1, [1], [1])},
                           {"unclean.leader.election.enable": True, "cleanup.policy": "compact"},
                           live_brokers={1}, marked_for_deletion=True)
    assert lines == [
        "Topic: T\tPartitionCount: 1\tReplicationFactor: 1\t"
        "Configs: cleanup.policy=compact,unclean.leader.election.enable=true"
        "\tMarkedForDeletion: true",
        "\tTopic: T\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1\tMarkedForDeletion: true",
    ]


def test_cluster_modules_are_light():
    heavy = ("numba", "numpy", "llvmlite", "kazoo", "zmq")
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys; import shmlog.config.cluster, "
         "shmlog.cluster.metadata, shmlog.config.broker; print(json.dumps(sorted(name for name "
         f"in sys.modules if name.split('.')[0] in {heavy!r})))"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
