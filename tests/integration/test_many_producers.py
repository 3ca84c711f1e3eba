"""Many producer processes on one broker: every producer's records all arrive, none is
starved while the others send, a producer past the broker's ``producers_max`` is
refused with ``TooManyProducersError`` naming the limit (its ring removed), and the
slot a producer that closed frees is taken by the next.

Method: a real broker (``producers_max`` = ``PRODUCERS``) and ``PRODUCERS`` real
producer processes, each with its ring (a small one, so a producer that outruns the
broker blocks on it) and its own partition. Each says "ready" once its first record
is acknowledged, so all are registered before any sends more; then, on "go", each
sends ``BATCHES`` batches of ``ROWS`` records. When the first producer is done, the
log end of every partition is read: each must be past that producer's first record,
so every ring was drained while the others sent (counts, never times: the first
producer cannot finish before the broker drained its ``BATCHES`` batches, and the
broker visits the rings round-robin). At the end each partition holds exactly
``1 + BATCHES * ROWS`` records, each producer's in its order.
"""

from __future__ import annotations

import select
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.common.errors import TooManyProducersError
from shmlog.server.broker import Broker, shared_memory_prefix
from shmlog.shm import shared_memory

PRODUCERS = 20
BATCHES = 300
ROWS = 50
RING_SIZE = 1 << 16            # ~8 batches: a producer that outruns the broker waits
DEADLINE_S = 300               # every wait of the test, start-up of 20 processes included

PRODUCER = textwrap.dedent("""
    import sys
    from shmlog import Producer
    data_dir, partition, batches, rows, ring_size = (sys.argv[1], int(sys.argv[2]),
                                                     int(sys.argv[3]), int(sys.argv[4]),
                                                     int(sys.argv[5]))
    with Producer(data_dir, acks=1, linger_ms=0, ring_size=ring_size) as producer:
        producer.send("many", b"first", partition=partition).get(timeout=120)
        print("ready", flush=True)
        sys.stdin.readline()
        futures = [producer.send_batch("many", [b"%d:%d:%d" % (partition, batch, row)
                                                for row in range(rows)], partition=partition)
                   for batch in range(batches)]
        for future in futures:
            future.get(timeout=120)
        print("done", flush=True)
""")


@pytest.fixture
def data_dir(clean_data_dir):
    return clean_data_dir


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout):
            stream.close()


def start_producers(data_dir, children) -> None:
    for partition in range(PRODUCERS):
        children.append(subprocess.Popen(
            [sys.executable, "-c", PRODUCER, data_dir, str(partition), str(BATCHES), str(ROWS),
             str(RING_SIZE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))


def await_line(children, expected: str, deadline: float, *, every: bool) -> None:
    """``expected`` from every child (``every``), or from the first one to say it."""
    waiting = {child.stdout: child for child in children}
    while waiting:
        left = deadline - time.monotonic()
        assert left > 0, f"{len(waiting)} producers did not say {expected!r} in time"
        for stream in select.select(list(waiting), [], [], left)[0]:
            line = stream.readline()
            assert line.strip() == expected, \
                f"a producer said {line!r} (status {waiting[stream].poll()}), not {expected!r}"
            del waiting[stream]
            if not every:
                return


def producer_rings(data_dir) -> list[str]:
    return shared_memory.names(shared_memory_prefix(data_dir) + "-producer-")


@pytest.mark.timeout(DEADLINE_S + 120)
def test_every_producer_is_drained_and_one_past_the_limit_is_refused(data_dir, children):
    deadline = time.monotonic() + DEADLINE_S
    with Broker(data_dir, producers_max=PRODUCERS):
        admin = Admin(data_dir)
        admin.create_topic("many", PRODUCERS)
        start_producers(data_dir, children)
        await_line(children, "ready", deadline, every=True)

        with pytest.raises(TooManyProducersError, match=f"producers_max \\({PRODUCERS}\\)"):
            Producer(data_dir)
        assert len(producer_rings(data_dir)) == PRODUCERS     # the refused ring is gone

        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        await_line(children, "done", deadline, every=False)
        ends = [partition["log_end_offset"] for partition in admin.list_offsets("many")]
        assert min(ends) > 1, f"a producer's ring was not drained while others sent: {ends}"

        for child in children:
            assert child.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
        with Producer(data_dir) as late:                       # the freed slots are taken
            late.send("many", b"late", partition=0).get(timeout=60)
    with LogManager(data_dir) as logs:
        for partition in range(PRODUCERS):
            values = [record.value for record in
                      all_records(logs.partition_log("many", partition))]
            expected = [b"first"] + [b"%d:%d:%d" % (partition, batch, row)
                                     for batch in range(BATCHES) for row in range(ROWS)]
            assert values == expected + ([b"late"] if partition == 0 else [])
    assert not producer_rings(data_dir)
