"""A reader in another process than the broker sees exactly what was published:
every record once, in order, across segment rolls, never at or past the high
watermark; and records deleted by retention become out of range.

Method: a writer process runs the real appender (ring -> partition log -> state
table) with tiny segments; this process reads through a PartitionReader while the
writer appends, checking each record's offset and value against what the writer
sends, and that every result ends at or below the high watermark read before it.
Waits are bounded; the writer is always reaped and shared memory unlinked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from shmlog.client.reader import PartitionReader
from shmlog.common.errors import OffsetOutOfRangeError
from shmlog.record.records import decode_columns
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name

DEADLINE_S = 120
RECORDS = 30_000

WRITER = textwrap.dedent("""
    import sys
    from shmlog import LogManager
    from shmlog.broker.appender import Appender
    from shmlog.record.records import encode_batch
    from shmlog.ring import Ring
    from shmlog.shm.state import PartitionStateTable
    data, table_name, ring_name, records = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    logs = LogManager(data)
    logs.create_topic("t", config={"segment.bytes": 64 << 10, "index.interval.bytes": 512})
    table = PartitionStateTable.create(table_name, 4)
    appender = Appender(logs, table)
    tag = appender.register_partition("t", 0)
    ring = Ring.create(ring_name, 1 << 16)
    appender.add_ring(Ring.attach(ring_name))
    print("ready", flush=True)
    sent = 0
    while sent < records:
        count = min(1 + sent % 37, records - sent)
        ring.put(appender.destination("t", 0),
                 encode_batch([b"value-%d" % (sent + i) for i in range(count)]), 10_000)
        sent += count
        appender.drain()
    print(tag, flush=True)
    sys.stdin.readline()                  # stay up until the reader is done
    logs.close()
""")


@pytest.fixture
def names():
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    created = [prefix + "-state", prefix + "-ring"]
    yield created
    for name in created + [bells_name(created[0])]:
        shared_memory.unlink(name)


def test_a_reader_follows_a_live_writer_across_rolls(tmp_path, names):
    data = str(tmp_path / "data")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, data, *names, str(RECORDS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        table = PartitionStateTable.attach(names[0])
        reader = PartitionReader(os.path.join(data, "topics", "t", "0"), table, 0,
                                 topic_key=table.snapshot(0).topic_key, partition=0)
        deadline = time.monotonic() + DEADLINE_S
        offset = 0
        while offset < RECORDS:
            assert time.monotonic() < deadline, f"stalled at offset {offset}"
            assert writer.poll() is None, "the writer died"
            high_watermark = reader.high_watermark()
            result = reader.read(offset, max_bytes=8 << 10)
            if not result.data.size:
                continue
            columns = decode_columns(result.data, start_offset=offset, verified=True)
            assert columns.offsets[0] == offset
            assert columns.offsets.tolist() == list(range(offset, offset + len(columns)))
            assert result.next_offset <= max(high_watermark, reader.high_watermark())
            for index in (0, len(columns) - 1):
                assert columns.value(index) == b"value-%d" % columns.offsets[index]
            offset = result.next_offset
        assert len(reader._segments) > 3, "the writer rolled segments under the reader"
        with pytest.raises(OffsetOutOfRangeError):
            reader.read(RECORDS + 1)
        reader.close()
        table.close()
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "0"
        assert writer.wait(timeout=DEADLINE_S) == 0
    finally:
        writer.kill()
        writer.wait(timeout=30)
        writer.stdin.close()
        writer.stdout.close()
