"""DeleteRecords: Kafka's rules one per test (``delete_records``), the log's side
(segments below the new start deleted, the start never moving back, surviving a
restart), and a broker core's ``delete_records`` request.

Method: the rules with plain numbers; a real PartitionLog in a temporary directory
with small segments; a real BrokerCore driven in-process (``helpers.ask``), its
partition read back through a real PartitionReader (another process's view: the
state table's row).
"""

from __future__ import annotations

import json

import pytest

from helpers import ask, values_batch
from shmlog.client.reader import PartitionReader
from shmlog.common.errors import (
    LocalProtocolError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from shmlog.record.records import encode_batch
from shmlog.server.broker import BrokerConfig, BrokerCore
from shmlog.shm.state import PartitionStateTable, topic_key
from shmlog.storage import delete_records as deletion

SMALL = {"segment.bytes": 4096}


# --- the rules ---------------------------------------------------------------------------

def test_minus_one_means_the_high_watermark():
    """Kafka's ``Partition.deleteRecordsOnLeader``: DeleteRecordsRequest.HIGH_WATERMARK."""
    assert deletion.delete_target(-1, log_start_offset=3, high_watermark=40) == (None, 40)


def test_an_offset_past_the_high_watermark_is_out_of_range():
    """Kafka's ``Log.maybeIncrementLogStartOffset``: above the high watermark throws
    OffsetOutOfRangeException."""
    assert deletion.delete_target(41, log_start_offset=3, high_watermark=40) == \
        (deletion.OFFSET_OUT_OF_RANGE, 41)
    assert deletion.delete_target(40, log_start_offset=3, high_watermark=40) == (None, 40)


def test_a_negative_offset_other_than_minus_one_is_out_of_range():
    """Kafka's ``Partition.deleteRecordsOnLeader``: convertedOffset < 0 throws
    OffsetOutOfRangeException."""
    assert deletion.delete_target(-2, log_start_offset=0, high_watermark=40)[0] == \
        deletion.OFFSET_OUT_OF_RANGE


def test_the_log_start_never_moves_back():
    """Kafka's ``Log.maybeIncrementLogStartOffset`` only increments."""
    assert deletion.delete_target(2, log_start_offset=10, high_watermark=40) == (None, 10)


@pytest.mark.parametrize("leader, followers, low", [
    (10, [], 10), (10, [10, 7], 7), (10, [12], 10), (10, [deletion.UNKNOWN_OFFSET], -1)])
def test_the_low_watermark_is_the_lowest_log_start(leader, followers, low):
    """Kafka's ``Partition.lowWatermarkIfLeader``: the minimum over the leader and its
    live remote replicas (a replica not heard from is UnknownOffset)."""
    assert deletion.low_watermark(leader, followers) == low


@pytest.mark.parametrize("name, error_class", [
    (deletion.OFFSET_OUT_OF_RANGE, OffsetOutOfRangeError),
    (deletion.NOT_LEADER_OR_FOLLOWER, NotLeaderOrFollowerError),
    (deletion.UNKNOWN_TOPIC_OR_PARTITION, UnknownTopicOrPartitionError),
    (deletion.REQUEST_TIMED_OUT, RequestTimedOutError)])
def test_a_refused_partition_becomes_its_typed_error(name, error_class):
    error = deletion.partition_error(deletion.answer("t", 1, 5, -1, name, "why"))
    assert isinstance(error, error_class) and "t-1" in str(error) and "why" in str(error)
    assert deletion.partition_error(deletion.answer("t", 1, 5, 5)) is None


def test_the_offset_json_file_is_kafkas():
    text = json.dumps({"partitions": [{"topic": "a", "partition": 0, "offset": 5},
                                      {"topic": "b", "partition": 2, "offset": -1}],
                       "version": 1})
    assert deletion.parse_offset_json(text) == [("a", 0, 5), ("b", 2, -1)]
    for bad in ["{", "[]", '{"partitions": [{"topic": "a", "partition": "0", "offset": 1}]}',
                '{"partitions": [], "version": 2}',
                '{"partitions": [{"topic": "a", "partition": 0, "offset": 1},'
                ' {"topic": "a", "partition": 0, "offset": 2}]}']:
        with pytest.raises(LocalProtocolError):
            deletion.parse_offset_json(bad)


# --- the log -----------------------------------------------------------------------------

def _filled(open_log, batches: int = 40):
    partition_log = open_log(**SMALL)
    for seed in range(batches):
        partition_log.append(values_batch(5, seed, size=100))
    assert len(partition_log.segments) > 3
    return partition_log


def test_segments_wholly_below_the_new_start_are_deleted(open_log):
    partition_log = _filled(open_log)
    middle = partition_log.segments[2]
    target = middle.base_offset + 1
    deleted = partition_log.advance_log_start_offset(target)
    assert deleted and max(deleted) < middle.base_offset
    assert partition_log.segments[0].base_offset == middle.base_offset
    assert partition_log.log_start_offset == target
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(target - 1)
    assert partition_log.read(target).data.size > 0
    assert partition_log.advance_log_start_offset(target) == [], "the same start: nothing"
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.advance_log_start_offset(target - 1)


def test_the_new_start_survives_a_restart(open_log, tmp_path):
    partition_log = _filled(open_log)
    end = partition_log.log_end_offset
    target = partition_log.segments[1].base_offset + 2      # inside a kept segment
    partition_log.advance_log_start_offset(target)
    partition_log.close()
    reopened = open_log(**SMALL)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (target, end)
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(target - 1)


def test_deleting_up_to_the_log_end_keeps_an_empty_readable_end(open_log):
    partition_log = _filled(open_log)
    end = partition_log.log_end_offset
    partition_log.advance_log_start_offset(end)
    assert len(partition_log.segments) == 1
    assert partition_log.read(end).data.size == 0
    partition_log.append(values_batch(2, 99))
    assert partition_log.read(end).next_offset == end + 2


# --- a broker's request ------------------------------------------------------------------

@pytest.fixture
def core(data_dir):
    core = BrokerCore(BrokerConfig(data_dir=data_dir))
    try:
        yield core
    finally:
        core.close()


def test_a_broker_deletes_records_and_its_readers_see_the_new_start(core, data_dir):
    ask(core, "create_topic", name="events", partitions=2, config=SMALL)
    for number in range(30):
        core.host.append("events", 0, encode_batch([b"%03d" % number * 60]))
    reply = ask(core, "delete_records", partitions=[["events", 0, 12], ["events", 1, -1],
                                                   ["events", 5, 1], ["nope", 0, 1]])
    entries = reply["partitions"]
    assert [entry["error"] for entry in entries] == \
        [None, None, deletion.UNKNOWN_TOPIC_OR_PARTITION, deletion.UNKNOWN_TOPIC_OR_PARTITION]
    assert (entries[0]["offset"], entries[0]["low_watermark"]) == (12, 12)
    assert (entries[1]["offset"], entries[1]["low_watermark"]) == (0, 0)
    past = ask(core, "delete_records", partitions=[["events", 0, 31]])["partitions"][0]
    assert past["error"] == deletion.OFFSET_OUT_OF_RANGE
    back = ask(core, "delete_records", partitions=[["events", 0, 3]])["partitions"][0]
    assert (back["error"], back["low_watermark"]) == (None, 12), "the start never moves back"
    hosted = core.host.partition("events", 0)
    table = PartitionStateTable.attach(core.host.table_name)      # as a consumer maps it
    reader = PartitionReader(hosted.log.directory, table, hosted.row,
                             topic_key=topic_key(core.host.logs.describe_topic(
                                 "events").topic_id), partition=0)
    try:
        with pytest.raises(OffsetOutOfRangeError):
            reader.read(11)
        assert reader.read(12).data.size > 0
    finally:
        reader.close()
        table.close()
    offsets = ask(core, "list_offsets", topic="events")["partitions"][0]
    assert (offsets["log_start_offset"], offsets["log_end_offset"]) == (12, 30)
    with pytest.raises(LocalProtocolError):
        ask(core, "delete_records", partitions=[["events", 0]])
