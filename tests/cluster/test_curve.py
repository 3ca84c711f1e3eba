"""CurveZMQ between brokers on a running cluster.

Goal: the brokers of a cluster talk CurveZMQ (keys made by ``LocalCluster``, the
default); a peer with an unknown key (a raw DEALER with CURVE keys of its own) and a
peer without CURVE cannot fetch, cannot produce (forward a batch), cannot join a
group, and get nothing back, while each broker goes on serving its real peers
(acks=all works, replicas agree) and logs and counts the refusals (``ping``'s
``replication_refused_connections``); a broker whose registration in ZooKeeper names a key
outside the allowed list is never connected to (and is, once it names an allowed
one); a cluster configured plaintext works without keys.

Method: the shared three brokers (``fault_cluster``: this test leaves them whole),
a topic of RF 3 (min.insync.replicas 2). Each message kind in :data:`REQUESTS` is
sent to every broker by two strangers and by a peer holding broker 1's key pair
(the control: its messages are answered, so the strangers' silence is the refusal,
not an unanswered message); the leader's log end grows only by the control's
batch. A fake registration (an ephemeral ``/brokers/ids/9`` written with kazoo)
points at a ZeroMQ STREAM socket that sees any TCP connection. Every wait is
bounded; times are never asserted.
"""

from __future__ import annotations

import os
import time

import zmq
from kazoo.client import KazooClient

from cluster.test_bad_frames import RawPeer, fetch, trusted_peer
from cluster.workload import (
    broker_output,
    create_topic,
    describe,
    replica_offsets,
    start_cluster,
    stop_cluster,
    wait_in_sync,
)
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.cluster.replication.messages import GroupRequest, Produce, ProducePartition
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.paths import BrokerRegistration
from shmlog.config import curve_keys
from shmlog.protocol.control import encode_request
from shmlog.protocol.control_client import request
from shmlog.record.records import encode_batch
from shmlog.shm.state import topic_key

TOPIC = "curved"
ANSWER_WAIT_MS = 10_000
# How long the strangers wait for an answer that must not come; the control's
# answers, sent at the same time, have come before it starts.
SILENCE_MS = 2_000
FAKE_BROKER = 9
# What a stranger tries, one message kind a line (a group request is one more line):
# each makes the message's body from the topic's key and the leader epoch.
REQUESTS = {
    "fetch": lambda key, epoch: fetch(key, epoch=epoch),
    "produce": lambda key, epoch: Produce(1, 5000, (ProducePartition(
        key, 0, encode_batch([b"forwarded by a peer"])),)),
    # Joining a group: a member's broker forwards its join to the coordinator's.
    "join a group": lambda key, epoch: GroupRequest(encode_request(
        "join_group", group_id="curve-strangers", topics=[TOPIC], session_timeout_ms=6000,
        rebalance_timeout_ms=6000).decode()),
}
# What the control sends instead: a group request that makes nothing (a join would
# make __consumer_offsets, 50 partitions, in the cluster the later fault tests share).
CONTROL_REQUESTS = {**REQUESTS, "join a group": lambda key, epoch: GroupRequest(
    encode_request("list_groups").decode())}


def strangers(cluster, broker_id: int) -> list[RawPeer]:
    """A peer with CURVE keys of its own, and one without CURVE."""
    server_key = curve_keys.read_public_key(
        f"{cluster.keys_directory}/broker-{broker_id}{curve_keys.PUBLIC_SUFFIX}")
    public, secret = (key.decode() for key in zmq.curve_keypair())
    endpoint = cluster.replication_endpoint(broker_id)
    return [RawPeer(endpoint, b"77:1", curve_keys.KeyPair(public, secret), server_key),
            RawPeer(endpoint, b"77:2")]


def send_or_refused(peer: RawPeer, frames: list) -> None:
    """Send without waiting: once its handshake was refused, a stranger's DEALER has
    no connection to queue a message for (the message is refused at once)."""
    try:
        peer.socket.send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        pass


def test_unknown_peers_cannot_fetch_or_produce(fault_cluster):
    cluster = fault_cluster
    create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 3)
    wait_in_sync(cluster, TOPIC, (1, 2, 3))
    entry = describe(cluster, 1, TOPIC)
    leader, epoch = entry["leader"], entry["leader_epoch"]
    key = topic_key(Admin(cluster.data_dir(1)).describe_topic(TOPIC)["topic_id"])
    log_end_before, _ = replica_offsets(cluster, leader, TOPIC)
    logged_before = {broker_id: len(broker_output(cluster, broker_id)) for broker_id in (1, 2, 3)}
    refused_before = {broker_id: request(cluster.data_dir(broker_id), "ping")
                      ["replication_refused_connections"] for broker_id in (1, 2, 3)}
    controls, unknowns = [], []
    try:
        for broker_id in (1, 2, 3):
            control = trusted_peer(cluster, broker_id)
            controls.append(control)
            unknowns += strangers(cluster, broker_id)
            for peer in unknowns[-2:]:
                for make in REQUESTS.values():
                    send_or_refused(peer, peer.message(make(key, epoch)))
            for make in CONTROL_REQUESTS.values():
                control.send(control.message(make(key, epoch)))
            for kind in CONTROL_REQUESTS:
                assert control.answer() is not None, (broker_id, kind)
        for peer in unknowns:
            assert not peer.socket.poll(SILENCE_MS), "a stranger got an answer"
    finally:
        for peer in controls + unknowns:
            peer.close()
    log_end, _ = replica_offsets(cluster, leader, TOPIC)
    assert log_end == log_end_before + 1                    # the control's batch alone
    # Each broker goes on serving its real peers.
    with Producer(cluster.data_dir(leader), acks="all") as producer:
        for n in range(10):
            producer.send(TOPIC, b"after-%d" % n, partition=0).get(timeout=30)
    cluster.wait_for(lambda: {replica_offsets(cluster, broker_id, TOPIC)
                              for broker_id in (1, 2, 3)} == {(log_end + 10, log_end + 10)},
                     30, "the replicas to agree")
    for broker_id in (1, 2, 3):
        logged = broker_output(cluster, broker_id)[logged_before[broker_id]:]
        assert "refused a replication connection" in logged, logged[-3000:]
        assert "Traceback" not in logged, logged[-3000:]
        answer = request(cluster.data_dir(broker_id), "ping", timeout_ms=ANSWER_WAIT_MS)
        assert answer["replication_security"] == "curve"
        assert answer["replication_refused_connections"] >= 2 + refused_before[broker_id]


def register(zookeeper: KazooClient, endpoint: str, public_key: str) -> None:
    zookeeper.create(zk_paths.broker_path(FAKE_BROKER), zk_paths.encode_broker_registration(
        BrokerRegistration(FAKE_BROKER, "127.0.0.1", endpoint, None, int(time.time() * 1000),
                           os.getpid(), public_key)), ephemeral=True)


def test_a_registration_naming_an_unknown_key_is_never_connected_to(fault_cluster):
    cluster = fault_cluster
    refusal = "broker %d at %s is not connected to"
    logged_before = {broker_id: len(broker_output(cluster, broker_id)) for broker_id in (1, 2, 3)}
    zookeeper = KazooClient(hosts=cluster.zookeeper_connect)
    zookeeper.start(timeout=ANSWER_WAIT_MS / 1000)
    context = zmq.Context()
    try:
        listener = context.socket(zmq.STREAM)             # sees any TCP connection
        listener.setsockopt(zmq.LINGER, 0)
        endpoint = f"tcp://127.0.0.1:{listener.bind_to_random_port('tcp://127.0.0.1')}"
        register(zookeeper, endpoint, zmq.curve_keypair()[0].decode())
        cluster.wait_for(lambda: all(
            refusal % (FAKE_BROKER, endpoint) in broker_output(cluster, broker_id)
            [logged_before[broker_id]:] for broker_id in (1, 2, 3)), 30,
            "every broker to refuse the unknown key")
        assert not listener.poll(SILENCE_MS), "a broker connected to an unknown key"
        # The control: the same address under an allowed key is connected to.
        zookeeper.delete(zk_paths.broker_path(FAKE_BROKER))
        allowed = curve_keys.read_key_pair(cluster.secret_key_file(1)).public_key
        register(zookeeper, endpoint, allowed)
        assert listener.poll(ANSWER_WAIT_MS), "no broker connected to an allowed key"
    finally:
        zookeeper.stop()
        zookeeper.close()
        context.destroy(linger=0)


def test_a_plaintext_cluster_works(zookeeper, tmp_path):
    cluster = start_cluster(str(tmp_path / "plain"), zookeeper, brokers=2, curve=False)
    try:
        assert not os.path.exists(cluster.keys_directory)
        create_topic(cluster, TOPIC, {"min.insync.replicas": "2"}, 2)
        wait_in_sync(cluster, TOPIC, (1, 2))
        leader = describe(cluster, 1, TOPIC)["leader"]
        with Producer(cluster.data_dir(leader), acks="all") as producer:
            for n in range(10):
                producer.send(TOPIC, b"plain-%d" % n, partition=0).get(timeout=30)
        cluster.wait_for(lambda: {replica_offsets(cluster, broker_id, TOPIC)
                                  for broker_id in (1, 2)} == {(10, 10)},
                         30, "the replicas to agree")
        client = KazooClient(hosts=cluster.zookeeper_connect)
        client.start(timeout=ANSWER_WAIT_MS / 1000)
        try:
            body, _ = client.get(zk_paths.broker_path(1))
        finally:
            client.stop()
            client.close()
        assert zk_paths.decode_broker_registration(1, body).curve_public_key is None
        assert request(cluster.data_dir(1), "ping")["replication_security"] == "plaintext"
        # Plain TCP: a raw peer without keys is answered.
        key = topic_key(Admin(cluster.data_dir(1)).describe_topic(TOPIC)["topic_id"])
        peer = RawPeer(cluster.replication_endpoint(leader))
        try:
            peer.send(peer.message(fetch(key, epoch=describe(cluster, 1, TOPIC)["leader_epoch"])))
            assert peer.answer() is not None
        finally:
            peer.close()
    finally:
        stop_cluster(cluster)
