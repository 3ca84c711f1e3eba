"""Consumer groups against a real broker: the ``shmlog groups`` tool, bad group
requests, rebalances caused by a member that stops polling and by a topic that
grows, and joins that time out, are cancelled, or fail half way (faults injected
into the member's transport). (Multi-process membership and failover: test_group_processes.py; the
coordinator's rules alone: unit/test_groups.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import zmq

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.consumer import (
    Consumer,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
    TopicPartition,
)
from shmlog.client.group_member import GroupMember, MemberConfig
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    BrokerNotAvailableError,
    CommitFailedError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InvalidTopicError,
    LocalProtocolError,
    NonEmptyGroupError,
    OffsetMetadataTooLargeError,
    OffsetOutOfRangeError,
    PartitionNotAssignedError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from shmlog.groups import OFFSETS_TOPIC
from shmlog.protocol.control import encode_request
from shmlog.server.broker import Broker, control_address, request

# A session of 3 s: long enough that a loaded 2-core machine never expires a live
# member (the tests here do not wait for expiry).
GROUP_SETTINGS = {"session_timeout_ms": 3_000, "heartbeat_interval_ms": 100,
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
    unlink_shared_memory(path)


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


@pytest.fixture
def slow_group_dir(tmp_path):
    """A broker whose groups wait 1.5 s for members before their first generation,
    so a test can act while a join waits."""
    path = str(tmp_path / "data")
    with Broker(path, group_initial_rebalance_delay_ms=1_500, group_min_session_timeout_ms=500):
        Admin(path).create_topic("events", partitions=4)
        yield path
    unlink_shared_memory(path)


def members_of(data_dir: str, group_id: str) -> list[str]:
    try:
        return [member["member_id"] for member in
                request(data_dir, "describe_group", group_id=group_id)["members"]]
    except GroupIdNotFoundError:
        return []


def test_a_first_join_that_times_out_and_is_sent_again_makes_one_member(slow_group_dir):
    """The join requests time out (200 ms) long before the group's first generation
    (1.5 s): every retry is the same member, not one more."""
    sent = []

    def impatient(request_type, timeout_ms=10_000, **fields):
        if request_type == "join_group":
            sent.append(fields["member_id"])
            timeout_ms = 200
        return request(slow_group_dir, request_type, timeout_ms=timeout_ms, **fields)

    member = GroupMember(impatient, "g", "app", MemberConfig(1_000, 100, 10_000))
    try:
        assignment = member.join(["events"], None, ())
        assert len(sent) > 3, "the join was sent again after timeouts"
        assert len(set(sent)) == 1 and sent[0].startswith("app-")
        assert members_of(slow_group_dir, "g") == [member.member_id] == [sent[0]]
        assert sorted(assignment) == [("events", partition) for partition in range(4)]
    finally:
        member.close()
    assert members_of(slow_group_dir, "g") == []


def test_unsubscribe_during_a_join_leaves_no_member_behind(slow_group_dir):
    with Consumer(bootstrap=slow_group_dir, group_id="g", **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["events"])
        assert consumer.poll(timeout_ms=200) == {}, "the join waits for the group's delay"
        assert len(members_of(slow_group_dir, "g")) == 1
        consumer.unsubscribe()
        # Well past the group's delay: had the join gone on, its member would be
        # heartbeating and holding every partition.
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            assert members_of(slow_group_dir, "g") == [], "no member after unsubscribe"
            assert consumer.poll(timeout_ms=100) == {}
        assert consumer.group_metadata().member_id == "" and consumer.assignment() == set()
        consumer.subscribe(["events"])                  # and it can join again
        poll_until([consumer], lambda: len(consumer.assignment()) == 4, "a join after it")
        assert len(members_of(slow_group_dir, "g")) == 1


def test_a_failure_taking_on_partitions_leaves_no_half_applied_assignment(data_dir):
    """The committed offsets of new partitions cannot be read once (the broker does
    not answer): the consumer takes none of them on, joins again, and then starts
    each at its committed offset, never at auto_offset_reset."""
    request(data_dir, "commit_offsets", group_id="g",
            offsets=[["events", partition, 6, ""] for partition in range(4)])
    with Consumer(bootstrap=data_dir, group_id="g", enable_auto_commit=False,
                  **{**GROUP_SETTINGS, "auto_offset_reset": "latest"}) as consumer:
        send, failed = consumer._group._send, []

        def unanswered_once(request_type, **fields):
            if request_type == "fetch_offsets" and not failed:
                failed.append(request_type)
                raise BrokerNotAvailableError("injected: no answer to fetch_offsets")
            return send(request_type, **fields)

        consumer._group._send = unanswered_once
        consumer.subscribe(["events"])
        records = consume_all(consumer, 16)
        assert failed, "the fault was injected"
        assert sorted((record.partition, record.offset) for record in records) == \
            [(partition, offset) for partition in range(4) for offset in range(6, 10)]


def test_a_long_poll_counts_as_polling_and_a_rebalance_cuts_into_it(data_dir):
    """A member waiting in poll(20 s) for records that do not come neither leaves
    the group after max_poll_interval_ms nor holds up a rebalance until its poll
    returns: a second member gets its partitions while the long poll still waits."""
    waiting = Consumer(bootstrap=data_dir, group_id="g", max_poll_interval_ms=1_500,
                       **GROUP_SETTINGS)
    other = Consumer(bootstrap=data_dir, group_id="g", **GROUP_SETTINGS)
    listener = Recorder()
    try:
        waiting.subscribe(["events"], listener=listener)
        assert len(consume_all(waiting, 40)) == 40
        member_id = waiting.group_metadata().member_id
        result = {}
        thread = threading.Thread(target=lambda: result.update(waiting.poll(timeout_ms=20_000)))
        thread.start()
        time.sleep(2.5)                                  # past max_poll_interval_ms
        assert members_of(data_dir, "g") == [member_id], "still a member while polling"
        other.subscribe(["events"])
        poll_until([other], lambda: len(other.assignment()) == 2, "the second member's share")
        assert thread.is_alive(), "the rebalance did not wait for the long poll to return"
        with pytest.raises(PartitionNotAssignedError):
            other.commit({partition: 1 for partition in
                          {TopicPartition("events", p) for p in range(4)} - other.assignment()})
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive() and result == {}
        assert len(waiting.assignment()) == 2, listener.calls
        assert waiting.group_metadata().member_id == member_id
    finally:
        waiting.close()
        other.close()


def test_internal_topics_and_bad_commits_are_refused(data_dir):
    """Clients cannot create, delete or grow __consumer_offsets (the broker makes it
    on the first commit), and a commit naming a missing partition, an offset past
    the log end or over-long metadata is refused whole, with a typed error that
    travels back to Consumer.commit."""
    admin = Admin(data_dir)
    with pytest.raises(InvalidTopicError, match="__consumer_offsets is an internal topic"):
        admin.create_topic(OFFSETS_TOPIC, partitions=3)
    assert OFFSETS_TOPIC not in admin.list_topics()
    events_0 = TopicPartition("events", 0)              # 10 records
    with Consumer(bootstrap=data_dir, group_id="tool", **GROUP_SETTINGS) as consumer:
        consumer.assign([events_0])
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 11, outside \[0, 10\]"):
            consumer.commit({events_0: 11})
        with pytest.raises(UnknownTopicOrPartitionError, match="events-9"):
            consumer.commit({events_0: 5, TopicPartition("events", 9): 0})
        with pytest.raises(OffsetMetadataTooLargeError, match="offset.metadata.max.bytes"):
            consumer.commit({events_0: OffsetAndMetadata(5, "x" * 4097)})
        assert consumer.committed(events_0) is None, "a refused commit stores nothing"
        consumer.commit({events_0: OffsetAndMetadata(10, "x" * 4096)})
        assert consumer.committed(events_0) == 10
    assert OFFSETS_TOPIC in admin.list_topics(), "the broker made it for the first commit"
    with pytest.raises(InvalidTopicError, match="cannot be deleted"):
        admin.delete_topic(OFFSETS_TOPIC)
    with pytest.raises(InvalidTopicError, match="cannot be given partitions"):
        admin.add_partitions(OFFSETS_TOPIC, 60)
    deleted = subprocess.run([sys.executable, "-m", "shmlog", "topics", "delete", OFFSETS_TOPIC,
                              "--data-dir", data_dir], capture_output=True, text=True,
                             timeout=120)
    assert deleted.returncode == 1
    assert "internal topic" in deleted.stderr
    assert OFFSETS_TOPIC in admin.list_topics()
    assert Admin(data_dir).list_consumer_group_offsets("tool") == {("events", 0): (10, "x" * 4096)}


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_topic_deleted_under_a_group_leaves_the_assignment_quietly(data_dir, strategy):
    """Kafka's behaviour for a subscription: the broker rebalances the group when a
    subscribed topic is deleted, its partitions go with the next assignment, and
    the application sees no error; it goes on consuming and committing the rest.
    (A cooperative member goes on reading what it holds during the rebalance, so
    it reads the deleted partitions after their rows went to a new topic.)"""
    admin = Admin(data_dir)
    admin.create_topic("doomed", partitions=2)
    with Producer(data_dir) as producer:
        for index in range(10):
            producer.send("doomed", b"d%d" % index, partition=index % 2)
        producer.flush(timeout=30)
    # A long session: the broker's first topic deletion may stall it for seconds on
    # a loaded machine, and this test is about the rebalance, not about expiry.
    with Consumer(bootstrap=data_dir, group_id="survivor", auto_commit_interval_ms=100,
                  partition_assignment_strategy=[strategy],
                  **{**GROUP_SETTINGS, "session_timeout_ms": 60_000}) as consumer:
        consumer.subscribe(["events", "doomed"])
        assert len(consume_all(consumer, 50)) == 50
        admin.delete_topic("doomed")
        admin.create_topic("newcomer", partitions=2)        # takes the freed rows
        with Producer(data_dir) as producer:
            for index in range(8):
                producer.send("events", b"late%d" % index, partition=index % 4)
                producer.send("newcomer", b"n%d" % index, partition=index % 2)
            producer.flush(timeout=30)
        events = {TopicPartition("events", partition) for partition in range(4)}
        later = []
        deadline = time.monotonic() + WAIT_S
        while consumer.assignment() != events or len(later) < 8:
            assert time.monotonic() < deadline, "the deleted topic's partitions stayed"
            later += [record for batch in consumer.poll(timeout_ms=50).values()
                      for record in batch]
        assert sorted(record.value for record in later) == sorted(b"late%d" % n for n in range(8))
        # A cooperative rebalance takes two generations; a commit that meets the
        # second is refused, and the application polls and commits again (Kafka's way).
        while True:
            try:
                consumer.commit()
                break
            except CommitFailedError:
                assert time.monotonic() < deadline, "no commit went through"
                consumer.poll(timeout_ms=50)
        assert {partition: consumer.committed(partition)
                for partition in consumer.assignment()} == \
            {TopicPartition("events", p): 12 for p in range(4)}
