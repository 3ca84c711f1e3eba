"""Compressed batches: inflating a zstd batch's records (and checking them), and
storing a batch with another codec.

Rules
-----
* A zstd batch's records region is one zstd frame. It inflates only if the frame
  declares its size, that size is at most ``limits.DECOMPRESSED_RECORDS_SIZE_MAX``,
  and no byte follows the frame: every byte the CRC covers belongs to it. Anything
  else is ``CorruptRecordError`` with status ``BAD_COMPRESSION``.
* Inflated records are walked (``validation.walk_records``) before anything decodes
  them: :func:`check_inflated` does both.
* The batch header keeps every field through a change of codec but its length,
  codec bits and CRC (:func:`recompress_batch`); :func:`inflate_batch` makes a
  decoding buffer, not a stored batch (its CRC describes the compressed form).

Theory of operation
-------------------
Only the records region is compressed, as one frame (Kafka's format), so the
header stays readable without inflating. zstd runs at ``ZSTD_LEVEL``. Inflating
copies the records (that copy is unavoidable); an uncompressed batch is never
copied here: :func:`recompress_batch` to its own codec and :func:`inflate_batch`
of an uncompressed batch return a view of it.
"""

from __future__ import annotations

import numpy as np
import zstandard

from ..common import limits
from ..common.errors import CorruptRecordError
from ..native.crc32c import crc32c_kernel
from . import batch_layout as L
from .batch_header import BatchInfo, Compression
from .validation import BatchStatus, walk_records

__all__ = ["ZSTD_LEVEL", "inflate_records", "check_inflated", "recompress_batch",
           "inflate_batch"]


# zstd level 3 is Kafka's default (compression.zstd.level).
ZSTD_LEVEL = 3


def inflate_records(buffer: np.ndarray, info: BatchInfo) -> np.ndarray:
    """The records region of the zstd batch ``info`` describes, decompressed (its
    records not checked: :func:`check_inflated` does both).

    Raises
    ------
    CorruptRecordError
        The frame does not inflate, declares more than
        ``limits.DECOMPRESSED_RECORDS_SIZE_MAX`` bytes, or bytes follow it
        (status ``BAD_COMPRESSION``).
    """
    frame = buffer[info.position + L.RECORDS_OFFSET:info.position + info.batch_length]
    try:
        size = zstandard.frame_content_size(frame)
        if size < 0 or size > limits.DECOMPRESSED_RECORDS_SIZE_MAX:
            raise zstandard.ZstdError(f"frame declares {size} bytes")
        inflater = zstandard.ZstdDecompressor().decompressobj()
        records = inflater.decompress(frame)
        # Every CRC'd byte must belong to the one frame: nothing may ride after it.
        if not inflater.eof or inflater.unused_data or len(records) != size:
            raise zstandard.ZstdError("bytes follow the frame, or it is incomplete")
    except zstandard.ZstdError as error:
        raise CorruptRecordError(
            f"batch at position {info.position}: zstd frame does not inflate ({error})",
            status=int(BatchStatus.BAD_COMPRESSION), position=info.position) from None
    return np.frombuffer(records, np.uint8)


def recompress_batch(data: np.ndarray, info: BatchInfo, codec: "Compression") -> np.ndarray:
    """The batch at ``info.position`` stored with ``codec`` instead (what a topic's
    ``compression.type`` asks of the broker): same records, same header fields, new
    length, codec bits and CRC. The batch must have been validated."""
    start, end = info.position, info.position + info.batch_length
    if info.compression is codec:
        return data[start:end]
    if info.compression is Compression.ZSTD:
        records = inflate_records(data, info)
    else:
        records = data[start + L.RECORDS_OFFSET:end]
    if codec is Compression.ZSTD:
        records = np.frombuffer(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(records),
                                np.uint8)
    out = np.empty(L.HEADER_LENGTH + records.size, np.uint8)
    out[:L.HEADER_LENGTH] = data[start:start + L.HEADER_LENGTH]
    out[L.RECORDS_OFFSET:] = records
    header = out[:L.HEADER_LENGTH].view(L.BATCH_HEADER_DTYPE)
    header["batch_length"] = out.size
    header["attributes"] = (info.attributes & ~L.CODEC_MASK) | codec.value
    header["crc"] = crc32c_kernel(out, L.CRC_COVERED_OFFSET, out.size)
    return out


def check_inflated(buffer: np.ndarray, info: BatchInfo) -> np.ndarray:
    """Inflate the zstd batch ``info`` describes and walk its records as
    :func:`check_batch` walks an uncompressed batch's; the inflated records.

    Raises
    ------
    CorruptRecordError
        The frame does not inflate, or a record fails its check (the status says
        which; the position is the batch's).
    """
    records = inflate_records(buffer, info)
    status, position = walk_records(records, 0, records.size, info.record_count,
                                    info.last_offset_delta, info.first_timestamp,
                                    info.max_timestamp,
                                    info.timestamp_type == L.TIMESTAMP_CREATE_TIME)
    if status != BatchStatus.OK:
        raise CorruptRecordError(
            f"zstd batch at position {info.position}: {BatchStatus(status).name} "
            f"at byte {position} of its inflated records",
            status=status, position=info.position)
    return records


def inflate_batch(data: np.ndarray, info: BatchInfo) -> np.ndarray:
    """The batch with its records region inflated and its codec bits cleared: a
    decoding buffer, not a stored batch (its CRC describes the compressed form)."""
    start, end = info.position, info.position + info.batch_length
    if info.compression is not Compression.ZSTD:
        return data[start:end]
    records = check_inflated(data, info)
    header = data[start:start + L.HEADER_LENGTH].copy()
    header_fields = header.view(L.BATCH_HEADER_DTYPE)
    header_fields["batch_length"] = L.HEADER_LENGTH + records.size
    header_fields["attributes"] &= np.uint16(0xFFFF & ~L.CODEC_MASK)
    return np.concatenate([header, records])
