"""Shared-memory rings in one process: round trips (each entry's destination -
row, topic key, partition - comes out as it went in), entry bytes against the
layout written out again in tests/reference.py, wrap-around with padding, a full
ring, garbage written by a misbehaving producer, and the header checks.

Method: real POSIX shared memory (unlinked at teardown, and /dev/shm checked for
leftovers); a random sequence of puts and takes is compared with a deque model.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
import uuid

import numpy as np
import pytest

from reference import reference_ring_entry
from shmlog.common.errors import (
    CorruptRingError,
    LocalProtocolError,
    RecordTooLargeError,
    RingFullError,
    ShmlogError,
)
from shmlog.ring import MAKER_PENDING, MAKER_UNKNOWN, Destination, Ring, maker_pid
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory


@pytest.fixture
def ring_name():
    name = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    shared_memory.unlink(name)          # by name: the test may have damaged the header
    assert not os.path.exists(f"/dev/shm/{name}")


def payload(number: int, size: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng(number).bytes(size), np.uint8)


def to(number: int) -> Destination:
    """A destination of its own for each number (row, topic key and partition differ)."""
    return Destination(number, (number + 1) << 40, number % 7)


def test_round_trip_and_release(ring_name):
    with Ring.create(ring_name, 4096) as producer, Ring.attach(ring_name) as consumer:
        assert consumer.next() is None
        assert producer.try_put(to(7), b"hello") == 0          # entry numbers
        assert producer.try_put(Destination(8, 2**63 - 1, 2**32 - 1), b"") == 1
        destination, view = consumer.next()
        assert (destination, view.tobytes()) == (to(7), b"hello")
        destination, view = consumer.next()
        assert (destination, view.tobytes()) == (Destination(8, 2**63 - 1, 2**32 - 1), b"")
        assert consumer.next() is None
        assert producer.used == R.aligned_entry_size(5) + R.aligned_entry_size(0)  # unreleased
        consumer.release()
        assert producer.used == 0
        assert producer.result(0) is None and producer.unacknowledged == 2
        consumer.complete(1234, 99)
        consumer.complete(-5)
        assert producer.result(1) == (-5, -1)
        assert producer.result(0) == (1234, 99)
        assert producer.result(0) is None, "a result is claimed once"
        assert producer.unacknowledged == 0
        producer.unlink()


def test_entries_match_the_reference_layout(ring_name):
    """The bytes of entries in the data region, header and padding, are what the
    layout's diagram says (written out again in tests/reference.py)."""
    with Ring.create(ring_name, 4096) as producer:
        entries = [(to(3), b"abc"), (Destination(2**32 - 2, 2**63 - 1, 2**32 - 1), b""),
                   (Destination(0, 1, 0), bytes(range(16)))]
        for destination, data in entries:
            producer.try_put(destination, data)
        expected = b"".join(reference_ring_entry(destination.row, number, destination.topic_key,
                                                 destination.partition, data)
                            for number, (destination, data) in enumerate(entries))
        assert producer.data[:len(expected)].tobytes() == expected
        producer.unlink()


def test_a_random_workload_matches_a_model_of_positions(ring_name):
    """The model tracks tail, taken head and released head in bytes, padding
    included, and entries published and completed, so it predicts exactly when a
    put must fit (room in the data region and a free completion slot)."""
    capacity = 8192
    rng = random.Random(3)
    queue = collections.deque()
    tail = taken = released = published = completed = 0
    with Ring.create(ring_name, capacity) as producer, Ring.attach(ring_name) as consumer:
        for number in range(5000):
            if rng.random() < 0.55:
                size = rng.choice([0, 1, 7, 8, 9, rng.randint(0, 3000)])
                data = payload(number, size)
                needed = R.aligned_entry_size(size)
                padding = capacity - tail % capacity if tail % capacity + needed > capacity else 0
                fits = (tail + padding + needed - released <= capacity
                        and published - completed < R.COMPLETION_SLOTS)
                assert (producer.try_put(to(number), data) >= 0) == fits
                if fits:
                    queue.append((number, data.tobytes(), padding, needed))
                    tail += padding + needed
                    published += 1
            elif rng.random() < 0.8:
                entry = consumer.next()
                if not queue:
                    assert entry is None
                    continue
                number, data, padding, needed = queue.popleft()
                taken += padding + needed
                assert (entry[0], entry[1].tobytes()) == (to(number), data)
                consumer.complete(number)
                completed += 1
            else:
                consumer.release()
                released = taken
            assert producer.used == tail - released
        producer.unlink()


def test_entries_never_wrap_a_padding_marker_skips_the_end(ring_name):
    with Ring.create(ring_name, 4096) as producer, Ring.attach(ring_name) as consumer:
        assert producer.try_put(to(1), payload(1, 3000)) == 0
        consumer.next()
        consumer.release()
        assert producer.try_put(to(2), payload(2, 2000)) == 1   # does not fit before the end
        marker = R.aligned_entry_size(3000)
        assert consumer.data[marker:marker + 4].view(np.uint32)[0] == R.PADDING_MARKER
        destination, view = consumer.next()
        assert destination == to(2) and view.tobytes() == payload(2, 2000).tobytes()
        assert view.ctypes.data == consumer.data.ctypes.data + R.ENTRY_HEADER_LENGTH
        producer.unlink()


def test_a_full_ring_refuses_and_a_blocking_put_times_out(ring_name):
    with Ring.create(ring_name, 4096) as producer:
        while producer.try_put(to(0), payload(0, 500)) >= 0:
            pass
        with pytest.raises(RingFullError, match="stayed full for 30 ms"):
            producer.put(to(0), payload(0, 500), timeout_ms=30)
        with pytest.raises(RecordTooLargeError):
            producer.try_put(to(0), np.zeros(4096, np.uint8))
        producer.unlink()


def test_unread_results_bound_the_entries_in_flight(ring_name):
    with Ring.create(ring_name, 1 << 20) as producer, Ring.attach(ring_name) as consumer:
        for number in range(R.COMPLETION_SLOTS):
            assert producer.try_put(to(number), b"x") == number
        assert producer.try_put(to(0), b"x") == -1, "every completion slot is spoken for"
        for number in range(3):
            consumer.next()
            consumer.complete(number * 10)
        assert producer.try_put(to(0), b"x") == R.COMPLETION_SLOTS   # harvested, so room
        assert [producer.result(number) for number in range(3)] == [(0, -1), (10, -1), (20, -1)]
        with pytest.raises(LocalProtocolError):
            Ring.attach(ring_name).complete(0)                     # nothing taken there
        producer.unlink()


@pytest.mark.parametrize("damage", ["short length", "length past tail", "length past end",
                                    "tail beyond capacity", "tail behind head"])
def test_garbage_from_the_producer_is_a_corrupt_ring_error(ring_name, damage):
    with Ring.create(ring_name, 4096) as producer, Ring.attach(ring_name) as consumer:
        producer.try_put(to(1), b"good")
        producer.try_put(to(2), b"also good")
        destination, _ = consumer.next()
        assert destination == to(1)
        second = R.aligned_entry_size(4)
        length = producer.data[second:second + 4].view(np.uint32)
        if damage == "short length":
            length[0] = 3
        elif damage == "length past tail":
            length[0] = 64
        elif damage == "length past end":
            length[0] = 5000
        elif damage == "tail beyond capacity":
            producer.words[R.TAIL_WORD] = 10_000
        else:
            producer.words[R.TAIL_WORD] = 0
        with pytest.raises(CorruptRingError) as raised:
            consumer.next()
        assert raised.value.name == ring_name
        producer.unlink()


def test_attach_checks_the_header(ring_name):
    with Ring.create(ring_name, 4096) as producer:
        producer.words[0] = 0x1234                        # magic and version gone
        with pytest.raises(CorruptRingError, match=f"not a version-{R.VERSION} ring"):
            Ring.attach(ring_name)
        producer.unlink()
    with pytest.raises(ShmlogError, match="no ring named"):
        Ring.attach(ring_name)


def test_a_header_half_written_is_pending_not_of_another_version(ring_name):
    """Ring.create stamps the magic, then the version: the broker's liveness check,
    listing rings while many producers start, may read one in between."""
    with Ring.create(ring_name, 4096) as producer:
        assert maker_pid(ring_name) == os.getpid()
        header = np.frombuffer(producer._memory, np.uint8, count=R.HEADER_END)
        header[R.VERSION_OFFSET:R.VERSION_OFFSET + R.VERSION_SIZE] = 0    # magic only
        assert maker_pid(ring_name) == MAKER_PENDING
        header[R.VERSION_OFFSET] = R.VERSION + 1
        assert maker_pid(ring_name) == MAKER_UNKNOWN
        header[:] = 0
        assert maker_pid(ring_name) == MAKER_PENDING
        producer.unlink()


@pytest.mark.parametrize("capacity", [0, 1000, 4095, 6000, 1 << 32])
def test_invalid_capacities_are_rejected(ring_name, capacity):
    with pytest.raises(LocalProtocolError):
        Ring.create(ring_name, capacity)


def test_names_are_validated_and_unique(ring_name):
    with pytest.raises(LocalProtocolError):
        Ring.create("a/b", 4096)
    with Ring.create(ring_name, 4096) as ring:
        with pytest.raises(LocalProtocolError, match="already exists"):
            Ring.create(ring_name, 4096)
        ring.unlink()


@pytest.mark.parametrize("acknowledged", [2**40, 2**63 - 1, 3, -5])
def test_an_acknowledged_count_no_consumer_stores_is_not_taken(ring_name, acknowledged):
    """The count is input (another member of the data group can write the ring): one
    past the entries put, or gone back, acknowledges nothing and writes nothing past
    the producer's result buffers; a true count afterwards is taken again."""
    with Ring.create(ring_name, 4096) as producer, Ring.attach(ring_name) as consumer:
        assert producer.try_put(to(1), b"a") == 0
        assert producer.try_put(to(2), b"b") == 1
        consumer.next()
        consumer.complete(100)
        assert producer.result(0) == (100, -1)
        producer.words[R.ACKNOWLEDGED_WORD] = acknowledged
        assert producer.result(1) is None and producer.unacknowledged == 1
        producer.words[R.ACKNOWLEDGED_WORD] = 1
        consumer.next()
        consumer.complete(101)
        assert producer.result(1) == (101, -1)


# A wait that runs this long was not woken: its completion's wake-up was lost.
LOST_AFTER_S = 10.0


def test_a_producer_asleep_on_its_completions_is_woken_by_each(ring_name):
    """A producer sleeps on the acknowledged count, counted among the ring's
    completion sleepers; each completion stored wakes it, none is lost, and it gets
    up (the count back to 0) every time."""
    with Ring.create(ring_name, 4096) as producer, Ring.attach(ring_name) as consumer:
        for number in range(50):
            assert producer.try_put(to(number), b"x") == number
            consumer.next()
            woken: list = []

            def wait(woken=woken):
                woken.append((producer.await_completions(LOST_AFTER_S), time.monotonic()))
            waiter = threading.Thread(target=wait)
            asked = time.monotonic()
            waiter.start()
            deadline = time.monotonic() + LOST_AFTER_S
            while not producer.words[R.COMPLETION_SLEEPERS_WORD] and waiter.is_alive():
                assert time.monotonic() < deadline, "the producer never lay down"
                time.sleep(0.001)
            consumer.complete(number)
            waiter.join(LOST_AFTER_S + 5)
            [(found, at)] = woken
            assert found and at - asked < LOST_AFTER_S, f"the wake of completion {number} was lost"
            assert producer.result(number) == (number, -1)
            assert producer.words[R.COMPLETION_SLEEPERS_WORD] == 0
        consumer.release()
        producer.unlink()


@pytest.mark.parametrize("acknowledged", [2**40, -5])
def test_a_count_no_consumer_stores_does_not_end_a_producer_s_sleep(ring_name, acknowledged):
    with Ring.create(ring_name, 4096) as producer:
        assert producer.try_put(to(1), b"a") == 0
        producer.words[R.ACKNOWLEDGED_WORD] = acknowledged
        assert not producer.await_completions(0.01)
        producer.unlink()
