"""End-transaction markers and the transactional bit (``record/control.py``): a marker
encodes and decodes to itself, passes the log's validation, and reads in Kafka's
layout (kafka-python's parser) as Kafka's broker writes it: a transactional control
batch whose one record has Kafka's key and value bytes. A transactional batch is
transactional and not control there, a plain batch neither. What is no marker is a
typed refusal.

Method: batches built in memory; kafka-python parses the Kafka side.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from kafka.record import MemoryRecords

from shmlog.common.errors import CorruptRecordError
from shmlog.record import batch_layout as B
from shmlog.record.batch_header import batch_info
from shmlog.record.control import (
    ControlType,
    EndTransactionMarker,
    decode_marker,
    encode_marker,
)
from shmlog.record.kafka_batches import to_kafka
from shmlog.record.records import BatchStatus, check_batch, encode_batch, validate_batches

MARKERS = [EndTransactionMarker(producer_id=42, producer_epoch=3, committed=True,
                                coordinator_epoch=7),
           EndTransactionMarker(producer_id=0, producer_epoch=0, committed=False,
                                coordinator_epoch=0),
           EndTransactionMarker(producer_id=2**40, producer_epoch=B.PRODUCER_EPOCH_MAX,
                                committed=False, coordinator_epoch=2**31 - 1)]


@pytest.mark.parametrize("marker", MARKERS, ids=["commit", "abort", "largest"])
def test_a_marker_round_trips_and_is_a_valid_control_batch(marker):
    batch = encode_marker(marker, timestamp_ms=1_700_000_000_000)
    assert decode_marker(batch) == marker
    [info] = validate_batches(batch)
    assert info.is_control and info.is_transactional
    assert (info.record_count, info.base_sequence) == (1, B.NO_SEQUENCE)
    assert (info.producer_id, info.producer_epoch) == (marker.producer_id, marker.producer_epoch)


def test_a_marker_reads_in_kafkas_layout_as_kafkas_broker_writes_it():
    kafka = MemoryRecords(bytes(to_kafka(encode_marker(MARKERS[0])))).next_batch()
    assert kafka.validate_crc()
    assert kafka.is_control_batch and kafka.is_transactional
    assert (kafka.producer_id, kafka.producer_epoch) == (42, 3)
    [record] = list(kafka)
    assert struct.unpack(">hh", record.key) == (0, ControlType.COMMIT)
    assert struct.unpack(">hi", record.value) == (0, 7)


@pytest.mark.parametrize("transactional, expected", [(True, (True, False)),
                                                     (False, (False, False))],
                         ids=["transactional", "plain"])
def test_the_transactional_bit_reaches_kafka_without_the_control_bit(transactional, expected):
    stored = encode_batch([b"v"], producer_id=5, producer_epoch=1, base_sequence=0,
                          transactional=transactional)
    assert batch_info(stored, 0).is_transactional is transactional
    kafka = MemoryRecords(bytes(to_kafka(stored))).next_batch()
    assert (kafka.is_transactional, kafka.is_control_batch) == expected


def _control_batch(key: bytes, value: bytes, count: int = 1) -> np.ndarray:
    return encode_batch([value] * count, keys=[key] * count, producer_id=1, producer_epoch=0,
                        control=True, transactional=True)


@pytest.mark.parametrize("batch, words", [
    (encode_batch([b"data"], producer_id=1, producer_epoch=0, base_sequence=0,
                  transactional=True), "not a transaction's control batch"),
    (encode_batch([b"\0\0\0\0\0\0"], keys=[b"\0\0\0\1"], control=True), "not a transaction's"),
    (_control_batch(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 0), count=2), "2 records"),
    (_control_batch(b"\0", struct.pack(">hi", 0, 0)), "too short"),
    (_control_batch(struct.pack(">hh", 0, 1), b"\0\0"), "too short"),
    (_control_batch(struct.pack(">hh", 0, 5), struct.pack(">hi", 0, 0)), "type 5"),
], ids=["data-batch", "control-not-transactional", "two-records", "short-key", "short-value",
        "unknown-type"])
def test_what_is_no_marker_is_refused(batch, words):
    with pytest.raises(CorruptRecordError, match=words):
        decode_marker(batch)


def test_validation_still_refuses_attribute_bits_it_does_not_know():
    batch = encode_batch([b"v"]).copy()
    attributes = int(batch[B.ATTRIBUTES_OFFSET:B.ATTRIBUTES_OFFSET + 2].view("<u2")[0])
    batch[B.ATTRIBUTES_OFFSET:B.ATTRIBUTES_OFFSET + 2] = \
        np.array([attributes | 0x40], "<u2").view(np.uint8)
    status, _ = check_batch(batch, 0, batch.size, False, False)
    assert status == BatchStatus.BAD_ATTRIBUTES


def test_consumers_skip_markers_and_dump_sees_them(open_log):
    """decode_columns is what a consumer reads: a marker's batch is checked but its
    record left out (Kafka's consumers skip control batches); ``control=True`` (dump,
    decode_marker) keeps it."""
    from shmlog.record.records import decode_columns
    partition_log = open_log()
    partition_log.append(encode_batch([b"a", b"b"], producer_id=3, producer_epoch=0,
                                      base_sequence=0, transactional=True))
    partition_log.append(encode_marker(EndTransactionMarker(3, 0, True, 1)))
    partition_log.append(encode_batch([b"c"]))
    data = partition_log.read(0, 1 << 20).data
    read = decode_columns(data, verified=True)
    assert [record.value for record in read.records()] == [b"a", b"b", b"c"]
    assert list(read.offsets) == [0, 1, 3]
    everything = decode_columns(data, verified=True, control=True)
    assert list(everything.offsets) == [0, 1, 2, 3]
    assert decode_columns(data, start_offset=2, verified=True).offsets.tolist() == [3]
