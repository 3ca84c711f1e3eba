"""Consumer groups against a real broker: the ``shmlog groups`` tool, bad group
requests, and rebalances caused by a member that stops polling and by a topic
that grows. (Multi-process membership and failover: test_group_processes.py; the
coordinator's rules alone: unit/test_groups.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import zmq

from shmlog import shared_memory
from shmlog.admin import Admin
from shmlog.broker import Broker, control_address, request, shared_memory_prefix
from shmlog.consumer import Consumer, ConsumerRebalanceListener, TopicPartition
from shmlog.control import encode_request
from shmlog.errors import (CommitFailedError, GroupIdNotFoundError, IllegalGenerationError,
                           LocalProtocolError, NonEmptyGroupError, UnknownMemberIdError)
from shmlog.producer import Producer

GROUP_SETTINGS = {"session_timeout_ms": 1_000, "heartbeat_interval_ms": 100,
                  "auto_offset_reset": "earliest"}
WAIT_S = 30


@pytest.fixture
def data_dir(tmp_path):
    path = str(tmp_path / "data")
    with Broker(path, group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=500):
        Admin(path).create_topic("events", partitions=4)
        with Producer(path) as producer:
            for index in range(40):
                producer.send("events", b"v%d" % index, partition=index % 4)
            producer.flush(timeout=30)
        yield path
    for name in os.listdir("/dev/shm"):
        if name.startswith(shared_memory_prefix(path)):
            shared_memory.unlink(name)


def shmlog(data_dir: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlog", "groups", *arguments,
                           "--data-dir", data_dir], capture_output=True, text=True, timeout=120)


def consume_all(consumer: Consumer, count: int) -> list:
    records = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < count and time.monotonic() < deadline:
        records += [record for batch in consumer.poll(timeout_ms=100).values() for record in batch]
    return records


def test_the_groups_tool_lists_describes_resets_and_deletes(data_dir):
    with Consumer(bootstrap=data_dir, group_id="app", enable_auto_commit=False,
                  **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["events"])
        assert len(consume_all(consumer, 40)) == 40
        consumer.commit({TopicPartition("events", 0): 4, TopicPartition("events", 1): 10,
                         TopicPartition("events", 2): 10, TopicPartition("events", 3): 10})
        listed = shmlog(data_dir, "list")
        assert listed.returncode == 0 and "app  Stable  members=1" in listed.stdout
        described = shmlog(data_dir, "describe", "app")
        assert described.returncode == 0, described.stderr
        rows = [line.split() for line in described.stdout.splitlines()[2:]]
        assert [row[:5] for row in rows] == [["events", "0", "4", "10", "6"],
                                             ["events", "1", "10", "10", "0"],
                                             ["events", "2", "10", "10", "0"],
                                             ["events", "3", "10", "10", "0"]]
        active = shmlog(data_dir, "reset-offsets", "app", "--to-earliest", "--execute")
        assert active.returncode == 1 and "active members" in active.stderr
    dry = shmlog(data_dir, "reset-offsets", "app", "--to-earliest", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert not plan["executed"] and [entry["new"] for entry in plan["offsets"]] == [0, 0, 0, 0]
    assert Admin(data_dir).list_consumer_group_offsets("app")[("events", 0)][0] == 4, \
        "a dry run changes nothing"
    for arguments, expected in ((["--to-offset", "7"], [7, 7, 7, 7]),
                                (["--shift-by", "-2"], [5, 5, 5, 5]),
                                (["--to-latest"], [10, 10, 10, 10]),
                                (["--to-offset", "99"], [10, 10, 10, 10]),
                                (["--to-timestamp-ms", "0"], [0, 0, 0, 0])):
        done = shmlog(data_dir, "reset-offsets", "app", "--topic", "events", *arguments,
                      "--execute")
        assert done.returncode == 0, done.stderr
        offsets = Admin(data_dir).list_consumer_group_offsets("app")
        assert [offsets[("events", p)][0] for p in range(4)] == expected, arguments
    with Consumer(bootstrap=data_dir, group_id="app", **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["events"])
        assert len(consume_all(consumer, 40)) == 40, "the group starts at the reset offsets"
    assert shmlog(data_dir, "delete", "app").returncode == 0
    missing = shmlog(data_dir, "describe", "app")
    assert missing.returncode == 1 and "no group" in missing.stderr


def raw_request(data_dir: str, frame: bytes) -> dict:
    context = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(control_address(data_dir))
        socket.send(frame)
        assert socket.poll(10_000, zmq.POLLIN), "the broker answers"
        return json.loads(socket.recv())
    finally:
        socket.close()


def test_bad_group_requests_get_errors_and_the_coordinator_keeps_serving(data_dir):
    for frame, error in (
            (b'{"version": 1, "type": "join_group", "group_id": 5}', "LocalProtocolError"),
            (b'{"version": 1, "type": "heartbeat"}', "LocalProtocolError"),
            (encode_request("join_group", group_id="g", assignors=["nope"]), "LocalProtocolError"),
            (encode_request("join_group", group_id="g", surprise=1), "LocalProtocolError"),
            (encode_request("sync_group", group_id="g", member_id="x", generation=1),
             "UnknownMemberIdError"),
            (encode_request("describe_group", group_id="nobody"), "GroupIdNotFoundError"),
            (encode_request("commit_offsets", group_id="g", offsets=[["events", "zero", 1]]),
             "LocalProtocolError"),
            (b"\xff not json", "LocalProtocolError")):
        reply = raw_request(data_dir, frame)
        assert reply["ok"] is False and reply["error"] == error, (frame, reply)
    with Consumer(bootstrap=data_dir, group_id="g", **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["events"])
        assert len(consume_all(consumer, 40)) == 40, "the coordinator still serves"
        metadata = consumer.group_metadata()
        with pytest.raises(IllegalGenerationError):
            request(data_dir, "heartbeat", group_id="g", member_id=metadata.member_id,
                    generation=metadata.generation_id - 1)
        with pytest.raises(UnknownMemberIdError):
            request(data_dir, "commit_offsets", group_id="g", member_id="someone-else",
                    generation=metadata.generation_id, offsets=[["events", 0, 1, ""]])
        with pytest.raises(NonEmptyGroupError):
            request(data_dir, "delete_group", group_id="g")
    with pytest.raises(GroupIdNotFoundError):
        request(data_dir, "delete_group", group_id="never")


class Recorder(ConsumerRebalanceListener):
    def __init__(self):
        self.calls = []

    def on_partitions_revoked(self, revoked):
        self.calls.append(("revoked", sorted(revoked)))

    def on_partitions_assigned(self, assigned):
        self.calls.append(("assigned", sorted(assigned)))

    def on_partitions_lost(self, lost):
        self.calls.append(("lost", sorted(lost)))


def poll_until(consumers, condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for consumer in consumers:
            consumer.poll(timeout_ms=20)


def test_a_member_that_stops_polling_leaves_and_its_partitions_move(data_dir):
    slow_listener, busy_listener = Recorder(), Recorder()
    slow = Consumer(bootstrap=data_dir, group_id="g", max_poll_interval_ms=1_500,
                    enable_auto_commit=False, **GROUP_SETTINGS)
    busy = Consumer(bootstrap=data_dir, group_id="g", **GROUP_SETTINGS)
    try:
        slow.subscribe(["events"], listener=slow_listener)
        slow.poll(timeout_ms=100)
        busy.subscribe(["events"], listener=busy_listener)
        poll_until([slow, busy], lambda: len(slow.assignment()) == 2 == len(busy.assignment()),
                   "two members with two partitions each")
        # The slow member stops polling; its heartbeats go on, but after
        # max_poll_interval_ms it leaves, and the busy member takes everything.
        poll_until([busy], lambda: len(busy.assignment()) == 4, "the busy member to take over")
        assert slow.group_metadata().member_id == ""
        with pytest.raises(CommitFailedError):
            slow.commit({TopicPartition("events", 0): 1})
        slow.poll(timeout_ms=10)
        assert ("lost", sorted(slow_listener.calls[-1][1])) == slow_listener.calls[-1] or \
            slow_listener.calls[-2][0] == "lost"
        assert ("assigned", []) != busy_listener.calls[-1]
    finally:
        slow.close()
        busy.close()


def test_growing_a_subscribed_topic_rebalances_and_pause_holds_across_it(data_dir):
    listener = Recorder()
    with Consumer(bootstrap=data_dir, group_id="g", **GROUP_SETTINGS) as consumer:
        consumer.subscribe(pattern=r"ev.*", listener=listener)
        assert len(consume_all(consumer, 40)) == 40
        consumer.pause(TopicPartition("events", 0))
        Admin(data_dir).add_partitions("events", 6)
        with Producer(data_dir) as producer:
            for partition in (0, 4, 5):
                producer.send("events", b"new", partition=partition)
            producer.flush(timeout=30)
        records = consume_all(consumer, 2)
        assert sorted(record.partition for record in records) == [4, 5]
        assert len(consumer.assignment()) == 6
        assert consumer.poll(timeout_ms=200) == {}, "partition 0 is still paused"
        consumer.resume(TopicPartition("events", 0))
        assert [record.partition for record in consume_all(consumer, 1)] == [0]
    with pytest.raises(LocalProtocolError):
        Consumer(bootstrap=data_dir, group_id="g", session_timeout_ms=100,
                 heartbeat_interval_ms=200)


def test_auto_commit_commits_what_poll_returned(data_dir):
    with Consumer(bootstrap=data_dir, group_id="auto", auto_commit_interval_ms=200,
                  max_poll_records=7, **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["events"])
        returned = consume_all(consumer, 20)
        time.sleep(0.25)
        positions = {partition: consumer.position(partition)
                     for partition in consumer.assignment()}
        consumer.pause(*consumer.assignment())
        consumer.poll(timeout_ms=0)                     # auto commit happens in poll
        committed = {partition: consumer.committed(partition)
                     for partition in consumer.assignment()}
        assert committed == positions, "the positions after what poll returned"
        assert sum(committed.values()) == len(returned)
        consumer.resume(*consumer.assignment())
        returned += consume_all(consumer, 40 - len(returned))
        final = {partition: consumer.position(partition) for partition in consumer.assignment()}
    offsets = Admin(data_dir).list_consumer_group_offsets("auto")
    assert {TopicPartition(*partition): offset for partition, (offset, _) in offsets.items()} \
        == final, "close commits the positions"
    assert sum(final.values()) == len(returned) == 40
