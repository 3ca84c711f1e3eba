"""Topics on disk: names, partition counts, configs, metadata, and the directory lock.

Method: a LogManager on a temporary directory; every invalid input must raise its
typed error and leave the directory unchanged; the lock is probed from a second
process, as a second broker would.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import all_records, values_batch
from shmlog import LogManager
from shmlog.common import limits
from shmlog.common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from shmlog.storage.log_manager import DataDirectoryInUseError
from shmlog.storage.topic_config import TopicConfig


@pytest.fixture
def manager(tmp_path):
    with LogManager(str(tmp_path / "data")) as logs:
        yield logs


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "with space", "slash/name",
                                  "ünïcode", "tilde~", "star*", None, 7])
def test_invalid_topic_names_are_rejected(manager, name):
    with pytest.raises(InvalidTopicError):
        manager.create_topic(name)
    assert manager.list_topics() == []


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "a" * 249, "__consumer_offsets", ".hidden"])
def test_valid_topic_names_are_accepted(manager, name):
    manager.create_topic(name)
    assert manager.list_topics() == [name]


@pytest.mark.parametrize("count", [0, -1, 10_001, 1.5, True, "3"])
def test_invalid_partition_counts_are_rejected(manager, count):
    with pytest.raises(InvalidPartitionsError):
        manager.create_topic("t", partitions=count)


@pytest.mark.parametrize("overrides, message", [
    ({"segment.bytes": 10}, "segment.bytes"),
    ({"retention.ms": -2}, "retention.ms"),
    ({"no.such.config": 1}, "unknown topic config"),
    ({"compression.type": "gzip"}, "compression.type"),
    ({"cleanup.policy": "compacted"}, "cleanup.policy"),
    ({"cleanup.policy": "compact,compact"}, "cleanup.policy"),
    ({"min.cleanable.dirty.ratio": 1.5}, "min.cleanable.dirty.ratio"),
    ({"min.cleanable.dirty.ratio": "half"}, "expected a number"),
    ({"segment.bytes": "lots"}, "expected an integer"),
    ({"max.message.bytes": 0}, "max.message.bytes"),
    ({"max.message.bytes": limits.BATCH_SIZE_MIN - 1}, "max.message.bytes"),
])
def test_invalid_configs_are_rejected(manager, overrides, message):
    with pytest.raises(InvalidConfigError, match=message):
        manager.create_topic("t", config=overrides)
    assert manager.list_topics() == []


def test_configs_accept_strings_and_keep_only_overrides():
    config = TopicConfig.from_overrides({"segment.bytes": "4096", "retention.ms": "-1"})
    assert config.segment_bytes == 4096 and config.retention_ms == -1
    assert config.overrides() == {"segment.bytes": 4096, "retention.ms": -1}
    assert TopicConfig().as_dict()["max.message.bytes"] == 1048588


@pytest.mark.parametrize("policy, compact, delete", [
    ("delete", False, True), ("compact", True, False), ("compact,delete", True, True),
    ("delete, compact", True, True)])
def test_cleanup_policies(policy, compact, delete):
    config = TopicConfig.from_overrides({"cleanup.policy": policy,
                                         "min.cleanable.dirty.ratio": "0.25"})
    assert (config.compact, config.delete) == (compact, delete)
    assert config.min_cleanable_dirty_ratio == 0.25


def test_topic_lifecycle_survives_a_restart(tmp_path):
    data = str(tmp_path / "data")
    with LogManager(data) as logs:
        logs.create_topic("events", partitions=2, config={"retention.bytes": 1 << 20})
        logs.partition_log("events", 1).append(values_batch(3, 0))
        with pytest.raises(TopicExistsError):
            logs.create_topic("events")
        logs.add_partitions("events", 4)
        logs.alter_topic_config("events", {"segment.ms": 60_000}, delete=("retention.bytes",))
    with LogManager(data) as logs:
        metadata = logs.describe_topic("events")
        assert metadata.partitions == 4
        assert metadata.config.overrides() == {"segment.ms": 60_000}
        assert [r.value for r in all_records(logs.partition_log("events", 1))] == \
            [f"v0-{i}-".encode().ljust(20, b".") for i in range(3)]
        assert logs.partition_log("events", 3).log_end_offset == 0
        with pytest.raises(InvalidPartitionsError):
            logs.add_partitions("events", 3)
        logs.delete_topic("events")
        assert logs.list_topics() == []
        assert os.listdir(os.path.join(data, "topics")) == []
    with LogManager(data) as logs:
        assert logs.list_topics() == []


def test_new_partitions_are_bare_directories_and_only_those_made_here_skip_recovery(tmp_path):
    data = str(tmp_path / "data")
    topic_dir = os.path.join(data, "topics", "events")
    with LogManager(data) as logs:
        # A partition directory there before its topic (a crash before topic.json):
        # opened through the loader, which finds what it holds.
        os.makedirs(os.path.join(topic_dir, "1"))
        with open(os.path.join(topic_dir, "1", "checkpoint.json"), "w") as checkpoint:
            checkpoint.write('{"version": 1, "recovery_point": 0, "log_start_offset": 7}')
        logs.create_topic("events", partitions=3)
        assert os.listdir(os.path.join(topic_dir, "0")) == [], \
            "a new partition is its directory alone"
        fresh, leftover = logs.partition_log("events", 0), logs.partition_log("events", 1)
        assert fresh.log_end_offset == 0 and fresh.active.pending
        assert leftover.log_start_offset == 7 == leftover.log_end_offset
        fresh.append(values_batch(2, 1))
        logs.partition_log("events", 2)                  # opened, never written
    assert os.listdir(os.path.join(topic_dir, "2")) == [], "closing wrote nothing there"
    with LogManager(data) as logs:
        assert logs.partition_log("events", 0).log_end_offset == 2
        assert logs.partition_log("events", 1).log_start_offset == 7
        assert logs.partition_log("events", 2).log_end_offset == 0


def test_unknown_topics_and_partitions(manager):
    manager.create_topic("t", partitions=2)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.partition_log("nope", 0)
    for partition in (-1, 2, "0"):
        with pytest.raises(UnknownTopicOrPartitionError):
            manager.partition_log("t", partition)


def test_a_second_process_cannot_open_a_directory_in_use(tmp_path):
    data = str(tmp_path / "data")
    probe = ("import sys\nfrom shmlog import LogManager\n"
             "from shmlog.storage.log_manager import DataDirectoryInUseError\n"
             "try:\n    LogManager(sys.argv[1])\nexcept DataDirectoryInUseError as e:\n"
             "    print(e); sys.exit(3)\n")
    with LogManager(data):
        done = subprocess.run([sys.executable, "-c", probe, data], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 3, done.stderr
        assert "in use by another shmlog process" in done.stdout
    done = subprocess.run([sys.executable, "-c", probe, data], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_lock_is_per_directory_not_per_object(tmp_path):
    with LogManager(str(tmp_path / "a")):
        with LogManager(str(tmp_path / "b")):
            pass
        with pytest.raises(DataDirectoryInUseError):
            LogManager(str(tmp_path / "a"))


def test_a_topic_takes_the_id_its_cluster_gave_it(tmp_path):
    data = str(tmp_path / "data")
    given = "0123456789abcdef0123456789abcdef"
    with LogManager(data) as logs:
        assert logs.create_topic("t", 2, topic_id=given).topic_id == given
        for bad in ("0123", given.upper(), 5, given + "0"):
            with pytest.raises(InvalidTopicError):
                logs.create_topic("u", 1, topic_id=bad)
        assert "u" not in logs.list_topics()
    with LogManager(data) as logs:
        assert logs.describe_topic("t").topic_id == given
        assert logs.partition_log("t", 1).topic_id == given
