"""Read and verify segment files on their own, without opening the partition
(what ``shmlog dump`` shows; works on a live broker's files too).

An active segment's files are preallocated: the log and both indexes are sized to
their capacities (``segment.bytes``, ``segment.index.bytes``) and read as zeros
past what was written. Verification tells that space from damage: zeros after the
last batch of the log, zero entries after the last entry of an index, and a zero
remainder too short for a whole entry (a time index's capacity need not be a
multiple of its 12-byte entries) are preallocated space; a non-zero byte in any of
them is reported. The indexes are read before the log: a broker writes an index
entry after its batch, so every entry read names a batch the log already holds
when it is walked, however fast the broker appends meanwhile.

A live broker's active segment is verified up to its published end, no further
(``published_end``: the ``active_segment_size`` of the partition's row in the
state table, which the caller loads before anything here is read). The appender
copies a batch into the segment before it publishes it, so past that end lie
bytes of a batch still being copied: a zero batch length followed by non-zero
bytes there is a write in progress, not a torn one. Below it every byte belongs to
complete batches, so the same sight there (or anywhere in a sealed segment, or
with no broker running) is still reported. Index entries that name a batch past
the published end are that batch's, written before its publish: they are not
checked either.

A transaction index (``.txnindex``) is read as the writer would open it, without
changing it: its whole, valid entries (``transaction_index_layout``), and what
follows them reported (a torn tail the broker cuts at its next open). Verified, each
entry's last offset must be an abort marker's: a control batch of the log beside it.

Nothing here prints: functions return what they found, the CLI formats it.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

import numpy as np

from ..common.errors import CorruptRecordError, StorageError
from ..record.records import (
    BatchStatus,
    Compression,
    batch_info,
    check_batch,
    check_inflated,
    decode_columns,
    inflate_batch,
)
from . import index_layout as I
from .transaction_index_layout import read_file, transactions_of, valid_entries

__all__ = ["SegmentReport", "TxnIndexReport", "read_segment", "read_index", "read_txn_index",
           "used_entries", "base_offset_of"]


@dataclasses.dataclass
class SegmentReport:
    """What a segment file holds and what is wrong with it."""
    path: str
    base_offset: int
    file_size: int
    data_end: int = 0                       # end of the last good batch
    published_end: int | None = None        # a live active segment's: verified up to here
    batches: list = dataclasses.field(default_factory=list)       # BatchInfo
    records: list = dataclasses.field(default_factory=list)       # RecordColumns per batch
    problems: list = dataclasses.field(default_factory=list)      # str

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class TxnIndexReport:
    """What a transaction index holds and what is wrong with it."""
    path: str
    base_offset: int
    file_size: int
    entries: list = dataclasses.field(default_factory=list)       # AbortedTransaction
    problems: list = dataclasses.field(default_factory=list)      # str

    @property
    def ok(self) -> bool:
        return not self.problems


def base_offset_of(path: str) -> int:
    stem = os.path.basename(path).split(".")[0]
    if not (stem.isdigit() and len(stem) == I.FILE_NAME_DIGITS):
        raise StorageError(f"{path}: not a segment file name (expected 20 digits + suffix)")
    return int(stem)


def _map(path: str) -> np.ndarray:
    try:
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            if size == 0:
                return np.zeros(0, np.uint8)
            mapped = mmap.mmap(source.fileno(), size, access=mmap.ACCESS_READ)
            return np.frombuffer(mapped, np.uint8)
    except OSError as error:
        raise StorageError(f"cannot read {path}: {error}") from error


def read_segment(path: str, *, with_records: bool = False, verify: bool = True,
                 published_end: int | None = None) -> SegmentReport:
    """Walk every batch of a ``.log`` file; with ``verify`` also check its indexes.

    Parameters
    ----------
    path : str
        A ``<base offset>.log`` file.
    with_records : bool
        Decode each batch's records into ``report.records``.
    verify : bool
        Check the ``.index`` and ``.timeindex`` beside the log against it.
    published_end : int or None
        For a live broker's active segment, where its published data ends (loaded
        before this call): the bytes past it are not read. None reads the whole file.
    """
    base_offset = base_offset_of(path)
    indexes = _read_indexes(path) if verify else {}
    data = _map(path)
    report = SegmentReport(path, base_offset, data.size, published_end=published_end)
    if published_end is not None:
        if published_end > data.size:
            report.problems.append(f"the broker published {published_end} bytes, but the "
                                   f"file holds {data.size}")
        data = data[:published_end]
    _walk(report, data, with_records)
    if published_end is not None and report.ok and report.data_end != published_end:
        report.problems.append(f"byte {report.data_end}: the batches end here, below the "
                               f"published end {published_end} (torn write?)")
    if published_end is not None:
        indexes = {path: _published_entries(path, entries, report)
                   for path, entries in indexes.items()}
    if verify:
        _verify_indexes(report, indexes)
    return report


def _walk(report: SegmentReport, data: np.ndarray, with_records: bool) -> None:
    """Check the batches of ``data`` one by one, stopping at the end of the data
    (a zero length: what follows must be zeros too) or at the first bad one."""
    position = 0
    next_offset = report.base_offset
    while position < data.size:
        status, length = check_batch(data, position, data.size, True, True)
        if status == BatchStatus.END_OF_DATA:
            if np.any(data[position:]):
                report.problems.append(f"byte {position}: zero batch length followed by "
                                       f"non-zero bytes (torn write?)")
            return
        if status != BatchStatus.OK:
            report.problems.append(f"byte {position}: {BatchStatus(status).name} "
                                   f"(batch_length {length}); stopped here")
            return
        info = batch_info(data, position)
        if info.base_offset < next_offset:
            report.problems.append(f"byte {position}: base offset {info.base_offset} is below "
                                   f"the expected {next_offset}; stopped here")
            return
        try:
            if info.compression is Compression.ZSTD:
                check_inflated(data, info)
            if with_records:
                report.records.append(decode_columns(inflate_batch(data, info), verified=True,
                                                     control=True))
        except CorruptRecordError as error:
            report.problems.append(f"byte {position}: {error}; stopped here")
            return
        report.batches.append(info)
        next_offset = info.next_offset
        position += length
        report.data_end = position


def read_index(path: str) -> np.ndarray:
    """The entries of a ``.index`` or ``.timeindex`` file (a structured array),
    preallocated zero entries included (see :func:`used_entries`).

    Raises
    ------
    StorageError
        The file cannot be read, or ends in a partial entry that is not zeros.
    """
    dtype = I.TIME_INDEX_DTYPE if path.endswith(I.TIME_INDEX_SUFFIX) else I.OFFSET_INDEX_DTYPE
    data = _map(path)
    whole = data.size - data.size % dtype.itemsize
    if np.any(data[whole:]):
        raise StorageError(f"{path}: {data.size} bytes is not a whole number of "
                           f"{dtype.itemsize}-byte entries, and the last "
                           f"{data.size - whole} are not preallocated zeros")
    return data[:whole].view(dtype)


def _read_indexes(log_path: str) -> dict:
    """A copy of the used entries of each index beside ``log_path`` (or why there
    are none), by path: what the broker had written by now."""
    stem = log_path[:-len(I.LOG_SUFFIX)]
    indexes = {}
    for path in (stem + I.OFFSET_INDEX_SUFFIX, stem + I.TIME_INDEX_SUFFIX):
        if not os.path.exists(path):
            indexes[path] = f"{path}: missing (the broker rebuilds it on open)"
            continue
        try:
            entries = read_index(path)
        except StorageError as error:
            indexes[path] = str(error)
            continue
        # An active segment's index is preallocated: its unused tail is zeros.
        indexes[path] = entries[:used_entries(entries)].copy()
    return indexes


def _published_entries(path: str, entries, report: SegmentReport):
    """The entries of an index (or why there are none) that name published batches:
    those of a batch still being copied are written before its publish."""
    if isinstance(entries, str):
        return entries
    if path.endswith(I.OFFSET_INDEX_SUFFIX):
        return entries[entries["position"].astype(np.int64) < report.data_end]
    published = report.batches[-1].next_offset - report.base_offset if report.batches else 0
    return entries[entries["relative_offset"].astype(np.int64) < published]


def _verify_indexes(report: SegmentReport, indexes: dict) -> None:
    starts = {info.position: info for info in report.batches}
    last_offsets = np.array([info.last_offset for info in report.batches], np.int64)
    running_max = np.maximum.accumulate(
        np.array([info.max_timestamp for info in report.batches], np.int64)) \
        if report.batches else np.zeros(0, np.int64)
    for path, entries in indexes.items():
        if isinstance(entries, str):
            report.problems.append(entries)
            continue
        for number, entry in enumerate(entries):
            offset = report.base_offset + int(entry["relative_offset"])
            if path.endswith(I.OFFSET_INDEX_SUFFIX):
                info = starts.get(int(entry["position"]))
                if info is None or info.base_offset != offset:
                    report.problems.append(
                        f"{path}: entry {number} (offset {offset}, position "
                        f"{int(entry['position'])}) does not point at that batch")
            else:
                batch = int(np.searchsorted(last_offsets, offset))
                if batch >= last_offsets.size or last_offsets[batch] != offset:
                    report.problems.append(f"{path}: entry {number} names offset {offset}, "
                                           f"which is not the end of a batch")
                elif running_max[batch] > int(entry["timestamp"]):
                    report.problems.append(
                        f"{path}: entry {number} says records up to offset {offset} are at "
                        f"most {int(entry['timestamp'])}, but one has {int(running_max[batch])}")
        if np.any(np.diff(entries["relative_offset"].astype(np.int64)) <= 0):
            report.problems.append(f"{path}: entries are not in increasing offset order")


def used_entries(entries: np.ndarray) -> int:
    """Entries before the zero-filled tail of a preallocated index."""
    if not entries.size:
        return 0
    raw = entries.view(np.uint8).reshape(entries.size, entries.dtype.itemsize)
    nonzero = np.flatnonzero(raw.any(axis=1))
    return int(nonzero[-1]) + 1 if nonzero.size else 0


def read_txn_index(path: str, *, verify: bool = False) -> TxnIndexReport:
    """The entries of a ``.txnindex`` file up to the first that is torn or breaks the
    rules (reported); with ``verify``, each checked against the log beside it: its
    last offset is an abort marker's, a control batch there.

    Raises
    ------
    StorageError
        The file cannot be read.
    """
    base_offset = base_offset_of(path)
    data = read_file(path)
    entries, reason = valid_entries(data, base_offset)
    report = TxnIndexReport(path, base_offset, len(data), transactions_of(entries))
    if reason:
        report.problems.append(f"{path}: {reason} (the broker cuts it at its next open)")
    if verify:
        log_path = path[:-len(I.TXN_INDEX_SUFFIX)] + I.LOG_SUFFIX
        if not os.path.exists(log_path):
            report.problems.append(f"{log_path}: missing, so its transaction index is stale")
            return report
        markers = {info.base_offset for info in read_segment(log_path, verify=False).batches
                   if info.is_control}
        for number, entry in enumerate(report.entries):
            if entry.last_offset not in markers:
                report.problems.append(
                    f"{path}: entry {number} (producer {entry.producer_id}) names offset "
                    f"{entry.last_offset}, which is not a control batch (its abort marker) "
                    f"of {log_path}")
    return report
