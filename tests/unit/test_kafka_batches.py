"""Kafka's record batch v2 to shmlog's layout and back: batches built by kafka-python's
own builder (none, gzip, zstd; null and empty keys and values; headers; idempotent
fields) become shmlog batches that shmlog's decoder and validation read with every
field equal; shmlog batches (zstd too) become Kafka batches that kafka-python parses
with a valid CRC; both ways round trip; and hostile bytes (flips, truncations, a
second batch, snappy and lz4, a control batch) are typed refusals, never crashes or
other exceptions; a transactional batch keeps its bit both ways.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from shmlog.common import limits
from shmlog.common.errors import CorruptRecordError, UnsupportedCodecError
from shmlog.record import records as R
from shmlog.record.batch_layout import BATCH_HEADER_DTYPE, TRANSACTIONAL_BIT
from shmlog.record.kafka_batches import KafkaBatchStatus, from_kafka, to_kafka
from shmlog.record.validation import BatchStatus

BASE_MS = 1_700_000_000_000
RECORDS = [(None, b"value-0", []), (b"k1", b"", []), (b"k2", None, []),
           (b"k3", b"value-3", [("h", b"x"), ("n", None)]), (b"", b"v" * 300, [("", b"")])]


def kafka_batch(records=RECORDS, codec: int = 0, producer=(-1, -1, -1),
                transactional: bool = False) -> bytes:
    producer_id, epoch, sequence = producer
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=transactional,
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
        batch_size=1 << 22)
    for index, (key, value, headers) in enumerate(records):
        builder.append(index, timestamp=BASE_MS + index, key=key, value=value, headers=headers)
    return bytes(builder.build())


def shmlog_fields(batch: np.ndarray) -> list[tuple]:
    return [(record.offset, record.key, record.value, record.headers, record.timestamp)
            for record in R.decode_records(batch)]


def kafka_fields(data) -> list[tuple]:
    records = MemoryRecords(bytes(data))
    found = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        found += [(record.offset, record.key, record.value,
                   [(name, value) for name, value in record.headers], record.timestamp)
                  for record in batch]
    return found


EXPECTED = [(index, key, value, headers, BASE_MS + index)
            for index, (key, value, headers) in enumerate(RECORDS)]


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_a_kafka_batch_is_stored_with_every_field(codec):
    stored = from_kafka(kafka_batch(codec=codec, producer=(7, 2, 40)))
    assert R.validate_batches(stored)                              # the appender's checks
    info = R.validate_batches(stored)[0]
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (7, 2, 40)
    assert info.compression.value == (0 if codec == 0 else 4)      # gzip is stored as zstd
    assert shmlog_fields(stored) == EXPECTED


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_stored_batch_goes_back_to_kafka_with_every_field(compression):
    keys = [key for key, _, _ in RECORDS]
    values = [value for _, value, _ in RECORDS]
    headers = [headers for _, _, headers in RECORDS]
    stored = R.encode_batch(values, keys=keys, headers=headers,
                            timestamps=[BASE_MS + index for index in range(len(RECORDS))],
                            compression=compression, producer_id=9, producer_epoch=1,
                            base_sequence=5)
    converted = to_kafka(stored)
    assert kafka_fields(converted) == EXPECTED
    batch = MemoryRecords(bytes(converted)).next_batch()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (9, 1, 5)


def test_a_run_of_batches_converts_whole_and_round_trips():
    run = np.concatenate([from_kafka(kafka_batch(codec=codec)) for codec in (0, 4, 0)])
    assert kafka_fields(to_kafka(run)) == EXPECTED * 3
    uncompressed = np.concatenate([from_kafka(kafka_batch()) for _ in range(3)])
    assert kafka_fields(to_kafka(uncompressed)) == EXPECTED * 3
    assert to_kafka(np.zeros(0, np.uint8)).size == 0


@pytest.mark.parametrize("codecs", [(0, 0, 0), (4, 0, 4)], ids=["none", "zstd"])
def test_a_budget_takes_whole_kafka_batches_and_at_least_the_first(codecs):
    run = np.concatenate([from_kafka(kafka_batch(codec=codec)) for codec in codecs])
    sizes = [to_kafka(from_kafka(kafka_batch(codec=codec))).size for codec in codecs]
    for budget, batches in ((-1, 3), (sum(sizes), 3), (sum(sizes) - 1, 2),
                            (sizes[0] + sizes[1], 2), (sizes[0], 1), (sizes[0] - 1, 1), (0, 1)):
        converted = to_kafka(run, budget)
        assert converted.size == sum(sizes[:batches])
        assert kafka_fields(converted) == EXPECTED * batches


def test_a_budget_counts_a_zstd_batch_inflated():
    # Stored: ~1 KB each; as Kafka's (uncompressed): ~1 MB each.
    run = np.concatenate([R.encode_batch([bytes(1000)] * 1000, compression="zstd")
                          for _ in range(4)])
    assert run.size < 20_000
    assert to_kafka(run).size > 4_000_000
    converted = to_kafka(run, 2_500_000)
    assert 2_000_000 < converted.size <= 2_500_000
    assert len(kafka_fields(converted)) == 2000


def test_stored_and_back_is_the_kafka_batch_byte_for_byte():
    original = kafka_batch(producer=(3, 0, 0))
    assert bytes(to_kafka(from_kafka(original))) == original


@pytest.mark.parametrize("codec, name", [(2, "snappy"), (3, "lz4")])
def test_snappy_and_lz4_are_refused_by_name(codec, name):
    data = bytearray(kafka_batch())
    data[22] |= codec                          # the codec bits, then a fresh CRC
    _recrc(data)
    with pytest.raises(UnsupportedCodecError, match=name):
        from_kafka(bytes(data))


def _recrc(data: bytearray) -> None:
    from shmlog.native.crc32c import crc32c
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")


@pytest.mark.parametrize("change, status", [
    (lambda data: data.__setitem__(30, data[30] ^ 1), KafkaBatchStatus.BAD_CRC),
    (lambda data: data.__setitem__(16, 1), KafkaBatchStatus.BAD_MAGIC),
    (lambda data: data.extend(data), KafkaBatchStatus.NOT_ONE_BATCH),
    (lambda data: data.__delitem__(slice(-3, None)), KafkaBatchStatus.TRUNCATED),
    (lambda data: data.__delitem__(slice(40, None)), KafkaBatchStatus.TRUNCATED),
])
def test_a_damaged_batch_is_refused_with_its_status(change, status):
    data = bytearray(kafka_batch())
    change(data)
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(bytes(data))
    assert refused.value.status == status


def test_a_transactional_batch_keeps_its_bit_both_ways():
    original = kafka_batch(producer=(7, 2, 5), transactional=True)
    stored = from_kafka(original)
    header = stored[:BATCH_HEADER_DTYPE.itemsize].view(BATCH_HEADER_DTYPE)[0]
    assert header["attributes"] & TRANSACTIONAL_BIT
    assert (header["producer_id"], header["producer_epoch"], header["base_sequence"]) == \
        (7, 2, 5)
    assert bytes(to_kafka(stored)) == original
    assert MemoryRecords(original).next_batch().is_transactional


def test_a_control_batch_is_refused_as_kafka_refuses_it_from_clients():
    data = bytearray(kafka_batch())
    data[22] |= 0x20                          # the control bit, then a fresh CRC
    _recrc(data)
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(bytes(data))
    assert refused.value.status == KafkaBatchStatus.CONTROL


def test_records_that_do_not_parse_are_refused_though_the_crc_matches():
    data = bytearray(kafka_batch())
    data[61] = 0x7F                            # the first record's length, past the end
    _recrc(data)
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(bytes(data))
    assert refused.value.status == KafkaBatchStatus.BAD_RECORDS


@pytest.mark.parametrize("field", [slice(23, 27), slice(57, 61)],
                         ids=["last_offset_delta", "record_count"])
def test_an_i32_field_with_its_high_bit_set_is_refused_not_overflowed(field):
    # Found by the fuzz below: np.int32 of the field's u32 raised OverflowError.
    data = bytearray(kafka_batch())
    data[field] = (0x80000004).to_bytes(4, "big")
    _recrc(data)
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(bytes(data))
    assert refused.value.status == KafkaBatchStatus.BAD_RECORDS


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_hostile_bytes_are_refused_or_stored_valid(data):
    original = bytearray(kafka_batch(codec=data.draw(st.sampled_from([0, 1, 4]))))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        _recrc(original)                      # past the CRC: the structure checks
    cut = data.draw(st.integers(0, len(original)))
    try:
        stored = from_kafka(bytes(original[:cut] if data.draw(st.booleans()) else original))
    except (CorruptRecordError, UnsupportedCodecError):
        return
    try:
        R.validate_batches(stored)             # what the appender then checks
    except CorruptRecordError as refused:
        assert refused.status in (BatchStatus.BAD_RECORD, BatchStatus.BAD_TIMESTAMP,
                                  BatchStatus.BAD_OFFSET, BatchStatus.BAD_RECORD_COUNT)


@pytest.mark.parametrize("codec", [0, 4], ids=["none", "zstd"])
def test_a_batch_over_the_limit_once_stored_is_split_with_sequences_running_on(codec):
    records = [(b"k", bytes([index % 251]) * 200, []) for index in range(100)]
    original = kafka_batch(records, codec=codec, producer=(5, 1, 1000))
    stored = from_kafka(original, 6_000)
    infos = R.validate_batches(stored)
    assert len(infos) > 3 and all(info.batch_length <= 6_000 for info in infos)
    assert [info.base_sequence for info in infos] == \
        [1000 + sum(info.record_count for info in infos[:index]) for index in range(len(infos))]
    assert sum(info.record_count for info in infos) == 100
    assert [(record.key, record.value) for record in R.decode_records(stored)] == \
        [(key, value) for key, value, _ in records]
    assert from_kafka(original, 10 << 20).size == from_kafka(original).size   # one batch


def _with_records_region(codec: int, region: bytes) -> bytes:
    """A Kafka batch of ``codec`` whose records region is ``region``, its length and
    CRC made right: what a client that compressed its records so would send."""
    data = bytearray(kafka_batch(codec=codec)[:61]) + region
    data[8:12] = (len(data) - 12).to_bytes(4, "big")
    _recrc(data)
    return bytes(data)


def _region(codec: int) -> bytes:
    return kafka_batch(codec=codec)[61:]


@pytest.mark.parametrize("codec", [1, 4], ids=["gzip", "zstd"])
@pytest.mark.parametrize("damage", ["empty", "cut 1", "cut 8", "junk after",
                                    "a second stream"])
def test_a_compressed_region_not_one_whole_stream_is_refused(codec, damage):
    region = _region(codec)
    region = {"empty": b"", "cut 1": region[:-1], "cut 8": region[:-8],
              "junk after": region + b"junk", "a second stream": region + region}[damage]
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(_with_records_region(codec, region))
    assert refused.value.status == KafkaBatchStatus.BAD_COMPRESSION


def _zstd_unsized(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return compressor.compress(data) + compressor.flush()


def test_a_zstd_frame_that_does_not_declare_its_size_is_taken():
    # Java's producer streams its zstd frames: they do not declare their size.
    records = zstandard.ZstdDecompressor().decompress(_region(4))
    stored = from_kafka(_with_records_region(4, _zstd_unsized(records)))
    assert shmlog_fields(stored) == EXPECTED


@pytest.mark.parametrize("bomb", ["gzip", "zstd", "zstd unsized", "zstd lying"])
def test_records_inflating_past_the_bound_are_refused(bomb):
    zeros = bytes(limits.DECOMPRESSED_RECORDS_SIZE_MAX + 1)
    if bomb == "gzip":
        codec, region = 1, gzip.compress(zeros, compresslevel=1)
    elif bomb == "zstd":
        codec, region = 4, zstandard.ZstdCompressor().compress(zeros)
    elif bomb == "zstd unsized":
        codec, region = 4, _zstd_unsized(zeros)
    else:                          # declares 1,000 bytes in its 4-byte size field
        codec, region = 4, bytearray(zstandard.ZstdCompressor().compress(bytes(10 << 20)))
        assert region[4] >> 6 == 2 and not region[4] & 0x20        # window byte, then size
        region[6:10] = (1000).to_bytes(4, "little")
        assert zstandard.frame_content_size(bytes(region)) == 1000
    with pytest.raises(CorruptRecordError) as refused:
        from_kafka(_with_records_region(codec, bytes(region)))
    assert refused.value.status == KafkaBatchStatus.BAD_COMPRESSION


MANY = [(None if index % 7 == 0 else b"key-%d" % index,
         None if index % 11 == 0 else b"" if index % 13 == 0 else bytes([index % 256]) * index,
         [("h%d" % header, None if header == 1 else b"v" * header)
          for header in range(index % 4)])
        for index in range(1000)]


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_a_thousand_records_are_stored_and_sent_back_with_every_field(codec):
    original = kafka_batch(MANY, codec=codec, producer=(1 << 40, 32767, (1 << 31) - 1000))
    stored = from_kafka(original)
    expected = [(index, key, value, headers, BASE_MS + index)
                for index, (key, value, headers) in enumerate(MANY)]
    assert shmlog_fields(stored) == expected
    info = R.validate_batches(stored)[0]
    assert (info.producer_id, info.producer_epoch, info.base_sequence, info.record_count,
            info.last_offset_delta, info.first_timestamp, info.max_timestamp) == \
        (1 << 40, 32767, (1 << 31) - 1000, 1000, 999, BASE_MS, BASE_MS + 999)
    assert kafka_fields(to_kafka(stored)) == expected


def test_a_stored_batch_to_kafka_and_back_is_itself_byte_for_byte():
    stored = R.encode_batch([b"v%d" % index for index in range(50)],
                            keys=[None] * 25 + [b""] * 25,
                            headers=[[("a", None), ("b", b"")]] * 50,
                            timestamps=[BASE_MS - index % 3 for index in range(50)],
                            producer_id=12, producer_epoch=3, base_sequence=100)
    header = stored[:BATCH_HEADER_DTYPE.itemsize].view(BATCH_HEADER_DTYPE)
    header["base_offset"], header["leader_epoch"] = 123_456_789, 17   # as the log assigns
    assert bytes(from_kafka(to_kafka(stored))) == bytes(stored)
    batch = MemoryRecords(bytes(to_kafka(stored))).next_batch()
    assert (batch.base_offset, batch.leader_epoch) == (123_456_789, 17)


def test_log_append_time_is_carried_both_ways():
    data = bytearray(kafka_batch())
    data[22] |= 0x08                          # the timestamp type bit, then a fresh CRC
    _recrc(data)
    stored = from_kafka(bytes(data))
    assert R.validate_batches(stored)[0].timestamp_type == 1
    batch = MemoryRecords(bytes(to_kafka(stored))).next_batch()
    assert batch.timestamp_type == 1
    assert [record.timestamp for record in batch] == [BASE_MS + len(RECORDS) - 1] * len(RECORDS)


def test_a_run_ends_at_zero_padding():
    run = np.concatenate([from_kafka(kafka_batch()), from_kafka(kafka_batch(codec=4)),
                          np.zeros(500, np.uint8)])
    assert kafka_fields(to_kafka(run)) == EXPECTED * 2


def test_a_long_mixed_run_converts_within_its_budget():
    codecs = [4 if index % 5 == 2 else 0 for index in range(40)]
    run = np.concatenate([from_kafka(kafka_batch(codec=codec)) for codec in codecs])
    whole = to_kafka(run)
    assert kafka_fields(whole) == EXPECTED * 40
    size = whole.size // 40                     # every batch has the same Kafka size
    for batches in (1, 2, 3, 17, 39):
        assert bytes(to_kafka(run, batches * size + size - 1)) == \
            bytes(whole[:batches * size])
