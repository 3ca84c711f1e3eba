"""The producer's per-record path against a real broker: the batches ``send``
gathers and encodes at ship time are, byte for byte, what the reference encoder
makes of the same records (every field combination, default and explicit
timestamps, zstd, with and without a producer id and its sequences); sends from
several threads at once lose nothing and keep each thread's order; and a fresh
process that made a Producer compiles or loads no kernel while it sends, flushes
and reads results.

Method: ``Broker`` runs the real broker as a child process on a temporary data
directory. Stored batches are read back from the log after the broker stopped and
compared with ``tests/reference.py`` (base offset, producer id, epoch and sequence
taken from what the producer reported). The warm-up test runs a child process
that snapshots the signatures of every numba dispatcher in ``shmlog`` after the
Producer is made and again after sends of every shape.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from shmlog import LogManager
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import ClientClosedError, RecordTooLargeError, RingFullError
from shmlog.record.records import iter_batches
from shmlog.server.broker import Broker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests/reference.py
from reference import reference_encode  # noqa: E402

DEADLINE_S = 120


def stored_batches(data_dir, topic: str, partition: int) -> list[tuple]:
    """(header, bytes) of every batch in the partition's log."""
    with LogManager(data_dir) as logs:
        data = logs.partition_log(topic, partition).read(0, max_bytes=1 << 24).data
        return [(info, bytes(data[info.position:info.position + info.batch_length]))
                for info in iter_batches(data)]


def every_field_combination() -> list[tuple]:
    """(key, value, headers, timestamp_ms) covering null, empty and set keys and
    values (bytes, bytearray, memoryview), no/empty/several headers with null and
    empty values, default and explicit timestamps (out of order, the extremes)."""
    keys = [None, b"", b"key", bytearray(b"from a bytearray")]
    values = [None, b"", b"v" * 100, memoryview(b"from a memoryview")]
    headers = [None, [], [("trace", b"abc"), ("null", None), ("", b""), ("ключ", b"\x00")]]
    timestamps = [None, 1_700_000_000_000, None, -1, 2**63 - 2, 5]
    combinations = []
    for number, (key, value, header) in enumerate(
            (key, value, header) for key in keys for value in values for header in headers):
        combinations.append((key, value, header, timestamps[number % len(timestamps)]))
    return combinations


def as_reference_record(sent: tuple, timestamp: int) -> tuple:
    key, value, headers, _ = sent
    return (timestamp, None if key is None else bytes(key),
            None if value is None else bytes(value), list(headers or []))


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_sent_batches_are_the_reference_encoders_bytes(data_dir, compression, idempotent):
    sent = every_field_combination()
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        # Small batches: the records span several, so sequences move on between them.
        with Producer(data_dir, compression=compression, batch_size=1024, linger_ms=60_000,
                      enable_idempotence=idempotent) as producer:
            before = time.time_ns() // 1_000_000
            futures = [producer.send("t", value, key=key, headers=headers, partition=0,
                                     timestamp_ms=timestamp)
                       for key, value, headers, timestamp in sent]
            after = time.time_ns() // 1_000_000
            metadata = [future.get(timeout=DEADLINE_S) for future in futures]
            identity = (producer.producer_id, producer.producer_epoch)
    assert [meta.offset for meta in metadata] == list(range(len(sent)))
    for meta, (_, _, _, timestamp) in zip(metadata, sent):
        if timestamp is None:
            assert before <= meta.timestamp <= after, "the send's own clock (CreateTime)"
        else:
            assert meta.timestamp == timestamp
    batches = stored_batches(data_dir, "t", 0)
    assert len(batches) > 3, "the records must span several batches"
    assert sum(info.record_count for info, _ in batches) == len(sent)
    for info, stored in batches:
        records = [as_reference_record(sent[offset], metadata[offset].timestamp)
                   for offset in range(info.base_offset, info.base_offset + info.record_count)]
        producer_fields = {"producer_id": -1, "producer_epoch": -1, "base_sequence": -1}
        if idempotent:
            producer_fields = {"producer_id": identity[0], "producer_epoch": identity[1],
                               "base_sequence": info.base_offset}
        assert stored == reference_encode(records, base_offset=info.base_offset,
                                          compression=compression, **producer_fields)


def test_send_batch_and_send_make_the_same_bytes(data_dir):
    records = [(b"k", b"v", [("h", None)], 10), (None, b"w", [], 11), (b"", None, [], 9)]
    with Broker(data_dir):
        Admin(data_dir).create_topic("t", 2)
        with Producer(data_dir, linger_ms=60_000, enable_idempotence=False) as producer:
            for key, value, headers, timestamp in records:
                producer.send("t", value, key=key, headers=headers, partition=0,
                              timestamp_ms=timestamp)
            producer.flush()
            producer.send_batch("t", [r[1] for r in records], keys=[r[0] for r in records],
                                headers=[r[2] for r in records], partition=1,
                                timestamp_ms=10).get(timeout=DEADLINE_S)
    (_, by_send), = stored_batches(data_dir, "t", 0)
    (_, by_send_batch), = stored_batches(data_dir, "t", 1)
    assert by_send == reference_encode([(r[3], r[0], r[1], r[2]) for r in records])
    assert by_send_batch == reference_encode([(10, r[0], r[1], r[2]) for r in records])


def test_sends_from_many_threads_lose_nothing_and_keep_each_threads_order(data_dir):
    threads_count, per_thread = 6, 3000
    futures = {number: [] for number in range(threads_count)}
    errors = []

    def sender(producer, number):
        try:
            for sequence in range(per_thread):
                # Unkeyed (sticky), keyed and explicitly placed records, interleaved.
                key = b"key-%d" % number if sequence % 3 == 1 else None
                partition = number % 3 if sequence % 3 == 2 else None
                value = b"%d:%d" % (number, sequence)
                futures[number].append(
                    (value, producer.send("t", value, key=key, partition=partition)))
                if sequence % 1000 == 999:
                    producer.flush(timeout=DEADLINE_S)
        except Exception as error:                       # reported by the main thread
            errors.append(error)

    with Broker(data_dir):
        Admin(data_dir).create_topic("t", 3)
        with Producer(data_dir, batch_size=2048, linger_ms=1) as producer:
            threads = [threading.Thread(target=sender, args=(producer, number))
                       for number in range(threads_count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=DEADLINE_S)
                assert not thread.is_alive()
            assert not errors, errors
            placed = {(meta.partition, meta.offset): value
                      for sent in futures.values() for value, future in sent
                      for meta in [future.get(timeout=DEADLINE_S)]}
    assert len(placed) == threads_count * per_thread, "every record has its own offset"
    with LogManager(data_dir) as logs:
        from helpers import all_records
        stored = {partition: all_records(logs.partition_log("t", partition))
                  for partition in range(3)}
    assert sum(len(records) for records in stored.values()) == threads_count * per_thread
    for (partition, offset), value in placed.items():
        assert stored[partition][offset].value == value
    for partition, records in stored.items():
        for number in range(threads_count):
            mine = [int(r.value.split(b":")[1]) for r in records
                    if r.value.startswith(b"%d:" % number)]
            assert mine == sorted(mine), f"thread {number}'s order in partition {partition}"


def test_a_record_above_a_lowered_limit_is_refused_at_the_call(data_dir, monkeypatch):
    """A batch gathering under the old max.message.bytes must not take a record the
    new one refuses, once the producer has read the new one: the send raises."""
    import shmlog.common.limits
    with Broker(data_dir):
        admin = Admin(data_dir)
        admin.create_topic("t", 2, {"max.message.bytes": 1 << 20})
        with Producer(data_dir, batch_size=1 << 20, linger_ms=60_000) as producer:
            gathering = producer.send("t", b"small", partition=0)
            admin.alter_topic_config("t", set={"max.message.bytes": 4096})
            # The next batch shipped finds the metadata old (metadata.max.age.ms).
            monkeypatch.setattr(shmlog.common.limits, "METADATA_MAX_AGE_S", 0.0)
            producer.send("t", b"other", partition=1).get(timeout=DEADLINE_S)
            with pytest.raises(RecordTooLargeError, match=r"max.message.bytes \(4096\)"):
                producer.send("t", b"x" * 5000, partition=0)
            assert gathering.get(timeout=DEADLINE_S).offset == 0


def test_records_still_gathering_when_close_gives_up_fail_their_futures(data_dir):
    """As Kafka's close: what it could not send fails. A flush that meets a full ring
    (the broker is stopped) leaves a batch gathering; its future must fail, not wait
    forever, and the producer takes no more records."""
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t", 3)
        producer = Producer(data_dir, ring_size=4096, max_block_ms=0, linger_ms=60_000)
        futures = [producer.send("t", b"x" * 3000, partition=partition)
                   for partition in range(3)]
        os.kill(broker.process.pid, signal.SIGSTOP)
        try:
            # The first batch fills the ring; the second finds it full; the third
            # was still gathering when the flush gave up.
            with pytest.raises(RingFullError):
                producer.close()
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
        with pytest.raises(RingFullError):
            futures[1].get(timeout=DEADLINE_S)
        with pytest.raises(ClientClosedError, match="closed before this record was sent"):
            futures[2].get(timeout=DEADLINE_S)
        with pytest.raises(ClientClosedError):
            producer.send("t", b"after close", partition=0)



def test_linger_zero_ships_at_once_and_gathers_behind_a_batch_in_the_ring(data_dir):
    """linger.ms=0 as Kafka's sender: a record ships at once when nothing of its
    partition is waiting in the ring, and the records sent while a batch is waiting
    (the broker is stopped) ship together, as one batch, once it is appended."""
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, linger_ms=0) as producer:
            os.kill(broker.process.pid, signal.SIGSTOP)
            try:
                futures = [producer.send("t", b"first", partition=0)]
                futures += [producer.send("t", b"behind %d" % number, partition=0)
                            for number in range(9)]
            finally:
                os.kill(broker.process.pid, signal.SIGCONT)
            assert [future.get(timeout=DEADLINE_S).offset for future in futures] == \
                list(range(10))
            # Nothing waits in the ring now: the next record goes without a flush.
            producer.send("t", b"alone", partition=0)
            with Consumer(bootstrap=data_dir) as consumer:
                consumer.assign([TopicPartition("t", 0)])
                deadline = time.monotonic() + DEADLINE_S
                while consumer.end_offsets([TopicPartition("t", 0)])[TopicPartition("t", 0)] < 11:
                    assert time.monotonic() < deadline, "the record never shipped"
                    time.sleep(0.01)
    assert [info.record_count for info, _ in stored_batches(data_dir, "t", 0)] == [1, 9, 1]


CHILD = textwrap.dedent("""
    import json, sys
    import numba.core.registry
    import numpy as np
    import shmlog
    from shmlog.client.producer import Producer

    def signatures():
        found = {}
        for name, module in list(sys.modules.items()):
            if name == "shmlog" or name.startswith("shmlog."):
                for attribute, value in vars(module).items():
                    if isinstance(value, numba.core.registry.CPUDispatcher):
                        found[f"{name}.{attribute}"] = sorted(map(str, value.signatures))
        return found

    data_dir = sys.argv[1]
    producers = [Producer(data_dir, linger_ms=1), Producer(data_dir, compression="zstd"),
                 Producer(data_dir, acks=0, linger_ms=0)]
    before = signatures()
    futures = []
    for producer in producers:
        send = producer.send
        futures += [send("t", b"unkeyed"), send("t", b"placed", partition=1),
                    send("t", b"keyed", key=b"user-1"), send("t", b"long key", key=b"k" * 500),
                    send("t", None, key=bytearray(b"tombstone")),
                    send("t", memoryview(b"headers"), headers=[("a", b"1"), ("n", None)]),
                    send("t", b"stamped", timestamp_ms=1_700_000_000_000, partition=0),
                    producer.send_batch("t", [b"a", None], keys=[b"k", None],
                                        headers=[[("h", b"")], []], partition=0),
                    producer.send_batch("t", np.zeros((3, 8), np.uint8), partition=1)]
        futures[0].done()
        producer.flush()
    for future in futures:
        future.get(timeout=60)
    after = signatures()
    for producer in producers:
        producer.close()
    print(json.dumps({"before": before, "after": after}))
""")


def test_a_fresh_producer_loads_no_kernel_while_it_sends(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("t", 2)
        child = subprocess.run([sys.executable, "-c", CHILD, data_dir], capture_output=True,
                               text=True, timeout=DEADLINE_S)
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.splitlines()[-1])
    gained = {name: sorted(set(report["after"][name]) - set(report["before"].get(name, [])))
              for name in report["after"]}
    assert {name: new for name, new in gained.items() if new} == {}
    assert any(report["before"].values()), "the dispatchers were found"
