"""The record codec's face: encode, validate and decode record batches (the layout is
in ``batch_layout``). Import its names from here; each lives in the module of its job:

* ``validation``: :class:`BatchStatus` and the compiled checks every byte from
  outside passes (:func:`batch_frame`, :func:`check_batch`,
  :func:`check_produced_batch`);
* ``batch_header``: a batch's header as Python values (:class:`BatchInfo`,
  :func:`batch_info`), the offsets batches back to back take (:func:`offset_span`)
  and its codec (:class:`Compression`);
* ``compression``: zstd batches inflated and checked, batches stored with another
  codec (:func:`inflate_records`, :func:`check_inflated`, :func:`recompress_batch`,
  :func:`inflate_batch`);
* ``encoding``: records to one batch in one compiled pass (:func:`encode_batch`,
  :func:`encode_gathered`, :func:`restamp_batch`) and the checks of what callers
  give (:func:`check_headers`, :func:`check_timestamp`);
* ``columns``: decoded records as columns into the batch bytes
  (:class:`RecordColumns`) and as Python objects (:class:`Record`);
* ``decoding``: whole batches validated and decoded (:func:`decode_columns`,
  :func:`decode_records`) or walked for their headers (:func:`validate_batches`,
  :func:`iter_batches`).

Theory of operation
-------------------
A batch is encoded once, by its producer (``encoding``), and validated wherever its
bytes come from (``validation``: a producer's ring, a disk, a peer) before anything
trusts them; decoding (``decoding``, ``columns``) reads only validated bytes, with
no per-record work in Python. Compression touches only the records region of a
batch (``compression``), so every walk over batches reads headers without
inflating.
"""

from .batch_header import BatchInfo, Compression, batch_info, offset_span
from .columns import Record, RecordColumns, gather_fields
from .compression import (
    ZSTD_LEVEL,
    check_inflated,
    inflate_batch,
    inflate_records,
    recompress_batch,
)
from .decoding import (
    decode_columns,
    decode_records,
    iter_batches,
    validate_batches,
    warm_decoding,
)
from .encoding import (
    check_headers,
    check_timestamp,
    encode_batch,
    encode_gathered,
    now_ms,
    restamp_batch,
)
from .validation import BatchStatus, batch_frame, check_batch, check_produced_batch

__all__ = [
    "BatchStatus", "BatchInfo", "Record", "RecordColumns", "Compression",
    "encode_batch", "encode_gathered", "check_headers", "check_timestamp", "validate_batches",
    "iter_batches", "decode_columns", "decode_records", "warm_decoding",
    "batch_frame", "check_batch", "check_produced_batch", "check_inflated", "inflate_records",
    "batch_info", "inflate_batch", "recompress_batch", "restamp_batch", "now_ms", "ZSTD_LEVEL",
    "gather_fields", "offset_span",
]
