"""Rings and atomics across real processes.

Method: a producer process streams entries of random sizes (each tagged with its
sequence number and filled from a seed derived from it) through a small ring,
so the ring wraps and fills many times, while this process consumes, checks every
entry and releases space in uneven bursts. A second test has two processes
hammer one shared counter with ``fetch_add``. Every wait is bounded; child
processes are always reaped and the shared memory always unlinked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import posix_ipc
import pytest

from shmlog.native.atomics import py_load_acquire
from shmlog.ring import Ring

ENTRIES = 20_000
DEADLINE_S = 120

PRODUCER = textwrap.dedent("""
    import sys
    import numpy as np
    from shmlog.ring import Ring
    ring = Ring.attach(sys.argv[1])
    entries = int(sys.argv[2])
    for number in range(entries):
        size = (number * 7919) % 1500
        data = np.frombuffer(np.random.default_rng(number).bytes(size), np.uint8)
        assert ring.put((number, number << 20, number % 5), data, timeout_ms=60_000) == number
    while ring.unacknowledged:
        pass
    # Every result the consumer wrote came back, to the entry it belongs to.
    last = range(entries - 200, entries)
    assert all(ring.result(number) == (3 * number, number) for number in last)
    print("done", flush=True)
""")


def expected(number: int) -> bytes:
    return np.random.default_rng(number).bytes((number * 7919) % 1500)


@pytest.fixture
def ring_name():
    name = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError:
        pass


def test_a_producer_process_streams_through_a_small_ring(ring_name):
    consumer = Ring.create(ring_name, 16384)
    child = subprocess.Popen([sys.executable, "-c", PRODUCER, ring_name, str(ENTRIES)],
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        number = 0
        taken_since_release = 0
        while number < ENTRIES:
            assert time.monotonic() < deadline, f"stalled at entry {number}"
            entry = consumer.next()
            if entry is None:
                consumer.release()
                time.sleep(0)
                continue
            destination, view = entry
            assert destination == (number, number << 20, number % 5)
            assert view.tobytes() == expected(number)
            consumer.complete(3 * number, number)
            number += 1
            taken_since_release += 1
            if taken_since_release >= 1 + number % 5:        # release in uneven bursts
                consumer.release()
                taken_since_release = 0
        consumer.release()
        assert child.stdout.readline().strip() == "done"
        assert child.wait(timeout=DEADLINE_S) == 0
        assert consumer.next() is None and consumer.used == 0
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
        consumer.unlink()
        consumer.close()


ADDER = textwrap.dedent("""
    import sys
    import numpy as np
    from shmlog.native.atomics import py_fetch_add
    from shmlog.ring import Ring
    ring = Ring.attach(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        py_fetch_add(ring.words, 500, 1)
""")


def test_fetch_add_is_atomic_across_processes(ring_name):
    ring = Ring.create(ring_name, 4096)                 # word 500: unused control space
    count = 50_000
    children = [subprocess.Popen([sys.executable, "-c", ADDER, ring_name, str(count)])
                for _ in range(2)]
    try:
        for child in children:
            assert child.wait(timeout=DEADLINE_S) == 0
        assert py_load_acquire(ring.words, 500) == 2 * count
    finally:
        for child in children:
            child.kill()
            child.wait(timeout=30)
        ring.unlink()
        ring.close()
