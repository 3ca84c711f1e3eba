"""The Kafka tools a user reaches for, as the ``shmlog`` command gives them, against a
real broker: ``offsets`` (kafka-get-offsets), ``delete-records``
(kafka-delete-records, its JSON file and a single partition), ``log-dirs``
(kafka-log-dirs), ``topics describe`` (per-partition offsets and sizes, the
overrides with their sources, ``--all``), ``groups describe --all-groups /
--members / --state``, ``groups reset-offsets --to-datetime / --by-duration``,
``--version``; and ``Admin.delete_records`` in kafka-python's shape.

Method: one broker process for the module (the tests use topics and groups of their
own, so they do not disturb each other); the tools run as child processes
(``python -m shmlog``), as from a shell; JSON output is parsed. Every wait is
bounded; the broker's shared memory is removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import unlink_shared_memory
from shmlog import Admin, Broker, Consumer, Producer
from shmlog.client.consumer import TopicPartition
from shmlog.common.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from shmlog.common.iso8601 import datetime_ms

DEADLINE_S = 120
WAIT_S = 30
GROUP_SETTINGS = {"session_timeout_ms": 3_000, "heartbeat_interval_ms": 100,
                  "auto_offset_reset": "earliest"}
SMALL_SEGMENTS = {"segment.bytes": 4096}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tools") / "data")
    try:
        with Broker(path, group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=500):
            yield path
    finally:
        unlink_shared_memory(path)


def shmlog(data_dir: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlog", *arguments, "--data-dir", data_dir],
                          capture_output=True, text=True, timeout=DEADLINE_S)


def produce(data_dir: str, topic: str, partition: int, count: int, *, size: int = 10,
            timestamp_ms=None) -> None:
    with Producer(data_dir) as producer:
        for number in range(count):
            stamp = timestamp_ms(number) if timestamp_ms else None
            producer.send(topic, b"%0*d" % (size, number), partition=partition,
                          timestamp_ms=stamp)


def test_the_version_is_the_packages(data_dir):
    from importlib import metadata
    shown = subprocess.run([sys.executable, "-m", "shmlog", "--version"], capture_output=True,
                           text=True, timeout=DEADLINE_S)
    assert shown.returncode == 0 and shown.stdout.strip() == f"shmlog {metadata.version('shmlog')}"


def test_offsets_prints_topic_partition_offset_lines(data_dir):
    Admin(data_dir).create_topic("clicks", 3)
    base = 1_700_000_000_000
    for partition, count in enumerate((5, 2, 0)):
        produce(data_dir, "clicks", partition, count, timestamp_ms=lambda n: base + n * 1000)
    latest = shmlog(data_dir, "offsets", "clicks")
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.split() == ["clicks:0:5", "clicks:1:2", "clicks:2:0"]
    earliest = shmlog(data_dir, "offsets", "clicks:1-", "--time", "-2")
    assert earliest.stdout.split() == ["clicks:1:0", "clicks:2:0"]
    at = shmlog(data_dir, "offsets", "clic.*:0,clicks:2", "--time", str(base + 2500))
    assert at.stdout.splitlines() == ["clicks:0:3", "clicks:2:"], "none found: empty"
    as_json = json.loads(shmlog(data_dir, "offsets", "clicks:-1", "--json").stdout)
    assert as_json == [{"topic": "clicks", "partition": 0, "offset": 5}]
    assert shmlog(data_dir, "offsets", "clicks:x").returncode == 1
    unmatched = shmlog(data_dir, "offsets", "nothing-.*")
    assert unmatched.returncode == 1 and "could not match" in unmatched.stderr


def test_delete_records_from_kafkas_json_file_and_for_one_partition(data_dir, tmp_path):
    Admin(data_dir).create_topic("audit", 2, SMALL_SEGMENTS)
    produce(data_dir, "audit", 0, 200, size=100)
    produce(data_dir, "audit", 1, 10)
    segments_before = _log_dirs(data_dir, "audit")["audit-0"]["segmentCount"]
    offsets_file = tmp_path / "offsets.json"
    offsets_file.write_text(json.dumps({"partitions": [
        {"topic": "audit", "partition": 0, "offset": 150},
        {"topic": "audit", "partition": 1, "offset": -1}], "version": 1}))
    deleted = shmlog(data_dir, "delete-records", "--offset-json-file", str(offsets_file))
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines() == [
        "Executing records delete operation", "Records delete operation completed:",
        "partition: audit-0\tlow_watermark: 150", "partition: audit-1\tlow_watermark: 10"]
    assert shmlog(data_dir, "offsets", "audit", "--time", "-2").stdout.split() == \
        ["audit:0:150", "audit:1:10"]
    after = _log_dirs(data_dir, "audit")["audit-0"]
    assert after["logStartOffset"] == 150 and after["segmentCount"] < segments_before
    past = shmlog(data_dir, "delete-records", "--topic", "audit", "--partition", "0",
                  "--offset", "201")
    assert past.returncode == 1 and "OFFSET_OUT_OF_RANGE" in past.stdout, past.stdout
    single = shmlog(data_dir, "delete-records", "--topic", "audit", "--partition", "0",
                    "--offset", "160", "--json")
    assert single.returncode == 0, single.stderr
    assert [(entry["low_watermark"], entry["error"]) for entry in json.loads(single.stdout)] \
        == [(160, None)]
    assert shmlog(data_dir, "delete-records", "--topic", "audit").returncode == 2


def test_admin_delete_records_has_kafka_pythons_shape(data_dir):
    admin = Admin(data_dir)
    admin.create_topic("ledger", 1)
    produce(data_dir, "ledger", 0, 8)
    partition = TopicPartition("ledger", 0)
    assert admin.delete_records({partition: 3}) == \
        {partition: {"partition_index": 0, "low_watermark": 3, "error_code": 0}}
    assert admin.delete_records({partition: -1})[partition]["low_watermark"] == 8
    with pytest.raises(OffsetOutOfRangeError):
        admin.delete_records({partition: 9})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_records({TopicPartition("ledger", 4): 0})
    with Consumer(bootstrap=data_dir, auto_offset_reset="none") as consumer:
        consumer.assign([partition])
        consumer.seek(partition, 2)
        with pytest.raises(OffsetOutOfRangeError):
            consumer.poll(timeout_ms=1000)


def _log_dirs(data_dir: str, topics: str) -> dict:
    shown = shmlog(data_dir, "log-dirs", "--describe", "--topic-list", topics, "--json")
    assert shown.returncode == 0, shown.stderr
    described = json.loads(shown.stdout)
    assert described["version"] == 1 and len(described["brokers"]) == 1
    [log_dir] = described["brokers"][0]["logDirs"]
    assert log_dir["error"] is None and log_dir["logDir"].startswith(data_dir)
    return {entry["partition"]: entry for entry in log_dir["partitions"]}


def test_log_dirs_shows_disk_use_per_partition(data_dir):
    Admin(data_dir).create_topic("metrics", 2)
    produce(data_dir, "metrics", 1, 20)
    partitions = _log_dirs(data_dir, "metrics")
    assert sorted(partitions) == ["metrics-0", "metrics-1"]
    assert partitions["metrics-1"]["size"] > partitions["metrics-0"]["size"] == 0
    assert (partitions["metrics-1"]["logEndOffset"], partitions["metrics-1"]["offsetLag"],
            partitions["metrics-1"]["segmentCount"]) == (20, 0, 1)
    text = shmlog(data_dir, "log-dirs", "--topic-list", "metrics")
    assert text.returncode == 0, text.stderr
    rows = [line.split() for line in text.stdout.splitlines()[2:]]
    assert [row[:2] + row[3:6] for row in rows] == [["metrics", "0", "1", "0", "0"],
                                                    ["metrics", "1", "1", "0", "20"]]


def test_topics_describe_shows_offsets_sizes_and_overridden_configs(data_dir):
    Admin(data_dir).create_topic("orders", 2, {"retention.ms": 60_000})
    produce(data_dir, "orders", 0, 4)
    described = shmlog(data_dir, "topics", "describe", "orders")
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert "PartitionCount: 2" in lines[0] and lines[0].endswith("Configs: retention.ms=60000")
    offsets = [line for line in lines if "LogStartOffset" in line]
    assert "Partition: 0\tLogStartOffset: 0\tLogEndOffset: 4\tHighWatermark: 4" in offsets[0]
    assert [line.strip() for line in lines if "Config: " in line] == \
        ["Config: retention.ms=60000\tSource: DYNAMIC_TOPIC_CONFIG"]
    every = shmlog(data_dir, "topics", "describe", "orders", "--all").stdout
    assert "Config: segment.bytes=1073741824\tSource: DEFAULT_CONFIG" in every
    as_json = json.loads(shmlog(data_dir, "topics", "describe", "orders", "--json").stdout)
    assert as_json["configs"] == [{"name": "retention.ms", "value": 60000,
                                   "source": "DYNAMIC_TOPIC_CONFIG"}]
    assert [entry["log_end_offset"] for entry in as_json["partitions"]] == [4, 0]
    assert as_json["partitions"][0]["size"] > 0


def _assigned(consumer: Consumer) -> None:
    deadline = time.monotonic() + WAIT_S
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(timeout_ms=100)
    assert consumer.assignment()


def test_groups_describe_members_state_and_all_groups(data_dir):
    Admin(data_dir).create_topic("tasks", 2)
    Admin(data_dir).alter_consumer_group_offsets("idle-group", {("tasks", 0): 0})
    with Consumer(bootstrap=data_dir, group_id="workers", client_id="worker-1",
                  **GROUP_SETTINGS) as consumer:
        consumer.subscribe(["tasks"])
        _assigned(consumer)
        members = shmlog(data_dir, "groups", "describe", "workers", "--members")
        assert members.returncode == 0, members.stderr
        header, row = members.stdout.splitlines()
        assert header.split() == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                                  "ASSIGNMENT"]
        assert row.split()[0] == "workers" and row.split()[2:] == \
            [os.uname().nodename, "worker-1", "2", "tasks(0,1)"]
        state = shmlog(data_dir, "groups", "describe", "--all-groups", "--state")
        rows = {line.split()[0]: line.split() for line in state.stdout.splitlines()[1:]}
        assert rows["workers"][-3:] == ["range", "Stable", "1"]
        assert rows["idle-group"][-2:] == ["Empty", "0"]
        every = json.loads(shmlog(data_dir, "groups", "describe", "--all-groups",
                                  "--json").stdout)
        assert {"workers", "idle-group"} <= {entry["group_id"] for entry in every}
        offsets = shmlog(data_dir, "groups", "describe", "--all-groups").stdout
        assert "Group workers: Stable" in offsets and "Group idle-group: Empty" in offsets
    idle = shmlog(data_dir, "groups", "describe", "idle-group", "--members")
    assert "Consumer group 'idle-group' has no active members." in idle.stdout
    assert shmlog(data_dir, "groups", "describe").returncode == 2
    assert shmlog(data_dir, "groups", "describe", "workers", "--all-groups").returncode == 2


def test_reset_offsets_to_a_datetime_and_by_a_duration(data_dir):
    Admin(data_dir).create_topic("history", 1)
    start = datetime_ms("2026-11-25T00:00:00.000Z")
    produce(data_dir, "history", 0, 10, timestamp_ms=lambda n: start + n * 60_000)
    Admin(data_dir).alter_consumer_group_offsets("replay", {("history", 0): 0})
    to_datetime = shmlog(data_dir, "groups", "reset-offsets", "replay", "--topic", "history",
                         "--to-datetime", "2026-11-25T00:05:00.000Z", "--json")
    assert to_datetime.returncode == 0, to_datetime.stderr
    assert json.loads(to_datetime.stdout)["offsets"][0]["new"] == 5
    Admin(data_dir).create_topic("recent", 1)
    now = round(time.time() * 1000)
    produce(data_dir, "recent", 0, 6,
            timestamp_ms=lambda n: now - 3_600_000 if n < 4 else now - 60_000)
    Admin(data_dir).alter_consumer_group_offsets("replay", {("recent", 0): 0})
    by_duration = shmlog(data_dir, "groups", "reset-offsets", "replay", "--topic", "recent",
                         "--by-duration", "PT10M", "--execute")
    assert by_duration.returncode == 0, by_duration.stderr
    assert Admin(data_dir).list_consumer_group_offsets("replay")[("recent", 0)][0] == 4
    bad = shmlog(data_dir, "groups", "reset-offsets", "replay", "--by-duration", "10 minutes")
    assert bad.returncode == 1 and "PnDTnHnMnS" in bad.stderr


def test_the_new_log_start_survives_a_broker_killed_and_restarted(tmp_path):
    path = str(tmp_path / "data")
    try:
        broker = Broker(path).start()
        try:
            Admin(path).create_topic("kept", 1, SMALL_SEGMENTS)
            produce(path, "kept", 0, 100, size=100)
            assert shmlog(path, "delete-records", "--topic", "kept", "--partition", "0",
                          "--offset", "70").returncode == 0
        finally:
            broker.process.kill()                 # kill -9: no clean close
            broker.process.wait(timeout=DEADLINE_S)
        with Broker(path):
            assert shmlog(path, "offsets", "kept", "--time", "-2").stdout.split() == \
                ["kept:0:70"]
            assert shmlog(path, "offsets", "kept").stdout.split() == ["kept:0:100"]
    finally:
        unlink_shared_memory(path)
