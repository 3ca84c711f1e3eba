"""A writer killed with SIGKILL while appending loses nothing it acknowledged.

Method: a child process appends batches to a real partition directory as fast as it
can and prints each acknowledged last offset; the parent kills it with SIGKILL at a
random moment (usually in the middle of a copy into the mapped segment), reopens the
partition, and checks that every acknowledged record is there, intact and in order,
that nothing after the log end is readable, and that ``shmlog dump --verify`` passes
on every segment. Each wait is bounded; the child is always reaped.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import all_records
from shmlog.segments import PartitionLog
from shmlog.storage.topic_config import TopicConfig

CONFIG = {"segment.bytes": 256 << 10, "index.interval.bytes": 1024}

WRITER = textwrap.dedent("""
    import sys
    from shmlog.storage.topic_config import TopicConfig
    from shmlog.record.records import encode_batch
    from shmlog.segments import PartitionLog
    config = TopicConfig.from_overrides({config!r})
    log = PartitionLog(sys.argv[1], config)
    print("ready", flush=True)
    batch_number = 0
    while True:
        count = 1 + batch_number % 50
        values = [b"%d:%d:" % (batch_number, i) + b"x" * (i * 7 % 300) for i in range(count)]
        compression = "zstd" if batch_number % 3 == 0 else None
        result = log.append(encode_batch(values, compression=compression))
        print(result.last_offset, batch_number, flush=True)
        batch_number += 1
""").format(config=CONFIG)


def expected_value(batch_number: int, index: int) -> bytes:
    return b"%d:%d:" % (batch_number, index) + b"x" * (index * 7 % 300)


@pytest.mark.parametrize("seed", range(5))
def test_sigkill_mid_append_loses_nothing_acknowledged(tmp_path, seed):
    directory = str(tmp_path / "partition")
    child = subprocess.Popen([sys.executable, "-c", WRITER, directory], stdout=subprocess.PIPE,
                             text=True)
    acknowledged = []
    try:
        deadline = time.monotonic() + 120
        assert child.stdout.readline().strip() == "ready"
        wanted = random.Random(seed).randint(50, 400)
        while len(acknowledged) < wanted and time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, "the writer died on its own"
            last_offset, batch_number = map(int, line.split())
            acknowledged.append((last_offset, batch_number))
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert len(acknowledged) == wanted, "timed out waiting for acknowledgements"

    partition_log = PartitionLog(directory, TopicConfig.from_overrides(CONFIG))
    try:
        last_acknowledged = acknowledged[-1][0]
        assert partition_log.log_end_offset > last_acknowledged
        records = all_records(partition_log)
        assert [r.offset for r in records] == list(range(partition_log.log_end_offset))
        expected = [expected_value(batch_number, index)
                    for batch_number in range(acknowledged[-1][1] + 1)
                    for index in range(1 + batch_number % 50)]
        assert [r.value for r in records[:len(expected)]] == expected
        segment_paths = [segment.log_path for segment in partition_log.segments]
    finally:
        partition_log.close()
    for path in segment_paths:
        done = subprocess.run([sys.executable, "-m", "shmlog", "dump", "--verify", path],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:]
