"""``shmlog dump --verify`` on a live broker's active segment: the tail the broker has
not published yet (a batch being copied, preallocated zeros) is not a torn write,
while a torn write below the published end, or in a file no broker serves, is.

Method: a broker of the test's own; a producer process sends batches of varied
sizes (some compressed) as fast as it can while ``dump --verify`` runs on the
partition's newest segment again and again (in this process, through
``cli.main``: numba is loaded once). To make the race certain rather than likely,
another test writes non-zero bytes past the published end itself, as an appender
caught mid-copy leaves them, then damages the bytes below it. Every wait is
bounded; the producer is always reaped.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import unlink_shared_memory
from shmlog import cli
from shmlog.cli.dump import published_end
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.server.broker import Broker

TIMEOUT_S = 120
RUNS = 30
CONFIG = {"segment.bytes": str(8 << 20)}

# A steady stream of about 1 MB/s, not a flood: the active segment lives for seconds
# (few rolls) and each verify reads at most its 8 MiB. The producer ends by itself
# when the test's process is gone (a worker killed by a timeout runs no finally).
PRODUCER = textwrap.dedent("""
    import os
    import sys
    import time
    from shmlog.client.producer import Producer
    parent = os.getppid()
    with Producer(sys.argv[1], linger_ms=1) as producer:
        producer.send("live", b"first").get(timeout=60)
        print("ready", flush=True)
        number = 0
        while os.getppid() == parent:
            producer.send("live", b"%d:" % number + b"v" * (number * 37 % 900))
            number += 1
            if number % 250 == 0:
                producer.flush()
                time.sleep(0.1)
""")


@pytest.fixture
def broker(tmp_path):
    data_dir = str(tmp_path / "data")
    with Broker(data_dir):
        yield data_dir
    unlink_shared_memory(data_dir)


def newest_segment(data_dir: str, topic: str) -> str:
    return max(glob.glob(os.path.join(data_dir, "topics", topic, "0", "*.log")))


def verify(path: str, capsys) -> tuple[int, str]:
    code = cli.main(["dump", "--verify", path])
    return code, capsys.readouterr().out


def test_verify_while_producing_never_reports_the_unpublished_tail(broker, capsys):
    Admin(broker).create_topic("live", 1, config=CONFIG)
    writer = subprocess.Popen([sys.executable, "-c", PRODUCER, broker], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + TIMEOUT_S
        live = 0
        for run in range(RUNS):
            assert writer.poll() is None, "the producer died"
            assert time.monotonic() < deadline, f"{run} runs in {TIMEOUT_S} s"
            code, out = verify(newest_segment(broker, "live"), capsys)
            assert code == 0, out[-2000:]
            live += "a live segment" in out         # else it rolled: verified whole
        assert live, "the newest segment was never the active one"
    finally:
        writer.kill()
        writer.wait(timeout=TIMEOUT_S)
        writer.stdout.close()


def test_bytes_past_the_published_end_are_a_write_in_progress_below_it_a_torn_one(
        broker, capsys, tmp_path):
    Admin(broker).create_topic("torn", 1, config=CONFIG)
    with Producer(broker, linger_ms=0) as producer:
        for number in range(20):
            producer.send("torn", b"record %d" % number).get(timeout=TIMEOUT_S)
    path = newest_segment(broker, "torn")
    end = published_end(path)
    assert end is not None and end > 0, "the active segment of a running broker"
    # What an appender caught mid-copy leaves: a batch's bytes past the end, its length
    # word (the first 8 bytes) not yet written.
    with open(path, "r+b") as segment:
        segment.seek(end + 12)
        segment.write(b"\x5a" * 200)
    code, out = verify(path, capsys)
    assert code == 0, out
    # The same bytes in a file no broker serves are a torn write.
    copy = str(tmp_path / os.path.basename(path))
    shutil.copyfile(path, copy)
    code, out = verify(copy, capsys)
    assert code == 1 and "torn write" in out, out
    # And below the published end, in the live segment, too: the last batch's length
    # zeroed, its bytes left.
    last_position = int(last_batch_position(path, end))
    with open(path, "r+b") as segment:
        segment.seek(last_position)              # batch_length opens the header
        segment.write(b"\0" * 4)
    code, out = verify(path, capsys)
    assert code == 1 and "torn write" in out, out


def last_batch_position(path: str, end: int) -> int:
    """Where the last batch below ``end`` starts (the walk of ``storage.dump``)."""
    from shmlog.storage.dump import read_segment
    report = read_segment(path, verify=False, published_end=end)
    assert report.ok and report.batches, report.problems
    return report.batches[-1].position
