"""Record batches: shmlog.record.records encodes, validates and decodes exactly the documented
format.

Goal: every batch shmlog writes is the layout drawn in ``shmlog/record/batch_layout.py``, byte
for byte; every batch written to that layout decodes to the records that went in; and
every batch that is wrong in any way is refused with ``CorruptRecordError`` carrying the
right :class:`BatchStatus`, never served and never any other exception.

Method:

* round trips through ``encode_batch`` and ``decode_records``/``decode_columns`` for
  each input form (lists, None vs empty, headers, numpy arrays, explicit timestamps,
  zstd);
* a second, independent implementation in ``tests/reference.py`` (``struct`` and a
  bitwise CRC, no shmlog code): shmlog's uncompressed output must equal the
  reference's byte for byte, and each side must decode what the other encoded;
* Hypothesis generates random record lists for both of the above;
* corruption: every header byte and every record byte flipped, every truncation,
  garbage, and batches forged with the reference encoder that are wrong in exactly
  one field but carry a correct CRC, so only the structural checks can catch them;
* the columnar decoder's ``start_offset`` and its zero-copy views.

The tests that first showed defects (since fixed) stand at the end.
"""

from __future__ import annotations

import ctypes
import mmap
import pathlib
import struct
import sys

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests/reference.py
import reference  # noqa: E402
from reference import (  # noqa: E402
    build_batch,
    encode_record,
    reference_crc32c,
    reference_decode,
    reference_encode,
    with_crc,
)
from shmlog.common import limits  # noqa: E402
from shmlog.common.errors import CorruptRecordError, LocalProtocolError, RecordTooLargeError  # noqa: E402
from shmlog.native.crc32c import crc32c  # noqa: E402
from shmlog.record.records import (  # noqa: E402
    BatchStatus,
    Compression,
    batch_frame,
    check_headers,
    decode_columns,
    decode_records,
    encode_batch,
    encode_gathered,
    iter_batches,
    restamp_batch,
    validate_batches,
)
from shmlog.record.validation import walk_batches  # noqa: E402

# Byte positions, restated from the diagram (the reference's own copy of the layout).
BATCH_LENGTH_POSITION = 0
MAGIC_POSITION = 4
VERSION_POSITION = 6
RESERVED_POSITION = 7
BASE_OFFSET_POSITION = 8
LEADER_EPOCH_POSITION = 16
CRC_POSITION = 20
CRC_COVERED_POSITION = 24
ATTRIBUTES_POSITION = 24
RECORD_COUNT_POSITION = 28
FIRST_TIMESTAMP_POSITION = 48
HEADER_SIZE = 64
KEY_LENGTH_IN_RECORD = 16
VALUE_LENGTH_IN_RECORD = 20
HEADER_COUNT_IN_RECORD = 24
RECORD_HEADER_SIZE = 28

COMPRESSIONS = [None, "zstd"]


# --- helpers ----------------------------------------------------------------------------

def shmlog_encode(records, compression=None, **options) -> bytes:
    """``encode_batch`` fed from the reference's (timestamp, key, value, headers) list."""
    batch = encode_batch([record[2] for record in records],
                         keys=[record[1] for record in records],
                         headers=[record[3] for record in records],
                         timestamps=[record[0] for record in records],
                         compression=compression, **options)
    assert batch.dtype == np.uint8
    assert batch.ndim == 1
    return batch.tobytes()


def expected(records, base_offset=0):
    """What decoding ``records`` must give: (offset, timestamp, key, value, headers)."""
    return [(base_offset + index, timestamp, key, value, list(headers))
            for index, (timestamp, key, value, headers) in enumerate(records)]


def decoded(buffer):
    """shmlog's decoding, in the reference's tuple form (control batches' records
    too: what a consumer skips is the format's all the same); every record is
    CreateTime."""
    records = decode_records(buffer, control=True)
    assert all(record.timestamp_type == 0 for record in records)
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


def corrupt_status(buffer, **options):
    """The status ``validate_batches`` raises for ``buffer`` (it must raise)."""
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(buffer, **options)
    return BatchStatus(caught.value.status)


def patched(batch: bytes, position: int, fmt: str, value) -> bytes:
    """``batch`` with one field overwritten (the CRC is left as it was)."""
    batch = bytearray(batch)
    struct.pack_into(fmt, batch, position, value)
    return bytes(batch)


MIXED = [
    (1_000, b"key", b"value", []),
    (1_001, None, b"a value", [("trace", b"\x00\x01")]),
    (999, b"", None, [("empty", b""), ("null", None)]),
    (2_000, b"k" * 300, b"v" * 1000,
     [("ключ", "значение".encode()), ("名前", None), ("🎉", b"x")]),
    (1_500, None, None, []),
    (1_500, b"\xff" * 7, b"", [("", b"empty name")]),
]


# --- (a) round trips through shmlog -------------------------------------------------------

@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_null_and_empty_keys_and_values_stay_distinct(compression):
    records = [(10, key, value, []) for key in (None, b"", b"k") for value in (None, b"", b"v")]
    got = decoded(shmlog_encode(records, compression))
    assert got == expected(records)
    assert [key is None for _, _, key, _, _ in got] == [r[1] is None for r in records]
    assert [value is None for _, _, _, value, _ in got] == [r[2] is None for r in records]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_headers_round_trip(compression):
    headers = [("ascii", b"1"), ("null", None), ("empty", b""), ("ключ", b"\xd0\x97"),
               ("名前", None), ("emoji 🎉", b"\x00" * 5), ("", b"no name"), ("ascii", b"2")]
    records = [(5, b"k", b"v", headers), (6, None, None, []), (7, b"", b"", headers[:1])]
    got = decoded(shmlog_encode(records, compression))
    assert got == expected(records)
    assert got[0][4][1] == ("null", None)          # null header value, not b""
    assert got[0][4][2] == ("empty", b"")


def test_headers_as_tuples_and_none_for_no_headers():
    batch = encode_batch([b"a", b"b"], headers=[(("h", b"x"),), None], timestamp_ms=3)
    records = decode_records(batch)
    assert records[0].headers == [("h", b"x")]
    assert records[1].headers == []


def test_zstd_batch_is_compressed_and_round_trips():
    records = [(100 + index, b"key-%d" % (index % 7), b"value " * 50, [("i", b"%d" % index)])
               for index in range(500)]
    plain = shmlog_encode(records)
    compressed = shmlog_encode(records, "zstd")
    assert len(compressed) < len(plain) // 5
    (info,) = validate_batches(compressed)
    assert info.compression is Compression.ZSTD
    assert info.attributes & 0x07 == 4
    assert info.record_count == 500
    assert decoded(compressed) == expected(records)
    assert reference_decode(compressed) == expected(records)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_fixed_width_values_from_a_2d_uint8_array(compression):
    rng = np.random.default_rng(7)
    values = rng.integers(0, 256, (50, 16), dtype=np.uint8)
    batch = encode_batch(values, timestamp_ms=42, compression=compression)
    records = decode_records(batch)
    assert [record.value for record in records] == [row.tobytes() for row in values]
    assert [record.key for record in records] == [None] * 50
    assert [record.offset for record in records] == list(range(50))
    assert {record.timestamp for record in records} == {42}


def test_fixed_width_values_from_a_non_contiguous_array():
    values = np.arange(60, dtype=np.uint8).reshape(10, 6)[:, ::2]
    records = decode_records(encode_batch(values, timestamp_ms=0))
    assert [record.value for record in records] == [row.tobytes() for row in values]


def test_zero_width_array_values_are_empty_not_null():
    records = decode_records(encode_batch(np.zeros((3, 0), np.uint8), timestamp_ms=0))
    assert [record.value for record in records] == [b"", b"", b""]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_keys_as_numpy_arrays(compression):
    values = [b"v%d" % index for index in range(20)]
    int_keys = np.arange(1_000, 1_020, dtype=np.int64)
    records = decode_records(encode_batch(values, keys=int_keys, timestamp_ms=0,
                                          compression=compression))
    assert [record.key for record in records] == [key.tobytes() for key in int_keys]
    assert [record.value for record in records] == values

    byte_keys = np.arange(40, dtype=np.uint8).reshape(20, 2)
    records = decode_records(encode_batch(values, keys=byte_keys, timestamp_ms=0,
                                          compression=compression))
    assert [record.key for record in records] == [row.tobytes() for row in byte_keys]


def test_array_values_and_list_keys_together():
    values = np.full((3, 4), 9, np.uint8)
    keys = [None, b"", b"k"]
    got = decoded(encode_batch(values, keys=keys, timestamps=[1, 2, 3]))
    assert got == expected([(1, None, b"\t" * 4, []), (2, b"", b"\t" * 4, []),
                            (3, b"k", b"\t" * 4, [])])


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_explicit_timestamps_out_of_order(compression):
    stamps = [1_000, 5, 2**40, 999, 1_000, 0]
    records = [(stamp, None, b"%d" % stamp, []) for stamp in stamps]
    batch = shmlog_encode(records, compression)
    assert decoded(batch) == expected(records)
    (info,) = validate_batches(batch)
    assert info.first_timestamp == 1_000          # the first record's, not the minimum
    assert info.max_timestamp == 2**40
    assert info.timestamp_type == 0


def test_timestamps_as_numpy_array_and_default_timestamp():
    batch = encode_batch([b"a", b"b"], timestamps=np.array([7, 3], dtype=np.int64))
    assert [record.timestamp for record in decode_records(batch)] == [7, 3]
    batch = encode_batch([b"a", b"b"], timestamp_ms=123)
    assert [record.timestamp for record in decode_records(batch)] == [123, 123]


@pytest.mark.parametrize("timing", [{"timestamp_ms": 2**70}, {"timestamp_ms": 2**63 - 1},
                                    {"timestamp_ms": -2}, {"timestamp_ms": 1.5},
                                    {"timestamps": [0, 2**70]}, {"timestamps": [0, 2**63 - 1]},
                                    {"timestamps": [0, -2]}, {"timestamps": ["x", 1]}])
def test_timestamps_a_batch_cannot_store_are_refused(timing):
    with pytest.raises(LocalProtocolError, match="timestamp"):
        encode_batch([b"a", b"b"], **timing)


def test_the_widest_storable_timestamps_round_trip():
    stamps = [limits.TIMESTAMP_MS_MAX, -1, limits.TIMESTAMP_MS_MAX]
    assert [record.timestamp for record in decode_records(
        encode_batch([b"a", b"b", b"c"], timestamps=stamps))] == stamps
    stamps = [-1, limits.TIMESTAMP_MS_MAX]
    assert [record.timestamp for record in decode_records(
        encode_batch([b"a", b"b"], timestamps=stamps))] == stamps


def test_producer_fields_and_control_bit_reach_the_header():
    batch = encode_batch([b"a", b"b", b"c"], timestamp_ms=9, producer_id=2**40 + 3,
                         producer_epoch=17, base_sequence=12345, control=True)
    (info,) = validate_batches(batch)
    assert info.producer_id == 2**40 + 3
    assert info.producer_epoch == 17
    assert info.base_sequence == 12345
    assert info.is_control
    assert info.record_count == 3
    assert info.last_offset_delta == 2
    assert info.base_offset == 0
    assert info.next_offset == 3
    (info,) = validate_batches(encode_batch([b"a"], timestamp_ms=9))
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (-1, -1, -1)
    assert not info.is_control


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_restamped_batch_carries_its_new_identity_under_a_valid_crc(compression):
    """What a producer does to a batch it sends again after an epoch bump."""
    batch = encode_batch([b"a", None, b"c"], keys=[b"k", b"l", None], timestamp_ms=9,
                         producer_id=5, producer_epoch=0, base_sequence=40,
                         compression=compression)
    records = decode_records(batch)
    restamp_batch(batch, 6, 32767, 0)
    (info,) = validate_batches(batch)
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (6, 32767, 0)
    assert decode_records(batch) == records
    with pytest.raises(LocalProtocolError, match="producer_epoch"):
        restamp_batch(batch, 6, 32768, 0)


def test_log_append_time_gives_every_record_the_batch_max_timestamp():
    records = [(5, None, b"a", []), (9, None, b"b", []), (7, None, b"c", [])]
    for compression in COMPRESSIONS:
        batch = reference_encode(records, compression=compression, log_append_time=True)
        got = decode_records(batch)
        assert [(r.timestamp, r.timestamp_type) for r in got] == [(9, 1)] * 3


def test_batches_back_to_back_get_their_base_offsets():
    first = [(1, b"a", b"1", []), (2, b"b", b"2", [])]
    second = [(3, b"c", b"3", [("h", None)])]
    buffer = (reference_encode(first, base_offset=100)
              + reference_encode(second, base_offset=102, compression="zstd")
              + reference_encode(first, base_offset=200, leader_epoch=4))
    assert decoded(buffer) == (expected(first, 100) + expected(second, 102)
                               + expected(first, 200))
    assert [info.base_offset for info in iter_batches(buffer)] == [100, 102, 200]


def test_iter_batches_stops_at_preallocated_zeros():
    batch = shmlog_encode(MIXED)
    infos = list(iter_batches(batch + bytes(4096)))
    assert len(infos) == 1
    assert infos[0].batch_length == len(batch)


# --- (b) shmlog against the reference -----------------------------------------------------

ENCODER_CASES = {
    "mixed": (MIXED, {}),
    "one null record": ([(0, None, None, [])], {}),
    "producer fields": ([(7, b"k", b"v", [])] * 3,
                        {"producer_id": 77, "producer_epoch": 3, "base_sequence": 1000}),
    "control": ([(7, b"\x00\x00\x00\x00", b"", [])], {"control": True}),
    "big timestamps": ([(2**40, b"k", b"v", []), (0, b"k", b"v", [])], {}),
}


@pytest.mark.parametrize("case", ENCODER_CASES)
def test_shmlog_encoding_equals_reference_byte_for_byte(case):
    records, options = ENCODER_CASES[case]
    assert shmlog_encode(records, **options) == reference_encode(records, **options)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("case", ENCODER_CASES)
def test_each_side_decodes_the_other(case, compression):
    records, options = ENCODER_CASES[case]
    assert decoded(reference_encode(records, compression=compression, **options)) \
        == expected(records)
    assert reference_decode(shmlog_encode(records, compression, **options)) \
        == expected(records)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_shmlog_decodes_reference_batches_with_base_offsets(compression):
    batch = reference_encode(MIXED, base_offset=2**40, compression=compression, leader_epoch=9)
    assert decoded(batch) == expected(MIXED, 2**40)


def test_header_field_positions_match_the_diagram():
    # Read shmlog's header with plain struct at the documented positions.
    batch = encode_batch([b"a", b"bb"], keys=[b"k", None], timestamps=[10, 30],
                         producer_id=5, producer_epoch=6, base_sequence=7).tobytes()
    (length, magic, version, reserved, base_offset, leader_epoch, crc, attributes,
     producer_epoch, record_count, last_offset_delta, base_sequence, producer_id,
     first_timestamp, max_timestamp) = struct.unpack_from("<IHBBqiIHhiiiqqq", batch)
    assert length == len(batch)
    assert batch[MAGIC_POSITION:MAGIC_POSITION + 2] == b"SL"
    assert (magic, version, reserved) == (0x4C53, 1, 0)
    assert (base_offset, leader_epoch) == (0, 0)
    assert crc == reference_crc32c(batch[CRC_COVERED_POSITION:])
    assert (attributes, producer_epoch, record_count, last_offset_delta) == (0, 6, 2, 1)
    assert (base_sequence, producer_id, first_timestamp, max_timestamp) == (7, 5, 10, 30)
    record_length, offset_delta, timestamp_delta, key_length, value_length, header_count = \
        struct.unpack_from("<IIqiiI", batch, HEADER_SIZE)
    assert (record_length, offset_delta, timestamp_delta) == (RECORD_HEADER_SIZE + 2, 0, 0)
    assert (key_length, value_length, header_count) == (1, 1, 0)
    second = struct.unpack_from("<IIqiiI", batch, HEADER_SIZE + record_length)
    assert second == (RECORD_HEADER_SIZE + 2, 1, 20, -1, 2, 0)


# --- (c) properties -----------------------------------------------------------------------

FIELDS = st.none() | st.binary(max_size=40)
HEADERS = st.lists(st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=20)),
                   max_size=4)
RECORDS = st.lists(st.tuples(st.integers(0, 2**40), FIELDS, FIELDS, HEADERS),
                   min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(records=RECORDS)
def test_property_encoding_equals_reference(records):
    assert shmlog_encode(records) == reference_encode(records)


@settings(max_examples=150, deadline=None)
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS))
def test_property_round_trip(records, compression):
    batch = shmlog_encode(records, compression)
    assert decoded(batch) == expected(records)
    assert reference_decode(batch) == expected(records)


@settings(max_examples=100, deadline=None)
@given(records=RECORDS, compression=st.sampled_from(COMPRESSIONS),
       base_offset=st.integers(0, 2**50))
def test_property_shmlog_decodes_reference(records, compression, base_offset):
    batch = reference_encode(records, compression=compression, base_offset=base_offset)
    assert decoded(batch) == expected(records, base_offset)


# --- (d) validation -----------------------------------------------------------------------

@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_header_byte_is_checked(compression):
    batch = shmlog_encode(MIXED, compression)
    for position in range(HEADER_SIZE):
        for mask in (0x01, 0x80, 0xFF):
            flipped = bytearray(batch)
            flipped[position] ^= mask
            if BASE_OFFSET_POSITION <= position < CRC_POSITION:
                # base_offset and leader_epoch are assigned by the log after the CRC was
                # computed, so they are outside it by design (as in Kafka).
                assert len(validate_batches(bytes(flipped))) == 1
                continue
            status = corrupt_status(bytes(flipped))
            if position >= CRC_POSITION:
                assert status is BatchStatus.BAD_CRC, (position, mask)
            elif position < MAGIC_POSITION:
                assert status in (BatchStatus.TRUNCATED, BatchStatus.BAD_LENGTH,
                                  BatchStatus.BAD_CRC), (position, mask)
            elif position < VERSION_POSITION:
                assert status is BatchStatus.BAD_MAGIC, (position, mask)
            elif position == VERSION_POSITION:
                assert status is BatchStatus.BAD_VERSION, (position, mask)
            else:
                assert position == RESERVED_POSITION
                assert status is BatchStatus.BAD_ATTRIBUTES, (position, mask)


def test_every_record_byte_is_covered_by_the_crc():
    batch = shmlog_encode(MIXED)
    assert len(batch) > 1500
    for position in range(HEADER_SIZE, len(batch)):
        for mask in (0x01, 0xFF):
            flipped = bytearray(batch)
            flipped[position] ^= mask
            assert corrupt_status(bytes(flipped)) is BatchStatus.BAD_CRC, (position, mask)


def test_flipped_bytes_in_a_zstd_frame_are_caught_by_the_crc():
    records = [(index, b"k%d" % index, bytes(range(index % 200)), []) for index in range(300)]
    batch = shmlog_encode(records, "zstd")
    rng = np.random.default_rng(3)
    for position in rng.choice(np.arange(HEADER_SIZE, len(batch)), 200, replace=False):
        flipped = bytearray(batch)
        flipped[position] ^= int(rng.integers(1, 256))
        assert corrupt_status(bytes(flipped)) is BatchStatus.BAD_CRC, position
        with pytest.raises(CorruptRecordError):
            decode_records(bytes(flipped))


def test_corruption_in_a_later_batch_reports_its_position():
    first = shmlog_encode(MIXED)
    second = bytearray(shmlog_encode(MIXED[:2], "zstd"))
    second[-1] ^= 0x40
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(first + bytes(second))
    assert caught.value.status == BatchStatus.BAD_CRC
    assert caught.value.position == len(first)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_truncation_is_detected(compression):
    batch = shmlog_encode(MIXED, compression)
    for cut in range(1, len(batch)):
        with pytest.raises(CorruptRecordError) as caught:
            validate_batches(batch[:cut])
        assert caught.value.status == BatchStatus.TRUNCATED, cut
        assert caught.value.position == 0
        with pytest.raises(CorruptRecordError):
            decode_records(batch[:cut])
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(batch + batch[:100])
    assert caught.value.status == BatchStatus.TRUNCATED
    assert caught.value.position == len(batch)


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(min_size=1, max_size=400), prefix=st.booleans())
def test_garbage_is_refused(garbage, prefix):
    good = shmlog_encode(MIXED[:2]) if prefix else b""
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(good + garbage)
    assert caught.value.status in set(BatchStatus) - {BatchStatus.OK}
    assert caught.value.position == len(good)
    with pytest.raises(CorruptRecordError):
        decode_records(good + garbage)


def test_batch_frame_is_the_documented_framing_for_every_length_and_bound():
    """The one step of every walk over batches: the kernel's frame agrees with the
    reference's for lengths around every bound, at every position and end."""
    lengths = [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, 100, 127, 128, 129,
               2**31, 2**32 - 1]
    for length in lengths:
        data = np.zeros(200, np.uint8)
        for position in (0, 5, 60, 72, 100, 196, 197):
            data[:] = 0
            data[position:position + 4] = np.frombuffer(struct.pack("<I", length), np.uint8)[
                :max(0, min(4, data.size - position))]
            for end in sorted({position, position + 3, position + 4, position + HEADER_SIZE - 1,
                               position + HEADER_SIZE, position + length, 200}):
                if not position <= end <= data.size:
                    continue
                status, read = batch_frame(data, position, end)
                expected = reference.reference_batch_frame(data.tobytes(), position, end)
                assert (BatchStatus(status).name, int(read)) == expected, (length, position, end)


def test_zero_bytes_are_end_of_data_not_a_batch():
    assert corrupt_status(bytes(HEADER_SIZE)) is BatchStatus.END_OF_DATA


@pytest.mark.parametrize("magic", [0x0000, 0x534C, 0x4C54, 0xFFFF])
def test_wrong_magic(magic):
    batch = build_batch(encode_record(0, 0, b"k", b"v", []), record_count=1,
                        last_offset_delta=0, first_timestamp=0, max_timestamp=0, magic=magic)
    assert corrupt_status(batch) is BatchStatus.BAD_MAGIC


@pytest.mark.parametrize("version", [0, 2, 255])
def test_wrong_version(version):
    batch = build_batch(encode_record(0, 0, b"k", b"v", []), record_count=1,
                        last_offset_delta=0, first_timestamp=0, max_timestamp=0,
                        version=version)
    assert corrupt_status(batch) is BatchStatus.BAD_VERSION


def _one_record(key=b"key", value=b"value", headers=(), **fields):
    record = dict(offset_delta=0, timestamp_delta=0, key=key, value=value, headers=headers)
    record.update(fields)
    return encode_record(**record)


def _forge_record(record: bytes, position: int, fmt: str, value) -> bytes:
    """The record with one of its fields overwritten (batch CRCs are computed later)."""
    return patched(record, position, fmt, value)


TWO = _one_record(key=b"ab", value=b"cd", headers=[("h", b"x")]) \
    + _one_record(offset_delta=1, key=b"ef", value=b"gh")
TWO_FIRST_LENGTH = len(_one_record(key=b"ab", value=b"cd", headers=[("h", b"x")]))
FIRST_HEADER_ENTRY = RECORD_HEADER_SIZE + len(b"ab") + len(b"cd")
assert TWO_FIRST_LENGTH == FIRST_HEADER_ENTRY + 8 + len(b"h") + len(b"x")

# (records region, header fields, expected status): each wrong in exactly one way.
FORGED = {
    "key_length past the record end": (
        _forge_record(TWO, KEY_LENGTH_IN_RECORD, "<i", TWO_FIRST_LENGTH), {},
        BatchStatus.BAD_RECORD),
    "key_length one byte past the record end": (
        _forge_record(TWO, KEY_LENGTH_IN_RECORD, "<i",
                      TWO_FIRST_LENGTH - RECORD_HEADER_SIZE - len(b"cd") + 1), {},
        BatchStatus.BAD_RECORD),
    "key_length below null": (
        _forge_record(TWO, KEY_LENGTH_IN_RECORD, "<i", -2), {}, BatchStatus.BAD_RECORD),
    "key_length huge": (
        _forge_record(TWO, KEY_LENGTH_IN_RECORD, "<i", 2**31 - 1), {},
        BatchStatus.BAD_RECORD),
    "value_length past the record end": (
        _forge_record(TWO, TWO_FIRST_LENGTH + VALUE_LENGTH_IN_RECORD, "<i", 3), {},
        BatchStatus.BAD_RECORD),
    "value_length below null": (
        _forge_record(TWO, VALUE_LENGTH_IN_RECORD, "<i", -7), {}, BatchStatus.BAD_RECORD),
    "header name length past the record end": (
        _forge_record(TWO, FIRST_HEADER_ENTRY, "<I", 2), {}, BatchStatus.BAD_RECORD),
    "header value length below null": (
        _forge_record(TWO, FIRST_HEADER_ENTRY + 4, "<i", -2), {},
        BatchStatus.BAD_RECORD),
    "header count too high": (
        _forge_record(TWO, HEADER_COUNT_IN_RECORD, "<I", 2), {}, BatchStatus.BAD_RECORD),
    "header count over the limit": (
        _forge_record(TWO, HEADER_COUNT_IN_RECORD, "<I", limits.RECORD_HEADER_COUNT_MAX + 1),
        {}, BatchStatus.BAD_RECORD),
    "fields shorter than record_length": (
        _forge_record(TWO[:TWO_FIRST_LENGTH], 0, "<I", TWO_FIRST_LENGTH + 1)
        + b"\x00" + TWO[TWO_FIRST_LENGTH:], {}, BatchStatus.BAD_RECORD),
    "record_length below the record header": (
        _forge_record(TWO, 0, "<I", RECORD_HEADER_SIZE - 1), {}, BatchStatus.BAD_RECORD),
    "record_length past the batch": (
        _forge_record(TWO, TWO_FIRST_LENGTH, "<I", 1000), {}, BatchStatus.BAD_RECORD),
    "a partial record at the end": (
        TWO + bytes(RECORD_HEADER_SIZE - 1), {}, BatchStatus.BAD_RECORD),
    "offset deltas not increasing": (
        _forge_record(TWO, TWO_FIRST_LENGTH + 4, "<I", 0), {}, BatchStatus.BAD_RECORD),
    "offset delta past last_offset_delta": (
        _forge_record(TWO, TWO_FIRST_LENGTH + 4, "<I", 2), {}, BatchStatus.BAD_RECORD),
    "record_count too high": (TWO, {"record_count": 3, "last_offset_delta": 2},
                              BatchStatus.BAD_RECORD_COUNT),
    "record_count too low": (TWO, {"record_count": 1}, BatchStatus.BAD_RECORD_COUNT),
    "record_count negative": (TWO, {"record_count": -1}, BatchStatus.BAD_RECORD_COUNT),
    "last_offset_delta below record_count - 1": (
        TWO, {"last_offset_delta": 0}, BatchStatus.BAD_RECORD_COUNT),
    "record timestamp above max_timestamp": (
        _forge_record(TWO, TWO_FIRST_LENGTH + 8, "<q", 1), {}, BatchStatus.BAD_TIMESTAMP),
    "first_timestamp below -1": (TWO, {"first_timestamp": -2, "max_timestamp": 0},
                                 BatchStatus.BAD_TIMESTAMP),
    "max_timestamp below first_timestamp": (TWO, {"first_timestamp": 5, "max_timestamp": 4},
                                            BatchStatus.BAD_TIMESTAMP),
    "unknown attribute bit": (TWO, {"attributes": 0x40}, BatchStatus.BAD_ATTRIBUTES),
    "gzip codec": (TWO, {"attributes": 1}, BatchStatus.BAD_ATTRIBUTES),
    "reserved byte set": (TWO, {"reserved": 1}, BatchStatus.BAD_ATTRIBUTES),
}


def _forged_batch(records_region: bytes, fields: dict, compression=None) -> bytes:
    header = dict(record_count=2, last_offset_delta=1, first_timestamp=0, max_timestamp=0)
    header.update(fields)
    if compression == "zstd":
        records_region = reference.compress_zstd(records_region)
        header["attributes"] = header.get("attributes", 0) | reference.CODEC_ZSTD
    return build_batch(records_region, **header)


def test_forged_cases_differ_from_a_valid_batch_only_where_intended():
    valid = _forged_batch(TWO, {})
    assert len(validate_batches(valid)) == 1
    assert decoded(valid) == [(0, 0, b"ab", b"cd", [("h", b"x")]), (1, 0, b"ef", b"gh", [])]


@pytest.mark.parametrize("case", FORGED)
def test_forged_batch_with_a_correct_crc_is_refused(case):
    region, fields, status = FORGED[case]
    batch = _forged_batch(region, fields)
    assert reference_crc32c(batch[CRC_COVERED_POSITION:]) == \
        struct.unpack_from("<I", batch, CRC_POSITION)[0]
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(batch)
    assert BatchStatus(caught.value.status) is status
    assert caught.value.position == 0
    with pytest.raises(CorruptRecordError):
        decode_records(batch)
    for verified in (False, True):
        with pytest.raises(CorruptRecordError) as caught:
            decode_columns(batch, verified=verified)
        assert (BatchStatus(caught.value.status), caught.value.position) == (status, 0)


ZSTD_FORGED = [case for case, (_, fields, _) in FORGED.items()
               if fields.get("attributes") is None and "reserved" not in fields]


@pytest.mark.parametrize("case", ZSTD_FORGED)
def test_forged_records_inside_a_zstd_frame_are_refused(case):
    region, fields, status = FORGED[case]
    batch = _forged_batch(region, fields, compression="zstd")
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(batch)
    assert BatchStatus(caught.value.status) is status
    with pytest.raises(CorruptRecordError):
        decode_records(batch)


def _walk_verdict(buffer: bytes, check_crc: bool):
    """(status, position) of the validating walk over ``buffer`` with records
    checked (``validation.walk_batches``): what decoding must raise, or (OK, end)."""
    data = np.frombuffer(buffer, np.uint8)
    positions = np.empty(max(1, data.size // HEADER_SIZE), np.int64)
    status, _, end = walk_batches(data, 0, data.size, check_crc, True, positions)
    return BatchStatus(status), int(end)


# Uncompressed batches of every record shape: nulls, empty fields, headers (null and
# empty values, an empty name), sparse offsets, LogAppendTime.
DECODED_BATCHES = (
    shmlog_encode(MIXED),
    reference_encode([(5, None, b"a", []), (9, b"k", None, [("h", b"")])], base_offset=40,
                     log_append_time=True),
    build_batch(_one_record(key=b"ab", value=b"cd", headers=[("h", b"x")])
                + _one_record(offset_delta=3, key=None, value=b"gh"),
                record_count=2, last_offset_delta=4, first_timestamp=0, max_timestamp=0,
                base_offset=50),
)


@pytest.mark.parametrize("verified", (False, True))
def test_decoding_checks_every_byte_as_the_validating_walk_does(verified):
    """Every byte of three back-to-back batches flipped, with the CRC recomputed (a
    forger's batch, which only the structure checks can catch) or not: decoding
    refuses exactly what ``walk_batches`` refuses, with its status and position,
    and decodes what it accepts as the reference does. Decoding walks the records
    in its own kernel; this proves it keeps every check of the validating walk."""
    for index, batch in enumerate(DECODED_BATCHES):
        before = b"".join(DECODED_BATCHES[:index])
        after = b"".join(DECODED_BATCHES[index + 1:])
        for position in range(len(batch)):
            for mask, forged in ((0x01, True), (0xFF, True), (0x80, False)):
                flipped = bytearray(batch)
                flipped[position] ^= mask
                if forged:     # shmlog's CRC: the reference's bitwise one is too slow here
                    struct.pack_into("<I", flipped, CRC_POSITION,
                                     crc32c(bytes(flipped[CRC_COVERED_POSITION:])))
                flipped = bytes(flipped)
                buffer = before + flipped + after
                status, end = _walk_verdict(buffer, check_crc=not verified)
                case = (index, position, mask)
                if status not in (BatchStatus.OK, BatchStatus.END_OF_DATA):
                    with pytest.raises(CorruptRecordError) as caught:
                        decode_columns(buffer, verified=verified)
                    assert (caught.value.status, caught.value.position) == (status, end), case
                    continue
                columns = decode_columns(buffer, verified=verified)
                if verified or mask != 0x01:
                    continue           # decoded as unverified is (the CRC aside); one mask will do
                try:
                    want = reference_decode(buffer[:end])
                except UnicodeDecodeError:
                    continue           # a header name no longer UTF-8: the reference refuses
                got = [(r.offset, r.timestamp, r.key, r.value, r.headers)
                       for r in columns.records()]
                assert got == want, case


def test_patched_key_length_with_recomputed_crc_is_bad_record():
    # The same attack on shmlog's own output: patch a field, fix up the CRC.
    batch = shmlog_encode([(0, b"key", b"value", []), (0, b"k2", b"v2", [])])
    record_length = struct.unpack_from("<I", batch, HEADER_SIZE)[0]
    forged = with_crc(patched(batch, HEADER_SIZE + KEY_LENGTH_IN_RECORD, "<i",
                              record_length))
    assert corrupt_status(forged) is BatchStatus.BAD_RECORD
    # Without the CRC fix-up the CRC catches it first.
    unfixed = patched(batch, HEADER_SIZE + KEY_LENGTH_IN_RECORD, "<i", record_length)
    assert corrupt_status(unfixed) is BatchStatus.BAD_CRC
    # check_records=False skips the record walk, so only the CRC'd header is vouched for.
    assert len(validate_batches(forged, check_records=False)) == 1


def _zstd_batch(frame: bytes, record_count: int = 1) -> bytes:
    return build_batch(frame, record_count=record_count, last_offset_delta=record_count - 1,
                       first_timestamp=0, max_timestamp=0, attributes=reference.CODEC_ZSTD)


def test_zstd_frame_inflating_past_the_limit_is_refused():
    # A genuine, well-formed batch: one record whose value makes the records region
    # one limit's worth of bytes plus a little. Only the size bound can refuse it.
    record = encode_record(0, 0, None, bytes(limits.DECOMPRESSED_RECORDS_SIZE_MAX), [])
    frame = reference.compress_zstd(record)
    assert zstandard.frame_content_size(frame) > limits.DECOMPRESSED_RECORDS_SIZE_MAX
    assert len(frame) < 64 << 10
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(_zstd_batch(frame))
    assert caught.value.status == BatchStatus.BAD_COMPRESSION


def test_zstd_frame_declaring_a_huge_size_is_refused_before_inflating():
    # A hand-written frame header: single segment, 8-byte content size of 2**62, then
    # one empty raw last block. Inflating it would need 4 EiB.
    frame = (struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", 2**62)
             + bytes([0x01, 0x00, 0x00]))
    assert zstandard.frame_content_size(frame) == 2**62
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(_zstd_batch(frame))
    assert caught.value.status == BatchStatus.BAD_COMPRESSION


def test_hand_written_zstd_frame_with_an_honest_size_is_accepted():
    # The control for the test above: the same frame shape, holding real records.
    record = encode_record(0, 0, b"k", b"v", [])
    block_header = (len(record) << 3) | 1                      # raw block, last block
    frame = (struct.pack("<I", 0xFD2FB528) + bytes([0x20, len(record)])
             + block_header.to_bytes(3, "little") + record)
    assert decoded(_zstd_batch(frame)) == [(0, 0, b"k", b"v", [])]


KV_RECORD = encode_record(0, 0, b"k", b"v", [])


@pytest.mark.parametrize("frame", [
    b"",
    b"not a zstd frame at all",
    zstandard.ZstdCompressor(write_content_size=False).compress(KV_RECORD),
    reference.compress_zstd(KV_RECORD)[:-3],
], ids=["empty", "not zstd", "no declared size", "cut short"])
def test_bad_zstd_frames_are_bad_compression(frame):
    with pytest.raises(CorruptRecordError) as caught:
        validate_batches(_zstd_batch(frame))
    assert caught.value.status == BatchStatus.BAD_COMPRESSION
    with pytest.raises(CorruptRecordError):
        decode_records(_zstd_batch(frame))


BAD_ENCODER_INPUT = {
    "str values": lambda: encode_batch(["text", "more"]),
    "one str among bytes": lambda: encode_batch([b"ok", "text"]),
    "a str as the values": lambda: encode_batch("text"),
    "str key": lambda: encode_batch([b"v"], keys=["k"]),
    "int values": lambda: encode_batch([1, 2]),
    "more keys than values": lambda: encode_batch([b"a"], keys=[b"a", b"b"]),
    "fewer keys than values": lambda: encode_batch([b"a", b"b"], keys=[b"a"]),
    "key array rows differ": lambda: encode_batch([b"a"], keys=np.zeros((2, 3), np.uint8)),
    "value array with keys list": lambda: encode_batch(np.zeros((2, 3), np.uint8),
                                                       keys=[b"k"]),
    "headers count differs": lambda: encode_batch([b"a"], headers=[[], []]),
    "timestamps count differs": lambda: encode_batch([b"a"], timestamps=[1, 2]),
    "empty list": lambda: encode_batch([]),
    "empty array": lambda: encode_batch(np.zeros((0, 4), np.uint8)),
    "str header value": lambda: encode_batch([b"a"], headers=[[("h", "v")]]),
    "bytes header name": lambda: encode_batch([b"a"], headers=[[(b"h", b"v")]]),
    "header not a pair": lambda: encode_batch([b"a"], headers=[[("h", b"v", b"x")]]),
    "unknown compression": lambda: encode_batch([b"a"], compression="gzip"),
    "first timestamp below -1": lambda: encode_batch([b"a", b"b"], timestamps=[-2, 5]),
    "later timestamp below -1": lambda: encode_batch([b"a", b"b"], timestamps=[5, -100]),
    "timestamp_ms below -1": lambda: encode_batch([b"a"], timestamp_ms=-5),
}


@pytest.mark.parametrize("case", BAD_ENCODER_INPUT)
def test_bad_encoder_input_is_a_local_protocol_error(case):
    with pytest.raises(LocalProtocolError):
        BAD_ENCODER_INPUT[case]()


# --- (e) columnar decoding ----------------------------------------------------------------

def _three_batches(compression=None):
    groups = [
        (0, [(10 + i, b"a%d" % i, b"x" * i, [("n", b"%d" % i)]) for i in range(5)]),
        (5, [(20 + i, None if i % 2 else b"b%d" % i, None if i == 3 else b"y" * i,
              [("p", None), ("q", b"")] if i % 3 == 0 else []) for i in range(7)]),
        (12, [(30 + i, b"", b"z%d" % i, []) for i in range(3)]),
    ]
    buffer = b"".join(reference_encode(records, base_offset=base, compression=compression)
                      for base, records in groups)
    wanted = [row for base, records in groups for row in expected(records, base)]
    return buffer, wanted


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_start_offset_drops_earlier_records(compression):
    buffer, wanted = _three_batches(compression)
    assert [row[0] for row in wanted] == list(range(15))
    for start in range(0, 17):
        columns = decode_columns(buffer, start_offset=start)
        keep = [row for row in wanted if row[0] >= start]
        assert columns.offsets.tolist() == [row[0] for row in keep]
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers)
                for r in columns.records()] == keep
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers)
                for r in decode_records(buffer, start_offset=start)] == keep


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_records_of_any_range_are_the_reference_records(compression):
    """``records(start=, stop=)`` (what a poll of ``max_records`` materialises) copies
    only the range's bytes, so every range must still find every field: keys and
    values null, empty or set, headers with null values, over batch boundaries."""
    buffer, wanted = _three_batches(compression)
    columns = decode_columns(buffer, start_offset=2)
    keep = [row for row in wanted if row[0] >= 2]
    for start in range(len(keep) + 1):
        for stop in range(start, len(keep) + 2):
            records = columns.records(start=start, stop=stop)
            assert [(r.offset, r.timestamp, r.key, r.value, r.headers)
                    for r in records] == keep[start:stop]
            assert all(type(r).__name__ == "Record" for r in records)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_fixed_size_records_unpack_to_the_reference_records(compression):
    """Runs of fields of one size and spacing are unpacked by one struct format each:
    the runs break at batch headers, at a null (left out of the format), at an empty
    field and at a header, and every range must still be exact."""
    groups = []
    for batch in range(3):
        records = []
        for index in range(40):
            key = None if batch == 1 else b"K%03d" % index
            value = (None if index in (5, 6, 30) else b"" if index == 17
                     else bytes([batch, index]) * 50)
            headers = [("n", b"%02d" % index), ("z", None)] if index in (9, 33) else []
            records.append((1000 + index, key, value, headers))
        groups.append((40 * batch, records))
    buffer = b"".join(reference_encode(records, base_offset=base, compression=compression)
                      for base, records in groups)
    wanted = [row for base, records in groups for row in expected(records, base)]
    columns = decode_columns(buffer)
    for start, stop in [(0, 120), (0, 1), (3, 77), (39, 41), (41, 120), (119, 120)]:
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in
                columns.records(start=start, stop=stop)] == wanted[start:stop]


def test_every_record_gets_its_own_header_list():
    # kafka-python's shape: an application may append to one record's headers.
    buffer, _ = _three_batches()
    records = decode_columns(buffer).records()
    assert len({id(record.headers) for record in records}) == len(records)
    records[-1].headers.append(("mine", b""))
    assert records[-2].headers == []


def _field_view(columns, positions, lengths, index):
    length = int(lengths[index])
    if length < 0:
        return None
    position = int(positions[index])
    return columns.data[position:position + length]


@pytest.mark.parametrize("form", ["bytes", "array"])
def test_uncompressed_columns_are_views_into_the_input(form):
    buffer, wanted = _three_batches()
    source = buffer if form == "bytes" else np.frombuffer(buffer, np.uint8)
    backing = np.frombuffer(source, np.uint8)
    columns = decode_columns(source, start_offset=3)
    assert np.shares_memory(columns.data, backing)
    assert len(columns) == 12
    for index, row in enumerate(row for row in wanted if row[0] >= 3):
        key = _field_view(columns, columns.key_positions, columns.key_lengths, index)
        value = _field_view(columns, columns.value_positions, columns.value_lengths, index)
        for view, field in ((key, row[2]), (value, row[3])):
            if field is None:
                assert view is None
            else:
                assert view.tobytes() == field
                assert view.size == 0 or np.shares_memory(view, backing)
        assert columns.key(index) == row[2]
        assert columns.value(index) == row[3]
        assert columns.headers(index) == row[4]


def test_columns_of_a_writable_array_see_later_writes():
    # Zero copy in the strongest sense: the columns read the caller's memory.
    buffer, _ = _three_batches()
    source = np.frombuffer(bytearray(buffer), np.uint8)
    columns = decode_columns(source)
    position = int(columns.value_positions[1])
    source[position] = ord("Q")
    assert columns.value(1) == b"Q"


def test_zstd_columns_are_an_inflated_copy():
    buffer, wanted = _three_batches("zstd")
    backing = np.frombuffer(buffer, np.uint8)
    columns = decode_columns(buffer)
    assert not np.shares_memory(columns.data, backing)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in columns.records()] == wanted


def test_decode_columns_of_nothing_is_empty():
    columns = decode_columns(b"")
    assert len(columns) == 0
    assert columns.records() == []


# --- defects found by these tests, now fixed ------------------------------------------

def test_bytes_like_values_wider_than_a_byte_keep_their_bytes():
    wide = np.array([1, 2], dtype=np.int32)
    batch = encode_batch([wide, b"xy"], timestamp_ms=0)
    assert [record.value for record in decode_records(batch)] == [wide.tobytes(), b"xy"]


def test_a_record_timestamp_below_minus_one_is_rejected():
    batch = reference_encode([(5, None, b"a", []), (-100, None, b"b", [])])
    with pytest.raises(CorruptRecordError):
        validate_batches(batch)


@pytest.mark.parametrize("options", [{"producer_epoch": 40_000}, {"base_sequence": 2**31}],
                         ids=["producer_epoch", "base_sequence"])
def test_producer_fields_out_of_range_are_rejected(options):
    with pytest.raises(LocalProtocolError):
        encode_batch([b"a"], timestamp_ms=0, **options)


def test_bytes_after_the_zstd_frame_are_rejected():
    frame = reference.compress_zstd(encode_record(0, 0, b"k", b"v", [])) + b"smuggled"
    with pytest.raises(CorruptRecordError):
        validate_batches(_zstd_batch(frame))


@pytest.mark.parametrize("values", [None, 5, np.array(5), np.array([b"a"], dtype=object)],
                         ids=["None", "int", "0-d array", "object array"])
def test_non_sequence_values_are_a_local_protocol_error(values):
    with pytest.raises(LocalProtocolError):
        encode_batch(values)


PROT_NONE = 0          # <sys/mman.h>; Python's mmap module does not export it


def test_decoding_reads_and_prefetches_nothing_past_the_end_of_a_mapping():
    """Batches that end where the mapping does, before a page no access may touch
    (PROT_NONE): decoding, whose walk prefetches ahead of each record
    (``limits.DECODE_PREFETCH_BYTES``), neither faults nor reads past the end."""
    page = mmap.PAGESIZE
    guarded = mmap.mmap(-1, 2 * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(guarded))
    assert libc.mprotect(base + page, page, PROT_NONE) == 0, ctypes.get_errno()
    batches = shmlog_encode(MIXED[:2]) + shmlog_encode([(7, b"k", b"v" * 100, [])] * 5)
    view = np.frombuffer(guarded, np.uint8, page)
    view[page - len(batches):] = np.frombuffer(batches, np.uint8)
    tail = view[page - len(batches):]
    tail.flags.writeable = False
    for verified in (False, True):
        assert [r.value for r in decode_columns(tail, verified=verified).records()] == \
            [b"value", b"a value"] + [b"v" * 100] * 5
    del view, tail
    guarded.close()


def test_decode_columns_of_verified_input_stops_at_zero_padding():
    padded = np.concatenate([encode_batch([b"a"], timestamp_ms=0), np.zeros(64, np.uint8)])
    assert [r.value for r in decode_columns(padded, verified=True).records()] == [b"a"]


def gathered(records, compression=None, **identity) -> bytes:
    """``encode_gathered`` fed as ``Producer.send`` feeds it: values as a list, keys
    and checked headers by index for the records that have them."""
    keys = {index: record[1] for index, record in enumerate(records) if record[1] is not None}
    headers = {index: check_headers(record[3])[0] for index, record in enumerate(records)
               if record[3]}
    return encode_gathered([record[2] for record in records], keys, headers,
                           np.array([record[0] for record in records], np.int64),
                           compression=Compression.parse(compression),
                           **{"producer_id": -1, "producer_epoch": -1, "base_sequence": -1,
                              **identity}).tobytes()


GATHERED_CASES = {
    "mixed": MIXED,
    "values only": [(1_000 + n, None, b"v%d" % n, []) for n in range(50)],
    "every key": [(7, b"k%d" % n, b"v" * n, []) for n in range(20)],
    "some keys": [(7, b"k" if n % 3 else None, b"v", []) for n in range(20)],
    "empty keys and values": [(7, b"", b"", []), (8, b"", None, []), (9, None, b"", [])],
    "tombstones": [(7, b"k", None, []), (7, None, None, [])],
    "headers on some": [(5, None, b"v", [("a", b"1"), ("n", None)] if n % 2 else [])
                        for n in range(9)],
    "headers on the last only": [(5, None, b"v", []), (6, None, b"w", [("", b"")])],
    "timestamps out of order": [(2_000, None, b"a", []), (-1, None, b"b", []),
                                (2**63 - 2, None, b"c", [])],
}


@pytest.mark.parametrize("case", GATHERED_CASES)
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_gathered_records_encode_as_the_reference_does(case, compression):
    """The producer's path (fields checked one by one, encoded once per batch) writes
    the reference's bytes for null, empty and set keys and values, headers on some
    records with null values, out-of-order timestamps, producer ids, zstd."""
    records = GATHERED_CASES[case]
    identity = {"producer_id": 7, "producer_epoch": 2, "base_sequence": 30}
    assert gathered(records, compression, **identity) == reference.reference_encode(
        records, compression=compression, **identity)
    assert gathered(records, compression) == shmlog_encode(records, compression)


@pytest.mark.parametrize("headers, error", [
    ([("h",)], LocalProtocolError), ([(1, b"x")], LocalProtocolError),
    ([("h", 5)], LocalProtocolError),
    ([("h", b"")] * (limits.RECORD_HEADER_COUNT_MAX + 1), RecordTooLargeError)])
def test_check_headers_refuses_malformed_headers(headers, error):
    with pytest.raises(error):
        check_headers(headers)


def test_check_headers_copies_and_sizes_the_entries():
    value = bytearray(b"abc")
    entries, size = check_headers([("h", value), ("ключ", None), ("e", memoryview(b""))])
    value[0] = ord("z")                          # the caller reuses its buffer
    assert entries == ((b"h", b"abc"), ("ключ".encode(), None), (b"e", b""))
    assert size == 3 * 8 + len(b"h" + b"abc" + "ключ".encode() + b"e")


def test_values_whose_item_counts_add_up_to_their_bytes_keep_their_bytes():
    """len() of an empty-rowed array counts rows, of a uint16 array items: the list of
    both has as many "items" as bytes, which must not pass for a list of bytes."""
    values = [np.zeros((2, 0), np.uint8), np.array([1, 2], np.uint16)]
    batch = encode_batch(values, timestamp_ms=0)
    assert [record.value for record in decode_records(batch)] == [b"", values[1].tobytes()]
