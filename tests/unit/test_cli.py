"""The ``shmlog`` command: dump prints segments and indexes, --verify finds damage,
exit codes follow the convention (0 ok, 1 problem found, 2 usage); ``--log-level``
is taken before or after the subcommand, and defaults to INFO for the broker only;
a broker refuses a data directory too long for its control socket before creating
anything.

Method: write a real partition with the library, run ``python -m shmlog`` as a
subprocess on its files, and check output and exit codes, before and after flipping
a byte. Option parsing is checked in-process on ``cli.build_parser()``. A live
broker's active segment (preallocated log and indexes, the time index not a whole
number of entries) is verified as it is, and copies of it are damaged to show
that preallocated space hides no damage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import flip_bits, values_batch
from shmlog import cli
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.record import batch_layout as B
from shmlog.record.control import EndTransactionMarker, encode_marker
from shmlog.record.records import encode_batch
from shmlog.server.broker import SOCKET_PATH_LENGTH_MAX, Broker, shared_memory_prefix
from shmlog.shm import shared_memory
from shmlog.storage import index_layout as I
from shmlog.storage.dump import read_segment


def shmlog(*arguments):
    return subprocess.run([sys.executable, "-m", "shmlog", *arguments], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def segment(open_log):
    partition_log = open_log(**{"index.interval.bytes": 0})
    partition_log.append(values_batch(3, 0))
    partition_log.append(values_batch(4, 1, compression="zstd"))
    partition_log.append(values_batch(1, 2))
    path = partition_log.active.log_path
    partition_log.close()
    return path


def test_dump_lists_batches_and_records(segment):
    done = shmlog("dump", "--records", "--print-data", "--verify", segment)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("baseOffset:") for line in lines) == 3
    assert sum(line.startswith("| offset:") for line in lines) == 8
    assert "compression: zstd" in done.stdout
    assert "payload: v1-0-" in done.stdout
    assert lines[-1].endswith(": OK")


def test_dump_shows_transactional_batches_and_their_markers(open_log):
    partition_log = open_log()
    partition_log.append(encode_batch([b"in-a-transaction"], producer_id=9, producer_epoch=2,
                                      base_sequence=0, transactional=True))
    partition_log.append(encode_marker(EndTransactionMarker(9, 2, True, 4)))
    path = partition_log.active.log_path
    partition_log.close()
    done = shmlog("dump", "--records", "--print-data", path)
    assert done.returncode == 0, done.stderr
    batches = [line for line in done.stdout.splitlines() if line.startswith("baseOffset:")]
    assert ["isTransactional: True isControl: False" in batches[0],
            "isTransactional: True isControl: True" in batches[1]] == [True, True]
    assert "| offset: 1 " in done.stdout
    assert "endTxnMarker: COMMIT coordinatorEpoch: 4" in done.stdout


def test_dump_json_is_machine_readable(segment):
    done = shmlog("dump", "--json", "--records", segment)
    body = json.loads(done.stdout)
    assert [batch["base_offset"] for batch in body["batches"]] == [0, 3, 7]
    assert [len(records) for records in body["records"]] == [3, 4, 1]
    assert body["problems"] == []


def test_dump_of_an_index_prints_its_entries(segment):
    done = shmlog("dump", "--verify", segment.replace(".log", ".index"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].startswith("relative_offset: 3 position:")


def test_verify_exits_1_on_a_flipped_byte(segment):
    flip_bits(segment, B.HEADER_LENGTH + 10, 0x40)
    done = shmlog("dump", "--verify", segment)
    assert done.returncode == 1
    assert "PROBLEM: byte 0: BAD_CRC" in done.stdout


def test_verify_exits_1_on_a_wrong_index(segment):
    index = segment.replace(".log", ".index")
    with open(index, "r+b") as target:
        target.seek(4)
        target.write((1).to_bytes(4, "little"))      # entry 0 now points at byte 1
    done = shmlog("dump", "--verify", segment)
    assert done.returncode == 1
    assert "does not point at that batch" in done.stdout


def test_usage_errors_exit_2(tmp_path):
    assert shmlog("dump", str(tmp_path / "missing.log")).returncode == 2
    assert shmlog("no-such-command").returncode == 2
    assert shmlog().returncode == 2


def test_a_file_that_is_not_a_segment_is_a_clear_error(tmp_path):
    stray = tmp_path / "notes.log"
    stray.write_text("hello")
    done = shmlog("dump", str(stray))
    assert done.returncode == 1
    assert "not a segment file name" in done.stderr


def test_a_data_directory_too_long_for_the_control_socket_is_refused_before_anything(tmp_path):
    data_dir = tmp_path / "parent" / ("d" * SOCKET_PATH_LENGTH_MAX)
    done = shmlog("broker", "--data-dir", str(data_dir))
    assert done.returncode == 1
    assert "choose a shorter data directory" in done.stderr
    assert not (tmp_path / "parent").exists()
    prefix = shared_memory_prefix(str(data_dir))
    assert [name for name in os.listdir("/dev/shm") if name.startswith(prefix)] == []


@pytest.mark.parametrize("arguments", [["--log-level", "DEBUG", "topics", "list"],
                                       ["topics", "list", "--log-level", "DEBUG"],
                                       ["topics", "--log-level", "DEBUG", "list"]])
def test_log_level_is_taken_before_or_after_the_subcommand(arguments):
    assert cli.log_level(cli.build_parser().parse_args(arguments)) == "DEBUG"


def test_the_broker_logs_at_info_by_default_and_the_other_commands_at_warning():
    parser = cli.build_parser()
    assert cli.log_level(parser.parse_args(["broker"])) == "INFO"
    assert cli.log_level(parser.parse_args(["topics", "list"])) == "WARNING"
    assert cli.log_level(parser.parse_args(["--log-level", "ERROR", "broker"])) == "ERROR"


# --- a live broker's active segment --------------------------------------------------

# Index sizes that are whole numbers of neither entry size (8 and 12 bytes), as
# Kafka's default segment.index.bytes (10 MiB) is not of the time index's.
SMALL_ACTIVE = {"segment.bytes": 1 << 20, "segment.index.bytes": 100_004,
                "index.interval.bytes": 0}


@pytest.fixture(scope="module")
def live_broker(tmp_path_factory):
    """A broker serving two topics whose active segments hold 20 batches: "live"
    with the default sizes and "small" with SMALL_ACTIVE; their directories."""
    data_dir = str(tmp_path_factory.mktemp("live") / "data")
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("live", 1, {"index.interval.bytes": 0})
        admin.create_topic("small", 1, SMALL_ACTIVE)
        with Producer(data_dir) as producer:
            for number in range(20):
                for topic in ("live", "small"):
                    producer.send_batch(topic, [b"v%d-%d" % (number, index)
                                                for index in range(10)],
                                        partition=0).get(timeout=60)
        yield {topic: os.path.join(data_dir, "topics", topic, "0") for topic in ("live", "small")}
    for name in os.listdir("/dev/shm"):
        if name.startswith(shared_memory_prefix(data_dir)):
            shared_memory.unlink(name)


def active_files(directory) -> dict:
    stem = os.path.join(directory, I.segment_file_name(0, ""))
    return {suffix: stem + suffix
            for suffix in (I.LOG_SUFFIX, I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX)}


@pytest.mark.parametrize("topic", ["live", "small"])
def test_verify_passes_on_a_live_brokers_active_segment(live_broker, topic):
    files = active_files(live_broker[topic])
    assert os.path.getsize(files[I.TIME_INDEX_SUFFIX]) % I.TIME_ENTRY_LENGTH, \
        "preallocated to a size that is not a whole number of entries"
    done = shmlog("dump", "--verify", files[I.LOG_SUFFIX])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("Verified 20 batches") and last.endswith(": OK"), last
    for suffix in (I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX):
        done = shmlog("dump", "--verify", files[suffix])
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr
        assert "zero entries follow: preallocated space" in done.stdout.splitlines()[-1]


def entry_position(suffix: str, number: int, field: str) -> int:
    """Where a field of an index entry is in the file."""
    dtype = I.TIME_INDEX_DTYPE if suffix == I.TIME_INDEX_SUFFIX else I.OFFSET_INDEX_DTYPE
    return number * dtype.itemsize + dtype.fields[field][1]


DAMAGE = {
    # (file, position of the byte to change (a function of the copied files), mask,
    #  what verify must say)
    "a byte of a batch's records": (
        I.LOG_SUFFIX,
        lambda files: read_segment(files[I.LOG_SUFFIX], verify=False).batches[5].position
        + B.RECORDS_OFFSET + 2, 0x10, "BAD_CRC"),
    "a byte of the log's preallocated space": (I.LOG_SUFFIX, lambda files: (1 << 20) - 1, 0x01,
                                               "followed by non-zero bytes"),
    "an offset index entry's position": (
        I.OFFSET_INDEX_SUFFIX,
        lambda files: entry_position(I.OFFSET_INDEX_SUFFIX, 7, "position"), 0x02,
        "does not point at that batch"),
    "a time index entry's offset": (
        I.TIME_INDEX_SUFFIX,
        lambda files: entry_position(I.TIME_INDEX_SUFFIX, 0, "relative_offset"), 0x01,
        "not the end of a batch"),
    "a byte of the offset index's preallocated entries": (
        I.OFFSET_INDEX_SUFFIX, lambda files: 8 * 1000 + 5, 0x01, "increasing offset order"),
    "the time index's partial last entry": (
        I.TIME_INDEX_SUFFIX, lambda files: os.path.getsize(files[I.TIME_INDEX_SUFFIX]) - 1, 0x01,
        "not preallocated zeros"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_still_finds_damage_in_preallocated_segment_files(live_broker, tmp_path,
                                                                  damage):
    files = {}
    for suffix, path in active_files(live_broker["small"]).items():
        files[suffix] = str(tmp_path / os.path.basename(path))
        shutil.copyfile(path, files[suffix])
    assert shmlog("dump", "--verify", files[I.LOG_SUFFIX]).returncode == 0, "the copy is sound"
    suffix, position, mask, said = DAMAGE[damage]
    flip_bits(files[suffix], position(files), mask)
    done = shmlog("dump", "--verify", files[I.LOG_SUFFIX])
    assert done.returncode == 1, done.stdout[-2000:]
    assert said in done.stdout


def test_cluster_up_refuses_bad_counts_and_a_used_directory_before_starting_anything(tmp_path):
    """``shmlog cluster up`` itself runs in tests/integration/test_readme.py."""
    assert shmlog("cluster", "up", "--brokers", "0", "--dir", str(tmp_path / "c")).returncode == 2
    assert shmlog("cluster").returncode == 2, "a verb is required"
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "something").write_text("")
    done = shmlog("cluster", "up", "--dir", str(tmp_path / "used"))
    assert done.returncode == 1
    assert "is not empty" in done.stderr
    assert sorted(os.listdir(tmp_path / "used")) == ["something"]


def test_cluster_reassign_refuses_usage_errors_and_bad_files_before_connecting(tmp_path):
    """``shmlog cluster reassign`` itself runs in tests/cluster/test_reassign.py; these
    fail before any ZooKeeper is asked (none listens on port 1)."""
    connect = ("cluster", "reassign", "--zookeeper-connect", "127.0.0.1:1")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,1]}]}')
    for arguments in (("--generate",), ("--execute",), ("--generate", "--verify"),
                      ("--verify", "--reassignment-json-file", str(bad), "--throttle", "10"),
                      ("--generate", "--topics-to-move-json-file", str(bad),
                       "--broker-list", "1,x")):
        assert shmlog(*connect, *arguments).returncode == 2, arguments
    done = shmlog(*connect, "--execute", "--reassignment-json-file", str(bad))
    assert done.returncode == 2
    assert "names a broker twice" in done.stderr
    done = shmlog(*connect, "--generate", "--topics-to-move-json-file", str(bad),
                  "--broker-list", "1,2")
    assert done.returncode == 2
    assert '"topics"' in done.stderr
