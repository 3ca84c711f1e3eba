"""The appender's seam for forwarding (cluster mode: a producer whose partition is led
by another broker): entries bound for a partition this broker does not lead are
handed to a forwarder as private copies, their ring space released at once, their
completions parked as external until ``resolve_forwarded`` gives the leader's answer;
completions stay in ring order (a resolved entry behind a still-parked one waits, and
so does an entry appended here behind a forwarded one); what the leader would refuse
for the bytes alone is refused here, never forwarded.

Method: real rings in /dev/shm, a real state table and real partition logs on disk,
all in this process; the forwarder is a list the test resolves from. What the
producer side of each ring sees (results, the acknowledged count, the head) is
checked.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode, ForwardedEntry, HighWatermarkPolicy
from shmlog.record.records import BatchStatus, encode_batch
from shmlog.ring import Ring, put_entry
from shmlog.shm import ring_layout as R
from shmlog.shm import shared_memory
from shmlog.shm.state import PartitionStateTable, bells_name


@pytest.fixture
def world(tmp_path):
    """A log manager with topics "led" and "elsewhere" (led by another broker), a
    state table, an appender whose forwarder collects entries, and a ring factory."""
    prefix = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    names = [prefix + "-state", bells_name(prefix + "-state")]
    logs = LogManager(str(tmp_path / "data"))
    table = PartitionStateTable.create(names[0], 16)
    appender = Appender(logs, table)
    for topic in ("led", "elsewhere"):
        logs.create_topic(topic)
        appender.register_partition(topic, 0)
    appender.set_is_leader(appender.row_of("elsewhere", 0), False)
    forwarded: list[ForwardedEntry] = []
    appender.set_forwarder(forwarded.append)

    def ring(awaits_high_watermark=False):
        name = f"{prefix}-ring{len(names)}"
        names.append(name)
        producer = Ring.create(name, 1 << 16)
        appender.add_ring(Ring.attach(name), awaits_high_watermark=awaits_high_watermark)
        return producer

    yield appender, forwarded, ring
    logs.close()
    for name in names:
        shared_memory.unlink(name)


def put(producer: Ring, appender: Appender, topic: str, payload) -> int:
    return producer.put(appender.destination(topic, 0), payload, 1000)


def acknowledged(producer: Ring) -> int:
    return int(producer.words[R.ACKNOWLEDGED_WORD])


def test_forwarded_entries_release_their_space_at_once_and_complete_in_ring_order(world):
    appender, forwarded, ring = world
    producer = ring()
    payloads = [encode_batch([b"v%d" % n]) for n in range(3)]
    for payload in payloads:
        put(producer, appender, "elsewhere", payload)
    assert appender.drain() == 3
    assert [entry.number for entry in forwarded] == [0, 1, 2]
    assert [entry.batch.tobytes() for entry in forwarded] == [p.tobytes() for p in payloads]
    assert {(entry.ring, entry.row, entry.partition, entry.awaits_high_watermark)
            for entry in forwarded} == {(0, appender.row_of("elsewhere", 0), 0, False)}
    assert forwarded[0].topic_key == appender.destination("elsewhere", 0).topic_key
    assert producer.words[R.HEAD_WORD] == producer.words[R.TAIL_WORD], \
        "the space goes back at once: the forwarder holds copies"
    assert acknowledged(producer) == 0
    assert appender.resolve_forwarded(0, 2, 12, 777)
    assert appender.resolve_forwarded(0, 1, 11, -1)
    assert acknowledged(producer) == 0, "resolved behind a still-parked one: it waits"
    assert appender.resolve_forwarded(0, 0, 10, -1)
    assert acknowledged(producer) == 3
    assert [producer.result(n) for n in range(3)] == [(10, -1), (11, -1), (12, 777)]
    assert appender.logs.partition_log("elsewhere", 0).log_end_offset == 0, \
        "nothing of a forwarded batch is appended here"


def test_an_entry_appended_here_waits_behind_a_forwarded_one(world):
    appender, forwarded, ring = world
    producer = ring()
    put(producer, appender, "elsewhere", encode_batch([b"away"]))
    put(producer, appender, "led", encode_batch([b"here"]))
    assert appender.drain() == 2
    assert appender.logs.partition_log("led", 0).log_end_offset == 1, "appended at once"
    assert acknowledged(producer) == 0, "its completion keeps ring order"
    assert appender.resolve_forwarded(0, 0, -CompletionCode.REQUEST_TIMED_OUT, -1)
    assert [producer.result(n) for n in range(2)] == \
        [(-CompletionCode.REQUEST_TIMED_OUT, -1), (0, -1)]


def test_an_acks_all_entry_completes_with_the_leaders_answer_not_a_local_watermark(world):
    appender, forwarded, ring = world
    producer = ring(awaits_high_watermark=True)
    row = appender.row_of("elsewhere", 0)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    appender.set_under_min_isr(row, True)          # a follower's flag is not its to read
    put(producer, appender, "elsewhere", encode_batch([b"v"]))
    appender.drain()
    assert forwarded[0].awaits_high_watermark
    assert appender.parked_count(row) == 0, "no high watermark here decides it"
    appender.refuse_parked(row, CompletionCode.NOT_LEADER_OR_FOLLOWER)
    assert acknowledged(producer) == 0, "refusing the row's parked entries leaves it"
    assert appender.resolve_forwarded(0, 0, 42, -1)
    assert producer.result(0) == (42, -1)


def test_resolving_what_does_not_wait_changes_nothing(world):
    appender, forwarded, ring = world
    producer = ring()
    put(producer, appender, "led", encode_batch([b"here"]))
    put(producer, appender, "elsewhere", encode_batch([b"away"]))
    appender.drain()
    assert not appender.resolve_forwarded(0, 0, 5, -1), "appended here: not forwarded"
    assert not appender.resolve_forwarded(0, 7, 5, -1), "no such entry"
    assert not appender.resolve_forwarded(3, 1, 5, -1), "no such ring"
    assert appender.resolve_forwarded(0, 1, 5, -1)
    assert not appender.resolve_forwarded(0, 1, 6, -1), "resolved once"
    assert [producer.result(n) for n in range(2)] == [(0, -1), (5, -1)]
    attached = appender.ring_at(0)
    appender.remove_ring(0)
    assert appender.ring_at(0) is None and attached is not None
    assert not appender.resolve_forwarded(0, 1, 5, -1)


def test_bytes_the_leader_would_refuse_are_refused_here_and_not_forwarded(world):
    appender, forwarded, ring = world
    producer = ring()
    corrupt = encode_batch([b"v"]).copy()
    corrupt[-1] ^= 0xFF
    two = np.concatenate([encode_batch([b"a"]), encode_batch([b"b"])])
    put(producer, appender, "elsewhere", corrupt)
    put(producer, appender, "elsewhere", two)
    put(producer, appender, "elsewhere", encode_batch([b"fine"]))
    appender.drain()
    assert [entry.number for entry in forwarded] == [2]
    assert producer.result(0) == (-BatchStatus.BAD_CRC, -1)
    assert producer.result(1) == (-CompletionCode.NOT_ONE_BATCH, -1)


def test_without_a_forwarder_an_entry_for_a_partition_led_elsewhere_is_refused(world):
    appender, forwarded, ring = world
    appender.set_forwarder(None)
    producer = ring()
    put(producer, appender, "elsewhere", encode_batch([b"v"]))
    appender.drain()
    assert forwarded == []
    assert producer.result(0) == (-CompletionCode.NOT_LEADER_OR_FOLLOWER, -1)


def test_forwarded_completions_are_bounded_by_the_completion_slots(world):
    """One more entry than the slots (put past Ring's own check) is not read until
    a forwarded completion is resolved."""
    appender, forwarded, ring = world
    producer = ring()
    to = appender.destination("elsewhere", 0)
    for n in range(R.COMPLETION_SLOTS):
        put(producer, appender, "elsewhere", encode_batch([b"v%d" % n]))
    extra = encode_batch([b"one too many"])
    assert put_entry(producer.words, producer.data, producer.capacity, *to, extra, 0,
                     extra.size) == 0
    appender.drain()
    assert len(forwarded) == R.COMPLETION_SLOTS, "a full queue stops the ring being read"
    assert appender.resolve_forwarded(0, 0, 0, -1)
    appender.drain()
    assert len(forwarded) == R.COMPLETION_SLOTS + 1
