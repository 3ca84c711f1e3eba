"""Shared memory is input (issue 27): a word another process can write into a ring or
the state table costs its writer its ring, never the broker, another producer, or
another consumer's reads; a state-table word no broker publishes is a typed error
naming tampering, never an overflow, a false damaged-data error or silence.

Method: real brokers (``shmlog.Broker`` child processes), real producers and
consumers in this process, and words written straight into /dev/shm from this
process (the broker's own user, so it may write what a producer or, for the table,
only the broker's user or root could): a ring's tail, an entry's length and number,
a ring's head and capacity before it registers, a row's offsets, size and
generation. What the broker maps is read from ``/proc/<broker pid>/maps``. Every
wait is bounded; brokers are stopped and the shared memory removed (``data_dir``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer
from shmlog.client.producer import Producer
from shmlog.common.errors import CorruptRingError, StateTableInconsistentError
from shmlog.server.broker import Broker, request, shared_memory_prefix
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory
from shmlog.shm import state_layout as S

DEADLINE_S = 60
SHM = "/dev/shm"
RING_SIZE = 1 << 16


def _mapped(broker: Broker, name: str) -> bool:
    with open(f"/proc/{broker.process.pid}/maps") as maps:
        return any(line.rstrip().endswith(f"{SHM}/{name}") for line in maps)


def _wait_unmapped(broker: Broker, name: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while _mapped(broker, name):
        assert broker.process.poll() is None, "the broker exited"
        assert time.monotonic() < deadline, f"the broker still maps {name}"
        time.sleep(0.05)


def _drain(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=50).values():
            values += [record.value for record in records]
    return values


def _unaffected(data_dir: str, sent: list[bytes]) -> None:
    """Another producer still writes, and a consumer reads every record of "t"."""
    with Producer(data_dir, ring_size=RING_SIZE) as honest:
        honest.send("t", b"after", partition=0).get(timeout=DEADLINE_S)
    with Consumer("t", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        assert _drain(consumer, len(sent) + 1) == sent + [b"after"]


def _tail_past_capacity(words, data):
    words[R.TAIL_WORD] += 2 * RING_SIZE


def _tail_behind_head(words, data):
    words[R.TAIL_WORD] = -R.ENTRY_ALIGNMENT


def _entry(length: int, number: int):
    """Write an entry header at the tail (``length`` claimed, ``number``) and
    publish ``R.ENTRY_HEADER_LENGTH`` bytes."""
    def scribble(words, data):
        tail = int(words[R.TAIL_WORD])
        position = tail & (RING_SIZE - 1)
        header = np.zeros(R.ENTRY_HEADER_LENGTH, np.uint8)
        header[:4] = np.frombuffer(np.uint32(length).tobytes(), np.uint8)
        header[8:16] = np.frombuffer(np.int64(number).tobytes(), np.uint8)
        data[position:position + R.ENTRY_HEADER_LENGTH] = header
        words[R.TAIL_WORD] = tail + R.ENTRY_HEADER_LENGTH
    return scribble


@pytest.mark.parametrize("scribble", [
    _tail_past_capacity, _tail_behind_head,
    _entry(8, 0),                                  # shorter than an entry's header
    _entry(1 << 20, 0),                            # runs past the tail and the region
    _entry(R.ENTRY_HEADER_LENGTH, -1),             # a negative entry number
], ids=["tail-past-capacity", "tail-behind-head", "length-too-short", "length-past-tail",
        "negative-number"])
def test_a_ring_word_out_of_range_costs_its_ring_not_the_broker(data_dir, scribble):
    """The producer's words of a registered ring, written out of range: the broker
    stops reading (unmaps) that ring and carries on; what was acknowledged before
    stays, and other producers and consumers do not notice."""
    with Broker(data_dir, liveness_check_interval_ms=50) as broker:
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, ring_size=RING_SIZE) as scribbler:
            scribbler.send("t", b"before", partition=0).get(timeout=DEADLINE_S)
            ring = scribbler.ring
            scribble(ring.words, ring.data)
            _wait_unmapped(broker, ring.name)
            assert scribbler.ring.consumer_error != 0
        _unaffected(data_dir, [b"before"])
        assert broker.process.poll() is None
        assert broker.stop() == 0


def _make_ring(name: str, capacity: int, head: int) -> None:
    """A ring object as a producer could make it: its header says ``capacity``, its
    head word ``head``; the object holds ``capacity`` data bytes."""
    mapped = shared_memory.create(name, R.DATA_OFFSET + capacity, "ring")
    shared_memory.write_magic_and_version(mapped, R.MAGIC, R.VERSION)
    words = np.frombuffer(mapped, np.int64, count=R.CONTROL_SIZE // R.WORD_SIZE)
    words[R.CAPACITY_WORD] = capacity
    words[R.PRODUCER_PID_WORD] = os.getpid()
    words[R.HEAD_WORD] = words[R.TAIL_WORD] = head
    del words
    mapped.close()


@pytest.mark.parametrize("capacity, head", [
    (RING_SIZE, 7),                 # an entry would start 1 byte before the region's end
    (RING_SIZE, -RING_SIZE),        # a negative count of released bytes
    (3 * 4096, 0),                  # not a power of two: positions are taken by mask
], ids=["unaligned-head", "negative-head", "capacity-not-a-power-of-two"])
def test_a_ring_whose_header_lies_is_refused_at_registration(data_dir, capacity, head):
    """A ring whose head or capacity no ring can have is refused when it registers
    (CorruptRingError to its producer), never drained; the broker serves on."""
    with Broker(data_dir, liveness_check_interval_ms=50) as broker:
        Admin(data_dir).create_topic("t")
        name = f"{shared_memory_prefix(data_dir)}-liar"
        _make_ring(name, capacity, head)
        with pytest.raises(CorruptRingError):
            request(data_dir, "register_producer", ring=name)
        assert not _mapped(broker, name)
        with Producer(data_dir, ring_size=RING_SIZE) as honest:
            honest.send("t", b"before", partition=0).get(timeout=DEADLINE_S)
        _unaffected(data_dir, [b"before"])
        shared_memory.unlink(name)
        assert broker.stop() == 0


def _row_of(data_dir: str, topic: str) -> int:
    return next(partition["row"] for entry in request(data_dir, "metadata")["topics"]
                if entry["name"] == topic for partition in entry["partitions"]
                if partition["partition"] == 0)


@pytest.mark.parametrize("word, value", [
    (S.HIGH_WATERMARK_WORD, 2**63 - 1),
    (S.LOG_START_OFFSET_WORD, -7),
    (S.ACTIVE_SEGMENT_SIZE_WORD, -5),
    (S.ACTIVE_SEGMENT_SIZE_WORD, 1 << 40),
    (S.ACTIVE_SEGMENT_BASE_OFFSET_WORD, 1 << 62),
    (S.SEGMENT_GENERATION_WORD, -1),
], ids=["high-watermark-max", "log-start-negative", "size-negative", "size-too-large",
        "base-past-log-end", "generation-negative"])
def test_a_row_word_no_broker_publishes_is_a_tampering_error(data_dir, word, value):
    """Only the broker's user or root can write the table (the group maps it
    read-only); a row word written out of range by one of them is, for its readers,
    StateTableInconsistentError naming tampering, and the other rows read on."""
    with Broker(data_dir) as broker:
        admin = Admin(data_dir)
        admin.create_topic("t")
        admin.create_topic("other")
        with Producer(data_dir, ring_size=RING_SIZE) as producer:
            for topic in ("t", "other"):
                producer.send(topic, b"x", partition=0).get(timeout=DEADLINE_S)
        table = shared_memory_prefix(data_dir) + "-state"
        mapped = shared_memory.attach(table, S.ROWS_OFFSET + S.ROW_SIZE, "state table")
        try:
            rows = np.frombuffer(mapped, np.int64, offset=S.ROWS_OFFSET)
            rows[S.row_word(_row_of(data_dir, "t"), word)] = value
            del rows
        finally:
            mapped.close()
        with Consumer("t", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            with pytest.raises(StateTableInconsistentError, match="tampered"):
                _drain(consumer, 1)
        with Consumer("other", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            assert _drain(consumer, 1) == [b"x"]
        assert broker.stop() == 0
