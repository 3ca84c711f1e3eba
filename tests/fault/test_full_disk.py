"""A full disk is an error, never a crash: a broker whose data directory fills up
refuses appends with ``StorageError``, keeps serving reads and control requests,
loses no acknowledged record, and takes appends again once space is freed.

Method: a small tmpfs is mounted for each broker (mounting needs root: the test
skips, saying so, when it is not permitted); a real broker serves a data directory
on it. A topic with small segments is created, then, round after round, a ballast
file takes all the free space but a slack that differs from round to round, so
the disk fills at different points: before the first byte, inside a segment, at a
roll, where an index needs its first page. Each round produces one batch at a time
(each acknowledged before the next) until the broker refuses one. The broker must
still be running (a SIGBUS would have killed it), the refusal must be a
``StorageError``, a control request must be answered, and a consumer must read
every record acknowledged so far, intact. Then the ballast is deleted and a new
producer's batch must be acknowledged. ``--fault-runs N`` fills the disk N times
(16 by default, four per broker; more for a soak run).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random

from helpers import fill_disk
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import ShmlogError, StorageError
from shmlog.server.broker import Broker

SEGMENT_BYTES = 256 << 10
RECORDS_PER_BATCH = 40
RECORD_SIZE = 100              # ~4 KiB batches: about an index entry per batch
TIMEOUT_S = 30
TOPIC = "full"
ROUNDS_PER_BROKER = 4
PAGE = mmap.PAGESIZE
# A segment as the disk sees it: its log and a page of each index.
SEGMENT_FOOTPRINT = SEGMENT_BYTES + 2 * PAGE
# Free space left beside the ballast. The first round of each broker starts on an
# empty partition, so its slack lands exactly: room for a segment's log but not
# (or only half) its index pages, after zero or a few whole segments. Later rounds
# start where the previous one stopped and land wherever that takes them.
SLACKS = [SEGMENT_BYTES + 100, 0, 1000, 100_000,
          SEGMENT_BYTES + PAGE + 100, 4096, 6000, 530_000,
          2 * SEGMENT_FOOTPRINT + SEGMENT_BYTES + 2000, 300_000, 1 << 20, SEGMENT_BYTES,
          3 * SEGMENT_FOOTPRINT + SEGMENT_BYTES + PAGE, 40_000, 1_500_000, SEGMENT_BYTES - 1]


def pytest_generate_tests(metafunc):
    if "slacks" in metafunc.fixturenames:
        runs = metafunc.config.getoption("fault_runs")
        more = random.Random(11)
        slacks = (SLACKS + [more.randrange(0, 3 << 20) for _ in range(runs)])[:runs]
        brokers = [slacks[start:start + ROUNDS_PER_BROKER]
                   for start in range(0, len(slacks), ROUNDS_PER_BROKER)]
        metafunc.parametrize("slacks", brokers, ids=[f"broker{n}" for n in range(len(brokers))])


def batch_values(number: int) -> list[bytes]:
    return [f"batch {number} record {index} ".encode().ljust(RECORD_SIZE, b"#")
            for index in range(RECORDS_PER_BATCH)]


def send(producer, broker, values):
    """Send one batch and wait for it: its base offset."""
    try:
        return producer.send_batch(TOPIC, values, partition=0).get(timeout=TIMEOUT_S).base_offset
    except StorageError:
        raise
    except ShmlogError:
        assert broker.process.poll() is None, \
            f"the broker died (status {broker.process.returncode}) as the disk filled"
        raise


def produce_until_refused(producer, broker, acknowledged: dict) -> StorageError:
    """Batches one at a time until one is refused (the refusal); every batch
    acknowledged goes into ``acknowledged`` (offset -> value)."""
    for number in range(len(acknowledged), len(acknowledged) + 10_000):
        values = batch_values(number)
        try:
            base_offset = send(producer, broker, values)
        except StorageError as error:
            return error
        acknowledged.update(zip(range(base_offset, base_offset + len(values)), values))
    raise AssertionError("a 16 MiB disk took 10 000 batches without filling")


def read_all(data_dir, count: int) -> dict[int, bytes]:
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        records = {}
        for _ in range(2000):
            for batch in consumer.poll(timeout_ms=20).values():
                records.update((record.offset, record.value) for record in batch)
            if len(records) >= count:
                break
        return records


@contextlib.contextmanager
def producing(data_dir):
    producer = Producer(data_dir, linger_ms=0)
    try:
        yield producer
    finally:
        with contextlib.suppress(ShmlogError):      # a dead broker acknowledges nothing
            producer.close(timeout=TIMEOUT_S)


def test_a_full_disk_refuses_appends_and_keeps_every_acknowledged_record(
        small_disk, data_dir, slacks):
    broker = Broker(data_dir)
    acknowledged: dict[int, bytes] = {}
    with broker:
        Admin(data_dir).create_topic(TOPIC, 1, {"segment.bytes": SEGMENT_BYTES})
        for slack in slacks:
            # Registered before the disk fills: a producer id block is written to disk.
            with producing(data_dir) as producer:
                ballast = fill_disk(small_disk, slack)
                refusal = produce_until_refused(producer, broker, acknowledged)
                assert broker.process.poll() is None, \
                    f"the broker died (status {broker.process.returncode}) with {slack} bytes free"
                assert "could not write" in str(refusal)
                assert Admin(data_dir).list_topics() == [TOPIC], "control requests are answered"
                assert read_all(data_dir, len(acknowledged)) == acknowledged

                os.unlink(ballast)
                # The same producer goes on (KIP-360): the refusal did not poison its
                # sequence for the partition.
                values = [b"after %d bytes were left" % slack]
                base_offset = send(producer, broker, values)
            assert base_offset == len(acknowledged), "the refused batches left no trace"
            acknowledged[base_offset] = values[0]
        assert read_all(data_dir, len(acknowledged)) == acknowledged
    assert broker.process.returncode == 0, "the broker stops cleanly"
