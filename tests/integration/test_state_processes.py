"""The high watermark in the partition state table orders record bytes across
processes: whatever a reader sees below a published high watermark is complete.

Method: a child process (the broker's side: it makes the table) writes "records"
(increasing int64s) into a shared file mapping and publishes a high watermark
covering each one; this process maps the table read-only, as a consumer does, and
checks, on every high watermark it observes, that the record just below it is
already there.
Every wait is bounded; the child is always reaped, the table always unlinked.
"""

from __future__ import annotations

import mmap
import os
import select
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from shmlog.shm.state import PartitionStateTable, unlink_table


@pytest.fixture
def table_name():
    name = f"shmlog-test-state-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    unlink_table(name)


WRITER = textwrap.dedent("""
    import mmap, sys
    import numpy as np
    from shmlog.shm.state import PartitionStateTable
    table = PartitionStateTable.create(sys.argv[1], 1)    # the broker's side: it writes
    table.claim(0, 1, 0)
    with open(sys.argv[2], "r+b") as source:
        data = np.frombuffer(mmap.mmap(source.fileno(), 0), np.int64)
    print("ready", flush=True)
    for index in range(data.size):
        data[index] = index + 1                     # the "record"
        table.publish(0, 0, index + 1, index + 1, 0, 8 * (index + 1), 0)
""")


def test_bytes_below_a_published_high_watermark_are_visible(table_name, tmp_path):
    records = 200_000
    path = tmp_path / "segment"
    path.write_bytes(bytes(8 * records))
    with open(path, "r+b") as source:
        data = np.frombuffer(mmap.mmap(source.fileno(), 0), np.int64)
    child = subprocess.Popen([sys.executable, "-c", WRITER, table_name, str(path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready and child.stdout.readline().strip() == "ready", "the writer never started"
        with PartitionStateTable.attach(table_name) as table:       # read-only, as a consumer
            deadline = time.monotonic() + 120
            seen = checks = 0
            while seen < records:
                assert time.monotonic() < deadline, f"stalled at {seen}"
                seen = table.high_watermark(0)
                if seen > 0:
                    assert data[seen - 1] == seen
                    checks += 1
            assert child.wait(timeout=60) == 0
            assert checks > 0
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
