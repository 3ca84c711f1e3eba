"""The seams of the broker: ``BrokerCore`` is a partition host, a producer registry
and a list of services (``shmlog.broker.service``). A core built so answers every request
the broker has always answered, each from exactly one service; a service defined
here, outside the broker, plugs in its requests, its deadline and its held-back
replies without a change to ``BrokerCore``; offset commits are appended through the
partition host and its appender (the ``__consumer_offsets`` partition's row in the
state table moves, and a reader of another mapping of the table reads the commit),
and a refused internal append is a typed error.

Retention deletes only below a partition's high watermark (held back through the
appender's external policy, as replication will).

A producer's ring registered with acks=-1 ("all") awaits the high watermark, one with
0 or 1 does not, a registration again says it anew, and a ring adopted without its
producer's word awaits it (the safe side for acks=all).

Method: a ``BrokerCore`` on a temporary data directory, driven as ``serve`` drives it
(``handle`` a request frame, ``run_once`` for the drain and the deadlines,
``take_replies`` for what was held back), with a real producer ring in /dev/shm and
a ``PartitionReader`` on a second attachment of the state table. Time is the
broker's clock; the test waits for a deadline 200 ms ahead, with a bound.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from helpers import ask
from shmlog.broker.appender import HighWatermarkPolicy
from shmlog.broker.group_offsets import parse_offset_record
from shmlog.broker.partition_host import ROWS_FILE, PartitionHost
from shmlog.broker.producer_service import ProducerService
from shmlog.broker.service import Service
from shmlog.client.reader import PartitionReader
from shmlog.common import limits
from shmlog.common.errors import LocalProtocolError, RecordTooLargeError
from shmlog.groups import OFFSETS_TOPIC, offsets_partition
from shmlog.protocol.control import encode_request
from shmlog.record.records import decode_records, encode_batch, now_ms
from shmlog.ring import Ring
from shmlog.server.broker import BrokerConfig, BrokerCore
from shmlog.shm.state import PartitionStateTable, topic_key

# Every request type the broker answered before it was cut into services, and the
# Kafka tools' requests added since (DeleteRecords, DescribeLogDirs).
BROKER_REQUESTS = {
    "ping", "metadata", "create_topic", "create_topics", "delete_topic", "list_topics",
    "describe_topic", "add_partitions", "alter_topic_config", "register_producer",
    "unregister_producer",
    "init_producer_id", "offset_for_timestamp", "list_offsets", "join_group", "sync_group",
    "heartbeat", "leave_group", "commit_offsets", "fetch_offsets", "list_groups",
    "describe_group", "delete_group", "delete_records", "describe_log_dirs",
    "stats", "init_transactions", "add_partitions_to_txn", "add_offsets_to_txn",
    "txn_offset_commit", "end_txn", "describe_transactions", "list_transactions",
    "describe_producers", "find_hanging_transactions", "abort_hanging_transaction"}
# Answered by the core itself, not by a service.
CORE_REQUESTS = {"ping", "describe_broker_config"}
OFFSETS_PARTITIONS = 3
RING_CAPACITY = 1 << 16
DEADLINE_AHEAD_MS = 200
# The periodic tasks' intervals: far later than the test's own deadline, however slow
# the machine (the flush check is due every second by default).
TASK_INTERVAL_MS = 3_600_000
WAIT_S = 10.0


@pytest.fixture
def core(data_dir):
    core = BrokerCore(BrokerConfig(data_dir=data_dir,
                                   offsets_topic_num_partitions=OFFSETS_PARTITIONS,
                                   flush_check_interval_ms=TASK_INTERVAL_MS,
                                   liveness_check_interval_ms=TASK_INTERVAL_MS,
                                   retention_check_interval_ms=TASK_INTERVAL_MS,
                                   cleaner_backoff_ms=TASK_INTERVAL_MS))
    try:
        yield core
    finally:
        core.close()


class EndOffsetAt:
    """A service of the test's own: ``end_offset_at(topic, partition, at_ms)`` is
    answered at ``at_ms`` (not before) with the partition's log end offset then."""

    def __init__(self, host: PartitionHost, context):
        self.host = host
        self.context = context
        self.waiting: list[tuple[int, object, str, int]] = []
        self.replies: list = []

    def handlers(self) -> dict:
        return {"end_offset_at": self.end_offset_at}

    def end_offset_at(self, topic, partition, at_ms):
        self.host.partition(topic, partition)           # an unknown one is refused now
        self.waiting.append((at_ms, self.context.ticket, topic, partition))
        return None

    def tick(self, now: int) -> None:
        due = [waiting for waiting in self.waiting if waiting[0] <= now]
        self.waiting = [waiting for waiting in self.waiting if waiting[0] > now]
        self.replies += [(ticket, {"end_offset": self.host.partition(topic, partition)
                                   .log.log_end_offset})
                         for _, ticket, topic, partition in due]

    def next_deadline(self) -> int | None:
        return min((waiting[0] for waiting in self.waiting), default=None)

    def take_replies(self) -> list:
        replies, self.replies = self.replies, []
        return replies

    def pending_tickets(self) -> list:
        return [ticket for _, ticket, _, _ in self.waiting]


def test_the_services_answer_every_request_of_the_broker_each_once(core):
    assert set(core.handlers()) == BROKER_REQUESTS | CORE_REQUESTS
    served = [name for service in core.services for name in service.handlers()]
    assert sorted(served) == sorted(BROKER_REQUESTS - CORE_REQUESTS)
    assert all(isinstance(service, Service) for service in core.services)


def test_a_core_made_of_services_serves_topics_producers_and_offsets(core):
    created = ask(core, "create_topic", name="events", partitions=2)
    rows = [partition["row"] for partition in created["partitions"]]
    assert rows == [core.host.partition("events", index).row for index in range(2)]
    assert ask(core, "list_topics")["topics"] == ["events"]
    with pytest.raises(LocalProtocolError, match="must be named under"):
        ask(core, "register_producer", ring="elsewhere")
    ring = Ring.create(core.prefix + "-test-producer", RING_CAPACITY)
    try:
        registered = ask(core, "register_producer", ring=ring.name)
        assert registered["index"] >= 0 and registered["producer_epoch"] == 0
        destination = core.host.appender.destination("events", 1)
        entry = ring.put(destination, encode_batch([b"a", b"b", b"c"]), timeout_ms=0)
        core.host.table.appender_doorbell.ring()
        core.run_once()
        assert ring.result(entry)[0] == 0                       # its base offset
        ends = [partition["log_end_offset"]
                for partition in ask(core, "list_offsets", topic="events")["partitions"]]
        assert ends == [0, 3]
        # A transactional producer registering again names its id (learned by a
        # cluster member, whose peers' coordinators verify its batches).
        learned = []
        service = ProducerService(core.producers, lambda *named: learned.append(named))
        again = service.register_producer(ring=ring.name, transactional_id="t", producer_id=7)
        assert again["index"] == registered["index"] and learned == [(7, "t")]
        for wrong in ({"transactional_id": ""}, {"transactional_id": "t"},
                      {"transactional_id": "t" * (limits.TRANSACTIONAL_ID_LENGTH_MAX + 1),
                       "producer_id": 7}):
            with pytest.raises(LocalProtocolError):
                service.register_producer(ring=ring.name, **wrong)
        renewed = ask(core, "init_producer_id", ring=ring.name)
        assert renewed["producer_id"] != registered["producer_id"]
        assert ask(core, "unregister_producer", ring=ring.name) == {}
        assert ring.name not in core.producers.rings
    finally:
        ring.unlink()


def test_create_topics_creates_many_in_one_request_and_answers_per_topic(core):
    heard = []
    core.host.when_topics_change(heard.append)
    answer = ask(core, "create_topics", topics=[
        {"name": "a", "partitions": 3}, {"name": "b"}, {"name": "a"},
        {"name": "bad name!"}, {"name": OFFSETS_TOPIC}, {"name": "c", "partitions": 0},
        {"name": "d", "replication_factor": 2}, {"name": "e", "config": {"nope": 1}},
        {"name": "f", "partitions": 2, "config": {"retention.ms": 1000}, "extra": 1}])
    entries = answer["topics"]
    assert [entry["ok"] for entry in entries] == [True, True] + [False] * 7
    assert [len(entry["partitions"]) for entry in entries[:2]] == [3, 1]
    assert [entry["error"] for entry in entries[2:]] == [
        "TopicExistsError", "InvalidTopicError", "InternalTopicError",
        "InvalidPartitionsError", "InvalidReplicationFactorError", "InvalidConfigError",
        "LocalProtocolError"]
    assert ask(core, "list_topics")["topics"] == ["a", "b"]
    assert len(heard) == 1, "the listeners hear of one request's topics once"
    rows = [partition["row"] for entry in entries[:2] for partition in entry["partitions"]]
    assert rows == [core.host.partition(topic, index).row
                    for topic, count in (("a", 3), ("b", 1)) for index in range(count)]
    with open(core.host._rows_path) as saved:
        assert json.load(saved) == {"a/0": rows[0], "a/1": rows[1], "a/2": rows[2],
                                    "b/0": rows[3]}
    with pytest.raises(LocalProtocolError, match="topics"):
        ask(core, "create_topics", topics="a")


def test_partitions_keep_their_rows_across_a_restart(tmp_path):
    data = str(tmp_path / "data")

    def rows_of(host):
        return {f"{hosted.topic}/{hosted.partition}": hosted.row for hosted in host.partitions()}

    host = PartitionHost(data, partitions_max=16, cleaner_dedupe_buffer_size=1 << 20)
    try:
        outcomes = host.create_topics([("a", 2, {}), ("b", 3, {}), ("a", 1, {})])
        assert type(outcomes[2]).__name__ == "TopicExistsError"
        host.delete_topic("a")
        host.create_topic("c", 1, {})                # takes a freed row
        host.add_partitions("b", 4)
        rows = rows_of(host)
    finally:
        host.close()
    assert sorted(rows) == ["b/0", "b/1", "b/2", "b/3", "c/0"]
    with open(os.path.join(data, ROWS_FILE)) as saved:
        assert json.load(saved) == rows
    host = PartitionHost(data, partitions_max=16, cleaner_dedupe_buffer_size=1 << 20)
    try:
        assert rows_of(host) == rows
    finally:
        host.close()


def test_a_service_from_outside_plugs_in_its_requests_and_its_deadline(core):
    core.topics.create_topic("events", 1)
    outside = core.add_service(EndOffsetAt(core.host, core.context))
    assert "end_offset_at" in core.handlers()
    at_ms = now_ms() + DEADLINE_AHEAD_MS
    assert core.handle("later", encode_request("end_offset_at", topic="events", partition=0,
                                               at_ms=at_ms)) is None
    assert core.next_deadline() == at_ms                  # the scheduler's tasks come later
    assert core.pending_tickets() == ["later"]
    core.host.append("events", 0, encode_batch([b"x"]))
    core.run_once()
    if now_ms() < at_ms:                                  # the whole turn came before it
        assert core.take_replies() == []
    deadline = time.monotonic() + WAIT_S
    while now_ms() <= at_ms:
        assert time.monotonic() < deadline
        time.sleep(DEADLINE_AHEAD_MS / 10_000)
    core.run_once(requests_waiting=True)                  # a request waits: no tick
    assert core.take_replies() == []
    core.run_once()
    assert core.take_replies() == [("later", b'{"version": 1, "ok": true, "end_offset": 1}')]
    assert outside.next_deadline() is None and core.pending_tickets() == []


def test_a_service_cannot_take_a_request_type_already_served(core):
    class Shadow(EndOffsetAt):
        def handlers(self) -> dict:
            return {"metadata": self.end_offset_at}

    with pytest.raises(AssertionError, match="metadata"):
        core.add_service(Shadow(core.host, core.context))
    assert core.handlers()["metadata"] == core.topics.metadata


def test_an_offset_commit_is_appended_through_the_host_and_read_by_a_reader(core):
    core.topics.create_topic("events", 1)
    core.host.append("events", 0, encode_batch([b"a", b"b"]))
    consumers_told = core.host.table.consumer_doorbell.sequence
    assert ask(core, "commit_offsets", group_id="g", offsets=[["events", 0, 2, "m"]]) == {}
    hosted = core.host.partition(OFFSETS_TOPIC, offsets_partition("g", OFFSETS_PARTITIONS))
    row = core.host.table.snapshot(hosted.row)
    assert (row.log_end_offset, row.high_watermark) == (1, 1)
    assert core.host.table.consumer_doorbell.sequence != consumers_told
    table = PartitionStateTable.attach(core.host.table_name)      # as a consumer maps it
    reader = PartitionReader(hosted.log.directory, table, hosted.row,
                             topic_key=topic_key(core.host.logs.describe_topic(
                                 OFFSETS_TOPIC).topic_id), partition=hosted.partition)
    try:
        records = decode_records(reader.read(0).data, start_offset=0)
        group_id, topic, partition, committed = parse_offset_record(records[0].key,
                                                                    records[0].value)
    finally:
        reader.close()
        table.close()
    assert (group_id, topic, partition, committed.offset, committed.metadata) == \
        ("g", "events", 0, 2, "m")
    assert ask(core, "fetch_offsets", group_id="g")["offsets"] == [["events", 0, 2, "m"]]


def test_an_internal_append_the_log_refuses_is_a_typed_error(core):
    core.topics.create_topic("small", 1, {"max.message.bytes": 1024})
    hosted = core.host.partition("small", 0)
    with pytest.raises(RecordTooLargeError):
        core.host.append("small", 0, encode_batch([np.zeros(4096, np.uint8).tobytes()]))
    row = core.host.table.snapshot(hosted.row)
    assert (row.log_end_offset, row.high_watermark) == (0, 0)
    assert core.host.append("small", 0, encode_batch([b"fits"])) == 0


def test_retention_deletes_only_segments_below_the_high_watermark(core):
    """Kafka's rule: a segment holding offsets at or above the high watermark stays,
    however old, so retention never deletes what followers may not have yet."""
    core.topics.create_topic("old", 1, {"retention.ms": 1, "segment.bytes": 1024})
    hosted = core.host.partition("old", 0)
    core.host.appender.set_high_watermark_policy(hosted.row, HighWatermarkPolicy.EXTERNAL)
    for index in range(6):                    # a few segments of ~300-byte batches
        core.host.append("old", 0, encode_batch([bytes([index]) * 300]))
    segments_before = len(hosted.log.segments)
    assert segments_before > 2
    core.host.appender.advance_high_watermark(hosted.row, 2)
    core.host.apply_retention(now_ms() + 60_000)
    assert hosted.log.log_start_offset <= 2, "a segment at or above the high watermark went"
    assert hosted.log.log_start_offset > 0, "segments below the high watermark stay"
    core.host.appender.advance_high_watermark(hosted.row, hosted.log.log_end_offset)
    core.host.apply_retention(now_ms() + 60_000)
    assert len(hosted.log.segments) == 1              # the active one always stays


def test_a_ring_awaits_the_high_watermark_as_its_producer_acks_say(core):
    ask(core, "create_topic", name="events")
    appender = core.host.appender
    row = appender.row_of("events", 0)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    rings = [Ring.create(core.prefix + f"-test-producer-{number}", RING_CAPACITY)
             for number in range(3)]
    try:
        strict, leader = (ask(core, "register_producer", ring=ring.name, acks=acks)["index"]
                          for ring, acks in zip(rings, (-1, 1)))
        assert [appender.awaits_high_watermark(index) for index in (strict, leader)] == \
            [True, False]
        entry = rings[0].put(appender.destination("events", 0), encode_batch([b"a"]), 0)
        core.host.table.appender_doorbell.ring()
        core.run_once()
        assert rings[0].result(entry) is None, "parked until the high watermark covers it"
        appender.advance_high_watermark(row, 1)
        assert rings[0].result(entry) == (0, -1)
        assert ask(core, "register_producer", ring=rings[0].name, acks=0)["index"] == strict
        assert not appender.awaits_high_watermark(strict)
        with pytest.raises(LocalProtocolError, match="acks"):
            ask(core, "register_producer", ring=rings[0].name, acks="all")
        core.producers.adopt_left_rings(include_alive=True)
        adopted = appender.index_of(core.producers.rings[rings[2].name][0])
        assert appender.awaits_high_watermark(adopted), "its producer's acks are unknown"
        ask(core, "register_producer", ring=rings[2].name)       # acks unsaid: 1
        assert not appender.awaits_high_watermark(adopted)
    finally:
        for ring in rings:
            ring.unlink()
