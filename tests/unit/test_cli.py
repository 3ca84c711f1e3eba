"""The ``shmlog`` command: dump prints segments and indexes, --verify finds damage,
exit codes follow the convention (0 ok, 1 problem found, 2 usage); ``--log-level``
is taken before or after the subcommand, and defaults to INFO for the broker only;
a broker refuses a data directory too long for its control socket before creating
anything.

Method: write a real partition with the library, run ``python -m shmlog`` as a
subprocess on its files, and check output and exit codes, before and after flipping
a byte. Option parsing is checked in-process on ``cli.build_parser()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import flip_bits, values_batch
from shmlog import batch_layout as B
from shmlog import cli
from shmlog.broker import SOCKET_PATH_LENGTH_MAX, shared_memory_prefix


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
