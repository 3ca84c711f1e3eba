"""Encoding record batches: records given as Python objects or numpy arrays become one
batch, header and CRC32C included, in one compiled pass.

Rules
-----
* Every field a caller gives is checked here, in Python, before the kernel runs
  (types, lengths, timestamps, producer fields, header names) and refused with
  ``LocalProtocolError`` (or ``RecordTooLargeError`` past the format's limits); the
  kernel trusts its columns and only checks they fill the batch exactly.
* The encoder writes base offset 0 and leader epoch 0: the log assigns the real
  ones. Offset deltas are 0..n-1, timestamps are stored relative to the first.
* No per-record Python bytecode on the common path: a field becomes a column with
  C-level operations (``b"".join``, ``map(len, ...)``).

Theory of operation
-------------------
Producers hand us records as Python objects or as numpy arrays: a batch at once
(:func:`encode_batch`), or the records ``Producer.send`` gathered one at a time,
their fields already checked (:func:`encode_gathered`). Either way each field
becomes a column - its bytes back to back and a byte length per record (-1: null),
built at C speed (``b"".join``, ``map(len, ...)``) - and one compiled kernel,
:func:`_encode_batch`, writes every record header, copies every field, and writes
the batch header and its CRC32C. zstd, when asked for, compresses the records
region as one frame and the header is written again around it
(``compression.recompress_batch``).
"""

from __future__ import annotations

import time

import numpy as np

from ..common import limits
from ..common.errors import LocalProtocolError, RecordTooLargeError
from ..native.crc32c import crc32c_kernel
from ..native.jit import copy_bytes, kernel, store_i16, store_i32, store_i64, store_u16, store_u32
from . import batch_layout as L
from .batch_header import Compression, batch_info
from .compression import recompress_batch

__all__ = ["encode_batch", "encode_gathered", "check_headers", "check_timestamp",
           "restamp_batch", "now_ms"]


@kernel
def _write_header(out, length, attributes, record_count, first_timestamp, max_timestamp,
                  producer_id, producer_epoch, base_sequence):
    store_u32(out, L.BATCH_LENGTH_OFFSET, length)
    store_u16(out, L.MAGIC_OFFSET, L.MAGIC)
    out[L.VERSION_OFFSET] = L.VERSION
    out[L.RESERVED_OFFSET] = 0
    store_i64(out, L.BASE_OFFSET_OFFSET, 0)
    store_i32(out, L.LEADER_EPOCH_OFFSET, 0)
    store_u16(out, L.ATTRIBUTES_OFFSET, attributes)
    store_i16(out, L.PRODUCER_EPOCH_OFFSET, producer_epoch)
    store_i32(out, L.RECORD_COUNT_OFFSET, record_count)
    store_i32(out, L.LAST_OFFSET_DELTA_OFFSET, max(record_count - 1, 0))
    store_i32(out, L.BASE_SEQUENCE_OFFSET, base_sequence)
    store_i64(out, L.PRODUCER_ID_OFFSET, producer_id)
    store_i64(out, L.FIRST_TIMESTAMP_OFFSET, first_timestamp)
    store_i64(out, L.MAX_TIMESTAMP_OFFSET, max_timestamp)
    store_u32(out, L.CRC_OFFSET, crc32c_kernel(out, L.CRC_COVERED_OFFSET, length))


@kernel
def _write_headers(out, position, count, headers, header_at, name_lengths, value_lengths,
                   header):
    """Write ``count`` header entries at ``position``, from entry ``header`` of the
    length columns and byte ``header_at`` of ``headers``. Returns (end, the next
    entry, the next byte), or end -1 when an entry runs past its buffer."""
    for _ in range(count):
        if header >= name_lengths.size:
            return -1, header, header_at
        name_length = name_lengths[header]
        value_length = value_lengths[header]
        size = name_length + max(value_length, 0)
        if name_length < 0 or header_at + size > headers.size or \
                position + L.HEADER_ENTRY_LENGTH + size > out.size:
            return -1, header, header_at
        store_u32(out, position + L.HEADER_KEY_LENGTH_OFFSET, name_length)
        store_i32(out, position + L.HEADER_VALUE_LENGTH_OFFSET, value_length)
        position += L.HEADER_ENTRY_LENGTH
        copy_bytes(out, position, headers, header_at, size)
        position += size
        header_at += size
        header += 1
    return position, header, header_at


@kernel
def _encode_batch(out, values, value_lengths, keys, key_lengths, timestamps, header_counts,
                  headers, header_name_lengths, header_value_lengths, attributes, producer_id,
                  producer_epoch, base_sequence):
    """Write a whole batch into ``out``, which is sized for it exactly: the records
    from ``RECORDS_OFFSET``, then the header and its CRC.

    Record ``i``'s value is the next ``value_lengths[i]`` bytes of ``values`` (-1:
    null, no bytes); its key likewise from ``keys`` (``key_lengths`` empty: every key
    null); its timestamp ``timestamps[i]`` (stored relative to the first); its
    ``header_counts[i]`` headers (``header_counts`` empty: none) the next entries of
    the header columns, each a name then a value (-1: null) back to back in
    ``headers``. Returns the batch length, or -1 when a length runs past its buffer
    or the fields do not fill ``out`` and their buffers exactly.
    """
    count = value_lengths.size
    if count == 0 or timestamps.size != count or \
            (key_lengths.size != 0 and key_lengths.size != count) or \
            (header_counts.size != 0 and header_counts.size != count):
        return -1
    first_timestamp = timestamps[0]
    max_timestamp = first_timestamp
    position = np.int64(L.RECORDS_OFFSET)
    value_at = key_at = header_at = header = 0
    for index in range(count):
        value_length = value_lengths[index]
        key_length = key_lengths[index] if key_lengths.size else L.NULL_LENGTH
        value_size = max(value_length, 0)
        key_size = max(key_length, 0)
        if value_at + value_size > values.size or key_at + key_size > keys.size or \
                position + L.RECORD_HEADER_LENGTH + key_size + value_size > out.size:
            return -1
        timestamp = timestamps[index]
        max_timestamp = max(max_timestamp, timestamp)
        header_count = header_counts[index] if header_counts.size else 0
        store_u32(out, position + L.OFFSET_DELTA_OFFSET, index)
        store_i64(out, position + L.TIMESTAMP_DELTA_OFFSET, timestamp - first_timestamp)
        store_i32(out, position + L.KEY_LENGTH_OFFSET, key_length)
        store_i32(out, position + L.VALUE_LENGTH_OFFSET, value_length)
        store_u32(out, position + L.HEADER_COUNT_OFFSET, header_count)
        end = position + L.RECORD_HEADER_LENGTH
        copy_bytes(out, end, keys, key_at, key_size)
        end += key_size
        key_at += key_size
        copy_bytes(out, end, values, value_at, value_size)
        end += value_size
        value_at += value_size
        end, header, header_at = _write_headers(out, end, header_count, headers, header_at,
                                                header_name_lengths, header_value_lengths,
                                                header)
        if end < 0:
            return -1
        store_u32(out, position + L.RECORD_LENGTH_OFFSET, end - position)
        position = end
    if position != out.size or value_at != values.size or key_at != keys.size or \
            header_at != headers.size or header != header_name_lengths.size:
        return -1
    _write_header(out, position, attributes, count, first_timestamp, max_timestamp,
                  producer_id, producer_epoch, base_sequence)
    return position


def check_headers(headers) -> tuple[tuple, int]:
    """One record's headers, checked, as ``((name bytes, value bytes | None), ...)``
    (a copy: the caller may reuse its list), and the bytes their entries take.

    Raises
    ------
    LocalProtocolError
        A header is not a (str, bytes-like | None) pair.
    RecordTooLargeError
        More than ``limits.RECORD_HEADER_COUNT_MAX`` headers.
    """
    if len(headers) > limits.RECORD_HEADER_COUNT_MAX:
        raise RecordTooLargeError(f"a record has {len(headers)} headers; at most "
                                  f"{limits.RECORD_HEADER_COUNT_MAX} are allowed")
    entries = []
    size = 0
    for entry in headers:
        name, value = _header_pair(entry)
        if value is not None:
            if type(value) is not bytes:
                if not _is_bytes_like(value):
                    raise LocalProtocolError(f"a header value must be bytes-like or None, "
                                             f"got {type(value).__name__}")
                value = memoryview(value).tobytes()
            size += len(value)
        size += L.HEADER_ENTRY_LENGTH + len(name)
        entries.append((name, value))
    return tuple(entries), size


def _header_pair(entry) -> tuple[bytes, object]:
    """A header as (encoded name, value), checking it is a (str, value) pair."""
    try:
        name, value = entry
    except (TypeError, ValueError):
        raise LocalProtocolError(
            f"a header must be a (str, bytes | None) pair, got {entry!r}") from None
    if not isinstance(name, str):
        raise LocalProtocolError(f"a header key must be str, got {name!r}")
    return name.encode(), value


# Empty columns: "no bytes", and "every entry null / no headers" for the optional ones.
# Byte buffers are read-only and length columns writable int64 everywhere, so the
# encoding kernel has one signature (see _read_only).
_NO_BYTES = np.frombuffer(b"", np.uint8)
_NO_LENGTHS = np.empty(0, np.int64)


def _read_only(data: np.ndarray) -> np.ndarray:
    """``data`` as a read-only array: what ``np.frombuffer(bytes)`` gives, so a caller's
    writable array does not make numba compile the encoder a second time."""
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False
    return data


# len() counts the bytes of these; of other bytes-like objects (an int32 array, a cast
# memoryview) it counts items, while join() copies bytes.
_PLAIN_BYTES = frozenset((bytes, bytearray))


def _column(values, count: int, what: str, *, bytes_only: bool = False):
    """One field of every record as (its bytes back to back, read-only; the byte length
    of each, -1 for None). ``values`` None: every field null (empty lengths).
    ``bytes_only``: the caller made every entry ``bytes`` or None, so ``len`` is each
    one's byte count and the lengths need no check."""
    if values is None:
        return _NO_BYTES, _NO_LENGTHS
    if type(values) is list and len(values) == count and \
            (bytes_only or _PLAIN_BYTES.issuperset(map(type, values))):
        try:
            data = b"".join(values)
        except TypeError:
            pass                                       # a None: the general path
        else:
            return np.frombuffer(data, np.uint8), np.fromiter(map(len, values), np.int64, count)
    if isinstance(values, np.ndarray):
        if values.dtype == object:
            values = list(values)
        elif values.ndim != 2 or values.dtype != np.uint8:
            values = _as_fixed_width(values, what)
    if isinstance(values, np.ndarray):
        if values.shape[0] != count:
            raise LocalProtocolError(f"{what}: {values.shape[0]} rows for {count} records")
        return (_read_only(np.ascontiguousarray(values).reshape(-1)),
                np.full(count, values.shape[1], np.int64))
    if not isinstance(values, (list, tuple)):
        raise LocalProtocolError(f"{what} must be a list or tuple (or an array of "
                                 f"fixed-size rows), got {type(values).__name__}")
    if len(values) != count:
        raise LocalProtocolError(f"{what}: {len(values)} entries for {count} records")
    try:
        lengths = np.fromiter((-1 if v is None else len(v) if type(v) is bytes
                               else memoryview(v).nbytes for v in values), np.int64, count)
        data = b"".join(v for v in values if v is not None)
    except (TypeError, BufferError, ValueError):
        bad = next((v for v in values if v is not None and not _is_bytes_like(v)), None)
        kind = type(bad).__name__ if bad is not None else "a non-contiguous buffer"
        raise LocalProtocolError(
            f"{what} must be contiguous bytes-like objects or None, got {kind}; "
            f"encode text first (e.g. value.encode())") from None
    return np.frombuffer(data, np.uint8), lengths


def _is_bytes_like(value) -> bool:
    try:
        memoryview(value)
        return True
    except TypeError:
        return False


def _as_fixed_width(values: np.ndarray, what: str) -> np.ndarray:
    """View an (n, ...) array of any fixed-size dtype as n rows of raw bytes."""
    if values.ndim == 0:
        raise LocalProtocolError(f"{what}: expected a sequence or an (n, width) array")
    values = np.ascontiguousarray(values)
    return values.view(np.uint8).reshape(values.shape[0], -1)


def _header_columns(records_headers, count: int):
    """The header columns of a batch from ``(record index, checked headers)`` pairs
    (:func:`check_headers`), for the records that have headers: (per-record counts,
    names and values back to back, name lengths, value lengths)."""
    if not records_headers:
        return _NO_LENGTHS, _NO_BYTES, _NO_LENGTHS, _NO_LENGTHS
    counts = np.zeros(count, np.int64)
    parts, name_lengths, value_lengths = [], [], []
    for index, entries in records_headers:
        counts[index] = len(entries)
        for name, value in entries:
            parts.append(name)
            name_lengths.append(len(name))
            if value is None:
                value_lengths.append(L.NULL_LENGTH)
            else:
                parts.append(value)
                value_lengths.append(len(value))
    if not name_lengths:
        return _NO_LENGTHS, _NO_BYTES, _NO_LENGTHS, _NO_LENGTHS
    return (counts, np.frombuffer(b"".join(parts), np.uint8),
            np.array(name_lengths, np.int64), np.array(value_lengths, np.int64))


def _checked_headers(headers, count: int) -> list:
    if headers is None:
        return []
    if len(headers) != count:
        raise LocalProtocolError(f"headers: {len(headers)} entries for {count} records")
    return [(index, check_headers(record_headers)[0])
            for index, record_headers in enumerate(headers) if record_headers]


def _record_count(values) -> int:
    if isinstance(values, np.ndarray) and values.ndim >= 1 and values.dtype != object:
        count = values.shape[0]
    elif isinstance(values, (list, tuple)):
        count = len(values)
    else:
        raise LocalProtocolError(
            f"values must be a list or tuple of bytes-like objects (or None), or an array "
            f"of fixed-size rows; got {type(values).__name__}")
    if count == 0:
        raise LocalProtocolError("a batch needs at least one record")
    return count


def restamp_batch(batch: np.ndarray, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> None:
    """Give a sealed batch another producer id, epoch and first sequence, and its CRC
    again (in place): an idempotent producer sending it again after an epoch bump."""
    _check_producer_fields(producer_id, producer_epoch, base_sequence)
    header = batch[:L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)
    header["producer_id"] = producer_id
    header["producer_epoch"] = producer_epoch
    header["base_sequence"] = base_sequence
    header["crc"] = crc32c_kernel(batch, L.CRC_COVERED_OFFSET, batch.size)


def _check_producer_fields(producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    for name, value, bits in (("producer_id", producer_id, 64),
                              ("producer_epoch", producer_epoch, 16),
                              ("base_sequence", base_sequence, 32)):
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                not low <= value <= high:
            raise LocalProtocolError(f"{name} must be an integer in [{low}, {high}], "
                                     f"got {value!r}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def check_timestamp(value) -> int:
    """A record timestamp given by the caller: an integer in the range a batch stores.

    Raises
    ------
    LocalProtocolError
        Not an integer, or outside ``[NO_TIMESTAMP, limits.TIMESTAMP_MS_MAX]``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not L.NO_TIMESTAMP <= value <= limits.TIMESTAMP_MS_MAX:
        raise LocalProtocolError(f"timestamp_ms must be an integer in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] (milliseconds since the epoch), "
                                 f"got {value!r:.100}")
    return int(value)


def _timestamps(timestamps, timestamp_ms, count: int) -> np.ndarray:
    """Every record's timestamp as a fresh int64 array, checked."""
    if timestamps is None:
        stamp = now_ms() if timestamp_ms is None else check_timestamp(timestamp_ms)
        return np.full(count, stamp, np.int64)
    try:
        stamps = np.array(timestamps, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as error:
        raise LocalProtocolError(f"timestamps must be integers in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] ({error})") from None
    if stamps.shape != (count,):
        raise LocalProtocolError(f"timestamps: shape {stamps.shape} for {count} records")
    if stamps.min() < L.NO_TIMESTAMP or stamps.max() > limits.TIMESTAMP_MS_MAX:
        raise LocalProtocolError(f"timestamps must be in [{L.NO_TIMESTAMP}, "
                                 f"{limits.TIMESTAMP_MS_MAX}] (milliseconds since the "
                                 f"epoch), got {int(stamps.min())}..{int(stamps.max())}")
    return stamps


def _encode(values, keys, headers, timestamps: np.ndarray, codec: "Compression",
            producer_id: int, producer_epoch: int, base_sequence: int,
            attributes: int) -> np.ndarray:
    """One batch from its columns (:func:`_column`, :func:`_header_columns`)."""
    value_bytes, value_lengths = values
    key_bytes, key_lengths = keys
    header_counts, header_bytes, header_name_lengths, header_value_lengths = headers
    count = value_lengths.size
    records_size = (L.RECORD_HEADER_LENGTH * count + value_bytes.size + key_bytes.size
                    + L.HEADER_ENTRY_LENGTH * header_name_lengths.size + header_bytes.size)
    if records_size + L.HEADER_LENGTH > limits.BATCH_SIZE_MAX:
        raise RecordTooLargeError(
            f"batch of {count} records is {records_size + L.HEADER_LENGTH} bytes; "
            f"the format allows {limits.BATCH_SIZE_MAX}")
    out = np.empty(L.HEADER_LENGTH + records_size, np.uint8)
    length = _encode_batch(out, value_bytes, value_lengths, key_bytes, key_lengths, timestamps,
                           header_counts, header_bytes, header_name_lengths,
                           header_value_lengths, attributes, producer_id,
                           producer_epoch, base_sequence)
    assert length == out.size, "the columns' lengths disagree with their bytes"
    if codec is Compression.ZSTD:
        out = recompress_batch(out, batch_info(out, 0), codec)
    return out


def encode_batch(values, keys=None, headers=None, timestamps=None, *, timestamp_ms=None,
                 compression=None, producer_id: int = L.NO_PRODUCER_ID,
                 producer_epoch: int = L.NO_PRODUCER_EPOCH,
                 base_sequence: int = L.NO_SEQUENCE, control: bool = False,
                 transactional: bool = False) -> np.ndarray:
    """Encode records as one batch (base offset 0: the log assigns the real one).

    Parameters
    ----------
    values : sequence of bytes-like or None, or numpy.ndarray
        Record values; None is a null value (a tombstone). A 2-D uint8 array (or any
        array whose rows are fixed-size records) gives one record per row.
    keys : same forms as ``values``, or None for all-null keys.
    headers : sequence of sequences of (str, bytes | None), or None.
    timestamps : sequence of int or numpy.ndarray, optional
        Per-record CreateTime in milliseconds; by default every record gets
        ``timestamp_ms`` (itself defaulting to now).
    compression : None, "zstd" or Compression
    producer_id, producer_epoch, base_sequence : int
        Idempotent-producer identity; -1 when not used.
    control : bool
        Mark the batch as a control batch.
    transactional : bool
        Mark the batch as part of a transaction (or, with ``control``, its end).

    Returns
    -------
    numpy.ndarray
        The batch bytes (uint8), CRC included.

    Raises
    ------
    LocalProtocolError
        A field has the wrong type or the columns disagree in length.
    RecordTooLargeError
        The batch would exceed the format's limits.
    """
    count = _record_count(values)
    _check_producer_fields(producer_id, producer_epoch, base_sequence)
    if count > limits.BATCH_RECORD_COUNT_MAX:
        raise RecordTooLargeError(f"{count} records exceed {limits.BATCH_RECORD_COUNT_MAX}")
    codec = Compression.parse(compression)
    value_column = _column(values, count, "values")
    key_column = _column(keys, count, "keys")
    header_columns = _header_columns(_checked_headers(headers, count), count)
    return _encode(value_column, key_column, header_columns,
                   _timestamps(timestamps, timestamp_ms, count), codec, producer_id,
                   producer_epoch, base_sequence,
                   (L.CONTROL_BIT if control else 0) |
                   (L.TRANSACTIONAL_BIT if transactional else 0))


def encode_gathered(values: list, keys: dict, headers: dict, timestamps: np.ndarray, *,
                    compression: "Compression", producer_id: int, producer_epoch: int,
                    base_sequence: int, transactional: bool = False) -> np.ndarray:
    """Encode the records a producer gathered one at a time as one batch (of its
    transaction, marked so, when ``transactional``).

    The caller checked each field as it came (``Producer.send``), so this does no
    per-record Python work on the common path: ``values`` is a list of ``bytes`` or
    None; ``keys`` (bytes) and ``headers`` (as :func:`check_headers` gives them) map
    a record's index to its field, for the records that have one; ``timestamps`` is
    an int64 array of milliseconds, one per record, each in the range a batch stores.
    """
    count = len(values)
    if not keys:
        key_column = _column(None, count, "keys")
    elif len(keys) == count:
        key_column = _column(list(keys.values()), count, "keys", bytes_only=True)
    else:
        every_key = [None] * count
        for index, key in keys.items():
            every_key[index] = key
        key_column = _column(every_key, count, "keys", bytes_only=True)
    return _encode(_column(values, count, "values", bytes_only=True), key_column,
                   _header_columns(headers.items(), count), timestamps, compression,
                   producer_id, producer_epoch, base_sequence,
                   L.TRANSACTIONAL_BIT if transactional else 0)
