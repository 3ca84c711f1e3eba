"""One broker with 2,000 partitions stays within issue 26's bounds, so a regression
fails CI: resident memory grows by at most 64 KiB per partition beyond the data the
partitions hold, idle and after one record each, and open files by at most one per
partition (plus a constant).

Method: a real broker; its VmRSS and open files (/proc/PID/status, /proc/PID/fd)
before the topic exists, after a topic of ``PARTITIONS`` partitions is created, and
after one record was sent to each. The records go in steps (``STEPS``: the first 20
partitions, then 200, then all), the memory checked after each and the sending
stopped at the first step over the bound: a broker that reserves tens of MiB per
partition (the bug this guards against) fails after 20 partitions instead of
exhausting the host's memory. Counts and bytes only: nothing here is timed.
"""

from __future__ import annotations

import os

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.server.broker import Broker

PARTITIONS = 2_000
STEPS = (20, 200, PARTITIONS)
RSS_PER_PARTITION_MAX = 64 << 10     # issue 26: beyond the data a partition holds
RSS_SLACK = 16 << 20                 # the allocator's arenas, a page table or two
FILES_CONSTANT = 64                  # the broker's own files beyond one per partition
DEADLINE_S = 120                     # a request, a record's acknowledgement


@pytest.fixture
def data_dir(tmp_path):
    path = str(tmp_path / "data")
    yield path
    unlink_shared_memory(path)


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def memory_problem(pid: int, before: int, data_bytes: int, what: str) -> str | None:
    grown = resident_bytes(pid) - before
    allowed = PARTITIONS * RSS_PER_PARTITION_MAX + data_bytes + RSS_SLACK
    if grown <= allowed:
        return None
    return (f"{what}: the broker's RSS grew by {grown / 2**20:,.1f} MiB for {PARTITIONS:,} "
            f"partitions holding {data_bytes:,} bytes; at most {allowed / 2**20:,.1f} MiB "
            f"({RSS_PER_PARTITION_MAX >> 10} KiB a partition + the data)")


def files_problem(pid: int, before: int, what: str) -> str | None:
    count = open_files(pid)
    if count <= before + PARTITIONS + FILES_CONSTANT:
        return None
    return (f"{what}: the broker holds {count:,} open files for {PARTITIONS:,} partitions "
            f"({(count - before) / PARTITIONS:.1f} each); at most one a partition + "
            f"{FILES_CONSTANT}")


def send_steps(data_dir: str, pid: int, before: int, problems: list) -> None:
    """One record to each partition, STEPS at a time, until a step breaks the
    memory bound (then no more are sent)."""
    admin = Admin(data_dir, timeout_ms=DEADLINE_S * 1000)
    with Producer(data_dir, acks=1, linger_ms=5) as producer:
        sent = 0
        for step in STEPS:
            futures = [producer.send("scale", b"x" * 100, partition=partition)
                       for partition in range(sent, step)]
            for future in futures:
                future.get(timeout=DEADLINE_S)
            sent = step
            data_bytes = sum(partition["size"] for partition in admin.list_offsets("scale"))
            problem = memory_problem(pid, before, data_bytes,
                                     f"after one record to {sent:,} partitions")
            if problem:
                problems.append(problem)
                return


@pytest.mark.timeout(2 * DEADLINE_S + 120)
def test_two_thousand_partitions_keep_to_the_memory_and_file_bounds(data_dir):
    problems: list[str] = []
    with Broker(data_dir) as broker:
        pid = broker.process.pid
        rss_before, files_before = resident_bytes(pid), open_files(pid)
        Admin(data_dir, timeout_ms=DEADLINE_S * 1000).create_topic("scale", PARTITIONS)
        problems += filter(None, [memory_problem(pid, rss_before, 0, "idle"),
                                  files_problem(pid, files_before, "idle")])
        send_steps(data_dir, pid, rss_before, problems)
        problems += filter(None, [files_problem(pid, files_before, "with records")])
    assert not problems, "\n".join(problems)
