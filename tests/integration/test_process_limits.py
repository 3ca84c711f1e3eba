"""A broker at its process limits: open files (RLIMIT_NOFILE) and memory mappings
(vm.max_map_count) give a typed error naming the limit; nothing acknowledged is lost
and the broker goes on serving.

Method: a real broker process whose soft open-files limit the test lowers with
``prlimit`` (it may, for a process of its own user). Partitions hold no descriptor
(a mapping needs none), so 2,000 of them are created and written under a limit a
few descriptors above what the broker held before; with no descriptor allowed, an
append that needs room reserved is refused with ``ResourceLimitError`` (and the
broker, whose housekeeping then fails too, keeps serving); with the limit back,
appends and new topics work and every acknowledged record reads back. The mapping
limit is a kernel-wide sysctl a test may not change: a child process maps one small
file until ``native.mapping`` refuses, which is the real limit of that process.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

from shmlog import Admin, Broker, Consumer, Producer, TopicPartition
from shmlog.common.errors import ResourceLimitError

PARTITIONS = 2000
# Descriptors the broker may open beyond those it holds: a file being mapped,
# reserved or trimmed is open for a moment, one at a time.
SLACK = 8
WAIT_S = 60


def open_files(pid: int) -> list[int]:
    """The descriptors ``pid`` holds. (RLIMIT_NOFILE bounds the numbers a new one may
    take, not how many there are: a new descriptor takes the lowest free number.)"""
    return sorted(int(name) for name in os.listdir(f"/proc/{pid}/fd"))


def read_all(data_dir, topic: str, partitions: int) -> dict:
    """{partition: [values]} of every record in ``topic``."""
    consumer = Consumer(bootstrap=data_dir, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, partition) for partition in range(partitions)])
    found: dict[int, list] = {}
    try:
        while True:
            polled = consumer.poll(timeout_ms=500)
            if not polled:
                return found
            for partition, records in polled.items():
                found.setdefault(partition.partition, []).extend(r.value for r in records)
    finally:
        consumer.close()


def test_partitions_hold_no_descriptors_and_running_out_is_a_typed_error(data_dir):
    with Broker(data_dir) as broker:
        pid = broker.process.pid
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        admin = Admin(data_dir, request_timeout_ms=WAIT_S * 1000)   # 2,000 on a busy host
        producer = Producer(data_dir, linger_ms=5)
        try:
            held = open_files(pid)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (held[-1] + 1 + SLACK, hard))
            admin.create_topic("many", PARTITIONS)
            futures = [producer.send("many", b"%d" % partition, partition=partition)
                       for partition in range(PARTITIONS)]
            producer.flush(timeout=WAIT_S)
            for future in futures:
                future.get(WAIT_S)
            assert len(open_files(pid)) <= len(held) + SLACK

            # Only 0, 1 and 2 allowed (all in use): an append that needs room reserved
            # is refused, by name. (A control request would not even be accepted: its
            # connection needs a descriptor.)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, hard))
            big = producer.send("many", b"x" * (256 << 10), partition=0)   # needs room
            with pytest.raises(ResourceLimitError, match="RLIMIT_NOFILE"):
                big.get(WAIT_S)

            resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
            assert len(admin.describe_topic("many")["partitions"]) == PARTITIONS
            admin.create_topic("after", 1)
            producer.send("many", b"after", partition=0).get(WAIT_S)
        finally:
            producer.close()
            admin.close()
        found = read_all(data_dir, "many", PARTITIONS)
    assert found[0] == [b"0", b"after"]
    assert all(found[partition] == [b"%d" % partition] for partition in range(1, PARTITIONS))


MAPPING_CHILD = textwrap.dedent("""
    import os, sys, tempfile
    from shmlog.common.errors import ResourceLimitError
    from shmlog.native import mapping
    path = os.path.join(sys.argv[1], "page")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    views = []
    try:
        while True:
            views.append(mapping.map_shared(fd, 4096, writable=True))
    except ResourceLimitError as error:
        with open("/proc/self/maps") as maps:
            count = sum(1 for _ in maps)
        print(len(views), count, error.limit, str(error), sep="\\n")
    views.clear()
    views.append(mapping.map_shared(fd, 4096, writable=True))   # room again
    views[0][0] = 1
    print(mapping.mappings_live())
""")


def test_mappings_stop_with_a_typed_error_below_vm_max_map_count(tmp_path):
    with open("/proc/sys/vm/max_map_count") as source:
        limit = int(source.read())
    child = subprocess.run([sys.executable, "-c", MAPPING_CHILD, str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    made, count, name, message, live_after = child.stdout.splitlines()
    assert name == "vm.max_map_count" and "sysctl -w vm.max_map_count=" in message
    assert int(made) > limit // 2                 # it went most of the way...
    assert int(count) < limit                     # ...and stopped short of the limit
    assert int(live_after) == 1                   # the freed views were unmapped
