"""Cluster mode's znode layout (``shmlog.cluster.zk.paths``): every body round-trips, Kafka's
example bodies (Kafka 2.8's ``ZkData.scala``, its znodes as a 2.8 cluster writes them)
decode, and every malformed body is a ZnodeFormatError (a PeerProtocolError), never
another exception.

Method: plain bytes in and out, no ZooKeeper.
"""

from __future__ import annotations

import json

import pytest

from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.paths import (
    NO_LEADER,
    BrokerRegistration,
    ControllerRegistration,
    PartitionState,
    ProducerIdBlock,
    TopicAssignment,
)
from shmlog.common.errors import InvalidTopicError, PeerProtocolError, ZnodeFormatError

TOPIC_ID = "0123456789abcdef0123456789abcdef"


def test_paths_follow_kafkas_layout():
    assert zk_paths.broker_path(3) == "/brokers/ids/3"
    assert zk_paths.topic_path("t") == "/brokers/topics/t"
    assert zk_paths.partition_state_path("t", 2) == "/brokers/topics/t/partitions/2/state"
    assert zk_paths.topic_config_path("t") == "/config/topics/t"
    assert zk_paths.delete_topic_path("t") == "/admin/delete_topics/t"
    for bad in ("", "a/b", ".", "..", None):
        with pytest.raises(InvalidTopicError):
            zk_paths.topic_path(bad)


def test_new_topic_ids_are_32_hex_digits_and_decode():
    topic_id = zk_paths.new_topic_id()
    assignment = TopicAssignment("t", topic_id, {0: [1]})
    assert zk_paths.decode_topic_assignment("t", zk_paths.encode_topic_assignment(assignment)) \
        == assignment


@pytest.mark.parametrize("value", [
    BrokerRegistration(1, "host-a", "tcp://10.0.0.1:9093", "r1", 1700000000000, 42),
    BrokerRegistration(2, "host-b", "tcp://10.0.0.2:9093"),
    BrokerRegistration(3, "host-c", "tcp://10.0.0.3:9093", None, 1, 7, "x" * 40),
    BrokerRegistration(4, "host-d", "tcp://10.0.0.4:9093", None, 1, 7, None,
                       ("PLAINTEXT://host-d:9092",)),
])
def test_broker_registration_round_trips(value):
    body = zk_paths.encode_broker_registration(value)
    assert zk_paths.decode_broker_registration(value.broker_id, body) == value
    assert (b"curve_public_key" in body) == (value.curve_public_key is not None)
    assert (b'"endpoints"' in body) == bool(value.kafka_endpoints)   # Kafka's name for them


@pytest.mark.parametrize("endpoints", ['"PLAINTEXT://h:1"', '["h:1"]', "[7]"])
def test_a_registration_with_bad_kafka_endpoints_is_refused(endpoints):
    body = b'{"version":1,"host":"h","replication":"tcp://h:1","rack":null,' \
           b'"timestamp":"0","pid":1,"endpoints":%s}' % endpoints.encode()
    with pytest.raises(ZnodeFormatError, match="endpoints"):
        zk_paths.decode_broker_registration(1, body)


@pytest.mark.parametrize("public_key", ["", "x" * 39, "x" * 41, "x" * 39 + "~", 7])
def test_a_registration_with_a_bad_curve_key_is_refused(public_key):
    body = b'{"version":1,"host":"h","replication":"tcp://h:1","rack":null,' \
           b'"timestamp":"0","pid":1,"curve_public_key":%s}' % json.dumps(public_key).encode()
    with pytest.raises(ZnodeFormatError, match="curve_public_key"):
        zk_paths.decode_broker_registration(1, body)


def test_partition_state_round_trips_and_is_frozen():
    for state in (PartitionState(1, 4, (1, 2), 7), PartitionState(NO_LEADER, 5, [3], 7)):
        assert zk_paths.decode_partition_state(zk_paths.encode_partition_state(state)) == state
    state = PartitionState(1, 0, [1], 1)
    assert state.isr == (1,) and state.has_leader
    assert not PartitionState(NO_LEADER, 0, (), 1).has_leader
    with pytest.raises(AttributeError):
        state.leader = 2


def test_other_bodies_round_trip():
    assignment = TopicAssignment("t", TOPIC_ID, {1: [2, 3], 0: [1, 2]})
    assert list(assignment.partitions) == [0, 1]
    assert zk_paths.decode_topic_assignment("t", zk_paths.encode_topic_assignment(assignment)) \
        == assignment
    controller = ControllerRegistration(2, 1700000000000)
    assert zk_paths.decode_controller(zk_paths.encode_controller(controller)) == controller
    assert zk_paths.decode_controller_epoch(zk_paths.encode_controller_epoch(7)) == 7
    config = {"min.insync.replicas": "2"}
    assert zk_paths.decode_topic_config("t", zk_paths.encode_topic_config(config)) == config
    assert zk_paths.decode_cluster_id(zk_paths.encode_cluster_id("c-1")) == "c-1"
    block = ProducerIdBlock(1, 1000, 1999)
    assert zk_paths.decode_producer_id_block(zk_paths.encode_producer_id_block(block)) == block
    assert zk_paths.decode_producer_id_block(b"") is None


def test_kafka_example_bodies_decode():
    # ZkData.scala: TopicPartitionStateZNode, ControllerZNode, ControllerEpochZNode,
    # ProducerIdBlockZNode, ConfigEntityZNode, ClusterIdZNode (Kafka's field order).
    state = zk_paths.decode_partition_state(
        b'{"controller_epoch":1,"leader":1,"version":1,"leader_epoch":0,"isr":[1,2,3]}')
    assert state == PartitionState(1, 0, (1, 2, 3), 1)
    assert zk_paths.decode_controller(b'{"version":1,"brokerid":1,"timestamp":"1616161616161"}') \
        == ControllerRegistration(1, 1616161616161)
    assert zk_paths.decode_controller_epoch(b"12") == 12
    assert zk_paths.decode_producer_id_block(
        b'{"version":1,"broker":0,"block_start":"0","block_end":"999"}') \
        == ProducerIdBlock(0, 0, 999)
    assert zk_paths.decode_topic_config("t", b'{"version":1,"config":{"cleanup.policy":'
                                             b'"compact"}}') == {"cleanup.policy": "compact"}
    assert zk_paths.decode_cluster_id(b'{"version":"1","id":"h0UOY6xjQZy-0ZDwX0WiZg"}') \
        == "h0UOY6xjQZy-0ZDwX0WiZg"
    assignment = zk_paths.decode_topic_assignment(
        "t", b'{"version":3,"topic_id":"' + TOPIC_ID.encode() + b'","partitions":{"0":[0,1],'
             b'"1":[1,0]},"adding_replicas":{},"removing_replicas":{}}')
    assert assignment.partitions == {0: (0, 1), 1: (1, 0)}


@pytest.mark.parametrize("body", [
    None, b"", b"\xff", b"[1]", b"{", b'{"version":2,"leader":1,"leader_epoch":0,"isr":[1],'
    b'"controller_epoch":1}',
    b'{"version":1,"leader_epoch":0,"isr":[1],"controller_epoch":1}',
    b'{"version":1,"leader":"1","leader_epoch":0,"isr":[1],"controller_epoch":1}',
    b'{"version":1,"leader":true,"leader_epoch":0,"isr":[1],"controller_epoch":1}',
    b'{"version":1,"leader":-2,"leader_epoch":0,"isr":[1],"controller_epoch":1}',
    b'{"version":1,"leader":1,"leader_epoch":-1,"isr":[1],"controller_epoch":1}',
    b'{"version":1,"leader":1,"leader_epoch":0,"isr":[2],"controller_epoch":1}',
    b'{"version":1,"leader":1,"leader_epoch":0,"isr":[1,1],"controller_epoch":1}',
    b'{"version":1,"leader":1,"leader_epoch":0,"isr":"1","controller_epoch":1}',
])
def test_malformed_partition_states_are_znode_format_errors(body):
    with pytest.raises(ZnodeFormatError) as raised:
        zk_paths.decode_partition_state(body)
    assert isinstance(raised.value, PeerProtocolError)


@pytest.mark.parametrize("body", [
    b'{"version":2,"partitions":{"0":[1]}}',                                  # Kafka 2.7's
    b'{"version":3,"topic_id":"xyz","partitions":{"0":[1]}}',
    b'{"version":3,"topic_id":"%s","partitions":{}}' % TOPIC_ID.encode(),
    b'{"version":3,"topic_id":"%s","partitions":{"1":[1]}}' % TOPIC_ID.encode(),
    b'{"version":3,"topic_id":"%s","partitions":{"a":[1]}}' % TOPIC_ID.encode(),
    b'{"version":3,"topic_id":"%s","partitions":{"0":[]}}' % TOPIC_ID.encode(),
    b'{"version":3,"topic_id":"%s","partitions":{"0":[-1]}}' % TOPIC_ID.encode(),
    b'{"version":3,"topic_id":"%s","partitions":[[1]]}' % TOPIC_ID.encode(),
])
def test_malformed_assignments_are_znode_format_errors(body):
    with pytest.raises(ZnodeFormatError):
        zk_paths.decode_topic_assignment("t", body)


@pytest.mark.parametrize("decode, body", [
    (zk_paths.decode_controller_epoch, b"-1"),
    (zk_paths.decode_controller_epoch, b"x"),
    (zk_paths.decode_controller_epoch, b""),
    (zk_paths.decode_controller, b'{"version":1,"brokerid":"1"}'),
    (zk_paths.decode_controller, b'{"version":1,"brokerid":1,"timestamp":"-5"}'),
    (zk_paths.decode_cluster_id, b'{"version":1,"id":"x"}'),
    (zk_paths.decode_cluster_id, b'{"version":"1","id":""}'),
    (zk_paths.decode_producer_id_block, b'{"version":1,"broker":0,"block_start":"10",'
                                        b'"block_end":"9"}'),
    (zk_paths.decode_producer_id_block, b'{"version":1,"broker":0,"block_start":0,'
                                        b'"block_end":"9"}'),
    (lambda body: zk_paths.decode_topic_config("t", body), b'{"version":1,"config":{"a":1}}'),
    (lambda body: zk_paths.decode_broker_registration(1, body), b'{"version":1,"host":"h"}'),
    (lambda body: zk_paths.decode_broker_registration(1, body),
     b'{"version":1,"host":"h","replication":"tcp://h:1","rack":5}'),
    (zk_paths.decode_broker_id, "01"),
    (zk_paths.decode_broker_id, "x"),
])
def test_other_malformed_bodies_are_znode_format_errors(decode, body):
    with pytest.raises(ZnodeFormatError):
        decode(body)


# --- controlled shutdown and preferred election -----------------------------------------

def test_controlled_shutdown_and_preferred_election_bodies_round_trip():
    assert zk_paths.controlled_shutdown_path(3) == "/admin/controlled_shutdown/3"
    assert zk_paths.CONTROLLED_SHUTDOWN_PATH in zk_paths.BASE_PATHS
    body = zk_paths.encode_controlled_shutdown(1 << 40)
    assert zk_paths.decode_controlled_shutdown(3, body) == 1 << 40
    pairs = (("a", 1), ("a", 0), ("b", 2))
    decoded = zk_paths.decode_preferred_replica_election(
        zk_paths.encode_preferred_replica_election(pairs))
    assert decoded == (("a", 0), ("a", 1), ("b", 2))


def test_kafkas_preferred_replica_election_body_decodes():
    # PreferredReplicaElectionZNode as kafka-preferred-replica-election.sh wrote it.
    body = b'{"version":1,"partitions":[{"topic":"t","partition":0},' \
           b'{"topic":"t","partition":0},{"topic":"u","partition":3}]}'
    assert zk_paths.decode_preferred_replica_election(body) == (("t", 0), ("u", 3))


@pytest.mark.parametrize("decode, body", [
    (lambda body: zk_paths.decode_controlled_shutdown(1, body), b'{"version":1}'),
    (lambda body: zk_paths.decode_controlled_shutdown(1, body),
     b'{"version":1,"broker_epoch":5}'),
    (lambda body: zk_paths.decode_controlled_shutdown(1, body),
     b'{"version":2,"broker_epoch":"5"}'),
    (zk_paths.decode_preferred_replica_election, b'{"version":1}'),
    (zk_paths.decode_preferred_replica_election, b'{"version":1,"partitions":[1]}'),
    (zk_paths.decode_preferred_replica_election,
     b'{"version":1,"partitions":[{"topic":"a/b","partition":0}]}'),
    (zk_paths.decode_preferred_replica_election,
     b'{"version":1,"partitions":[{"topic":"t","partition":-1}]}'),
    (zk_paths.decode_preferred_replica_election,
     b'{"version":1,"partitions":[{"topic":"t"}]}'),
])
def test_malformed_leader_balance_bodies_are_znode_format_errors(decode, body):
    with pytest.raises(ZnodeFormatError):
        decode(body)
