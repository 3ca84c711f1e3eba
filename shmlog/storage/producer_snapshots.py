"""Producer-state snapshots: the last batches of every idempotent producer below a
segment's base offset, so an open (or a truncation) finds every producer without
reading the whole log (Kafka's ``ProducerStateManager`` snapshots).

Rules
-----
* What is remembered of a producer is its window (``producer_window``): its last
  :data:`limits.PRODUCER_BATCHES_MAX` batches in the log under its latest epoch,
  each batch's producer epoch, first sequence, base offset and last offset delta;
  what the appender's duplicate and sequence checks need (``appender``: a re-send
  of any of those batches is acknowledged with its offset, not appended again).
* A snapshot ``<20-digit offset>.producers.json`` in the partition directory holds
  that for every producer below its offset, and is written when a segment rolls at
  that offset (Kafka's ``<offset>.snapshot`` at each roll)::

      {"version": 3, "producers": [[producer_id, epoch, base_sequence,
                                    base_offset, last_offset_delta], ...],
       "transactions": [[producer_id, epoch, first_offset], ...]}

  one row per batch remembered, a producer's rows in log order, and one per
  transaction open at that offset (Kafka's snapshot keeps each producer's
  ``currentTxnFirstOffset``): a transaction open across a roll is found again
  without reading the segments before the snapshot. Version 2 (no transactions)
  and version 1 (one row per producer: its last batch) are still read.
* The walks follow each producer's transaction: a transactional batch opens one
  where none is open, a marker closes it, and an ABORT marker's transaction is
  kept among the state's aborts, so an open finds an abort whose ``.txnindex``
  entry a crash lost (``PartitionLog.producer_state``).

  It is replaced whole (a temporary file renamed over it), but not fsynced: a
  snapshot a crash lost or left empty is one the next open ignores, so the roll
  that writes it on the broker's loop waits for no disk.
* A snapshot is only a shortcut: a missing or unreadable one is recomputed from
  the snapshot before it (or from the log start) by walking batch headers, so a
  failed write, an old log without snapshots, or a crash between a roll and its
  snapshot costs a longer walk at the next open, never a forgotten producer.
* A producer whose last batch lies wholly below the log start is forgotten, as
  Kafka evicts it (``ProducerStateManager.truncateHead``): retention removed it;
  so is any older batch of a window that lies wholly below the log start, as a
  walk of the log would no longer find it.

Theory of operation
-------------------
Why snapshots and not a walk back over a fixed number of segments: no number of
segments is enough. A producer's last batch can be anywhere in the log (an
acks=all batch parked while other producers go on, a producer idle since), and
forgetting it makes its re-send a second copy. A walk of every segment at every
open is correct but reads the whole log. A snapshot per roll costs one header
walk of the segment just sealed, while its pages are still in memory, and a small
file; an open then loads one file and walks the active segment, as before. A
snapshot keeps each producer's whole window, not its last batch alone as Kafka's
does: a restart then recognises a re-send of any of the last five batches, those
below the active segment too, with no walk further back.

:class:`ProducerState` keeps the producers' windows in a numba typed dict (producer
id -> window) that compiled walks fill (:func:`_remember_batches`, stepping with
``records.batch_frame``) and that crosses into Python only as an array (``rows``),
never by iteration, and is made and measured by ``typed_containers``' kernels (see
there why).

:class:`ProducerStateManager` keeps one partition log's state below its active
segment, with the snapshots, as the log changes: loaded at an open and after a
truncation (:meth:`~ProducerStateManager.load`), a snapshot at each roll, cleared
when the log restarts empty. The partition log (``segments.PartitionLog``) calls it.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from ..common import access, limits
from ..common.errors import StorageError
from ..native import typed_containers as typed
from ..native.jit import kernel, load_i16, load_i32, load_i64, load_u16
from ..record import batch_layout as B
from ..record.control import ControlType, marker_type
from ..record.records import batch_frame
from ..shm.completion import SEQUENCE_MODULUS
from . import index_layout as I
from .producer_window import (
    EMPTY_WINDOW,
    EPOCH,
    HELD,
    last_sequence,
    window_batch,
    window_fence,
    window_last_offset,
    window_of,
    window_push,
)

log = logging.getLogger(__name__)

__all__ = ["ProducerState", "ProducerStateManager", "SNAPSHOT_SUFFIX", "snapshot_offsets",
           "read_snapshot", "write_snapshot", "delete_snapshots"]

SNAPSHOT_SUFFIX = ".producers.json"
SNAPSHOT_VERSION = 3
SNAPSHOT_VERSIONS_READ = (1, 2, 3)   # 1: one row per producer, its last batch; 2: no transactions
# Columns of ProducerState.rows() and of a snapshot's entries.
PRODUCER_ID = 0
PRODUCER_EPOCH = 1
BASE_SEQUENCE = 2
BASE_OFFSET = 3
LAST_OFFSET_DELTA = 4
COLUMNS = 5
# Columns of ProducerState.open_transactions() and of a snapshot's "transactions".
TRANSACTION_COLUMNS = 3               # producer id, epoch, first offset
_NO_TRANSACTION = (np.int64(-1), np.int64(-1))
_NO_TRANSACTIONS = np.zeros((0, TRANSACTION_COLUMNS), np.int64)
_ABORT = int(ControlType.ABORT)



@kernel(inline="always")
def _follow_transaction(log, batch, length, producer_id, epoch, base_offset, marker,
                        transactions, aborts):
    """The batch at ``batch`` in the producer's transactions: a transactional batch
    opens one where none is open; a marker closes it, and an ABORT's (producer id,
    first offset, marker offset, the lowest first offset still open or the marker's
    next) goes to ``aborts``."""
    if marker:
        entry = typed.get_or(transactions, producer_id, _NO_TRANSACTION)
        if entry[1] < 0:
            return
        del transactions[producer_id]
        if marker_type(log, batch, batch + length) == _ABORT:
            lowest = base_offset + 1
            for other in transactions.values():
                lowest = min(lowest, other[1])
            aborts.append((producer_id, entry[1], base_offset, lowest))
    elif load_u16(log, batch + B.ATTRIBUTES_OFFSET) & B.TRANSACTIONAL_BIT \
            and producer_id not in transactions:
        transactions[producer_id] = (epoch, base_offset)


@kernel
def _remember_batches(log, start, end, min_offset, table, transactions, aborts):
    """Add to each producer's window in ``table`` its batches among those of
    ``log[start:end]`` whose base offset is at least ``min_offset`` (what a
    snapshot at ``min_offset`` already holds is not walked over again), in order;
    stops at the end of the data or at a batch it cannot frame. Each producer's
    open transaction is followed in ``transactions`` (:func:`_follow_transaction`).

    The first ``limits.WALK_PRODUCERS_MAX`` producers met have their windows kept in
    local variables (the last one hit probed first) and put back into ``table`` at
    the end; any other's is changed in ``table`` at once. A producer is in one or
    the other for the whole walk, so its window takes every batch either way."""
    ids = np.empty(limits.WALK_PRODUCERS_MAX, np.int64)
    windows = [EMPTY_WINDOW for _ in range(limits.WALK_PRODUCERS_MAX)]
    known = 0
    hit = 0
    position = start
    while position < end:
        status, length = batch_frame(log, position, end)
        if status != 0:
            break
        producer_id = load_i64(log, position + B.PRODUCER_ID_OFFSET)
        base_offset = load_i64(log, position + B.BASE_OFFSET_OFFSET)
        position += length
        if producer_id < 0 or base_offset < min_offset:
            continue
        batch = position - length
        epoch = np.int64(load_i16(log, batch + B.PRODUCER_EPOCH_OFFSET))
        marker = load_u16(log, batch + B.ATTRIBUTES_OFFSET) & B.CONTROL_BIT != 0
        first = np.int64(load_i32(log, batch + B.BASE_SEQUENCE_OFFSET))
        last = last_sequence(first, np.int64(load_i32(log, batch + B.LAST_OFFSET_DELTA_OFFSET)))
        _follow_transaction(log, batch, length, producer_id, epoch, base_offset, marker,
                            transactions, aborts)
        if known == 0 or ids[hit] != producer_id:
            hit = 0
            while hit < known and ids[hit] != producer_id:
                hit += 1
            if hit == known:
                if known == limits.WALK_PRODUCERS_MAX:
                    hit = 0
                    window = window_of(table, producer_id)
                    table[producer_id] = window_fence(window, epoch) if marker else \
                        window_push(window, epoch, first, last, base_offset)
                    continue
                ids[known] = producer_id
                windows[known] = window_of(table, producer_id)
                known += 1
        windows[hit] = window_fence(windows[hit], epoch) if marker else \
            window_push(windows[hit], epoch, first, last, base_offset)
    for index in range(known):
        table[ids[index]] = windows[index]


@kernel
def _export(table, min_last_offset, out):
    """Write the batches held whose last offset is at least ``min_last_offset`` into
    ``out`` (one row each, ``COLUMNS`` wide, a producer's oldest first); how many."""
    count = 0
    for producer_id, window in table.items():
        for age in range(window[HELD] - 1, -1, -1):
            if window_last_offset(window, age) >= min_last_offset:
                first, last, base_offset = window_batch(window, age)
                out[count, PRODUCER_ID] = producer_id
                out[count, PRODUCER_EPOCH] = window[EPOCH]
                out[count, BASE_SEQUENCE] = first
                out[count, BASE_OFFSET] = base_offset
                out[count, LAST_OFFSET_DELTA] = (last - first) % SEQUENCE_MODULUS
                count += 1
    return count


@kernel
def _batches_held(table):
    count = 0
    for window in table.values():
        count += window[HELD]
    return count


@kernel
def _import(table, rows):
    """Add the batches of ``rows`` (a producer's in log order) to their windows."""
    for index in range(rows.shape[0]):
        producer_id = rows[index, PRODUCER_ID]
        first = rows[index, BASE_SEQUENCE]
        table[producer_id] = window_push(
            window_of(table, producer_id), rows[index, PRODUCER_EPOCH], first,
            last_sequence(first, rows[index, LAST_OFFSET_DELTA]), rows[index, BASE_OFFSET])


@kernel
def _abort_rows(aborts):
    out = np.empty((len(aborts), 4), np.int64)
    for index in range(len(aborts)):
        for column in range(4):
            out[index, column] = aborts[index][column]
    return out


@kernel
def _export_transactions(transactions):
    out = np.empty((len(transactions), TRANSACTION_COLUMNS), np.int64)
    index = 0
    for producer_id, entry in transactions.items():
        out[index, 0], out[index, 1], out[index, 2] = producer_id, entry[0], entry[1]
        index += 1
    return out


@kernel
def _import_transactions(transactions, rows):
    for index in range(rows.shape[0]):
        transactions[rows[index, 0]] = (rows[index, 1], rows[index, 2])


def _in_log_order(rows: np.ndarray) -> np.ndarray:
    """``rows`` by producer id, then base offset."""
    return rows[np.lexsort((rows[:, BASE_OFFSET], rows[:, PRODUCER_ID]))]


class ProducerState:
    """The last batches of each producer in a stretch of a log (see the rules).

    Parameters
    ----------
    rows : numpy.ndarray, optional
        Producers to start from, as :meth:`rows` gives them.
    transactions : numpy.ndarray, optional
        Open transactions to start from, as :meth:`open_transactions` gives them.
    """

    def __init__(self, rows: np.ndarray | None = None,
                 transactions: np.ndarray | None = None):
        self._table = typed.producer_table()
        self._transactions = typed.transaction_table()
        # The aborts the walks met since this state was made: (producer id, first
        # offset, marker offset, last stable offset after it).
        self._aborts = typed.abort_list()
        if rows is not None and rows.size:
            _import(self._table, _in_log_order(np.ascontiguousarray(rows, np.int64)))
        if transactions is not None and transactions.size:
            _import_transactions(self._transactions,
                                 np.ascontiguousarray(transactions, np.int64))

    def __len__(self) -> int:
        """How many producers."""
        return typed.table_size(self._table)

    def batches_held(self) -> int:
        """How many batches, of every producer."""
        return _batches_held(self._table)

    def remember(self, log: np.ndarray, start: int, end: int, min_offset: int = 0) -> None:
        """Walk the batches of ``log[start:end]`` (a segment's bytes, from a batch
        boundary) whose base offset is at least ``min_offset``: each producer's
        last ones are remembered."""
        _remember_batches(log, int(start), min(int(end), log.size), int(min_offset), self._table,
                          self._transactions, self._aborts)

    def rows(self, min_last_offset: int = 0) -> np.ndarray:
        """The batches held that end at or after ``min_last_offset``, one int64 row
        each: producer id, epoch, base sequence, base offset, last offset delta (the
        module's column constants), by producer id, then in log order."""
        out = np.empty((self.batches_held(), COLUMNS), np.int64)
        return _in_log_order(out[:_export(self._table, int(min_last_offset), out)])

    def open_transactions(self) -> np.ndarray:
        """The transactions open at the end of what was walked, one int64 row each:
        producer id, epoch, first offset (``TRANSACTION_COLUMNS``), by producer id."""
        rows = _export_transactions(self._transactions)
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def aborts(self) -> np.ndarray:
        """The aborted transactions whose markers the walks since this state was made
        met, one int64 row each: producer id, first offset, marker offset, the last
        stable offset after the marker."""
        return _abort_rows(self._aborts)

    def copy(self) -> "ProducerState":
        return ProducerState(self.rows(), self.open_transactions())


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:0{I.FILE_NAME_DIGITS}d}{SNAPSHOT_SUFFIX}")


def snapshot_offsets(directory: str) -> list[int]:
    """The offsets of the snapshots in ``directory``, in order."""
    offsets = []
    for name in os.listdir(directory):
        stem = name[:-len(SNAPSHOT_SUFFIX)]
        if name.endswith(SNAPSHOT_SUFFIX) and stem.isdigit() and len(stem) == I.FILE_NAME_DIGITS:
            offsets.append(int(stem))
    return sorted(offsets)


def write_snapshot(directory: str, offset: int, rows: np.ndarray,
                   transactions: np.ndarray = _NO_TRANSACTIONS) -> None:
    """Write the snapshot at ``offset`` (``rows`` as :meth:`ProducerState.rows`,
    ``transactions`` as :meth:`ProducerState.open_transactions`), replacing it whole,
    without an fsync (see the rules).

    Raises
    ------
    StorageError
        It could not be written (the next open walks further instead).
    """
    path = snapshot_path(directory, offset)
    temporary = path + ".tmp"              # removed by the next open if left behind
    try:
        with os.fdopen(access.open_file(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                       "w") as target:
            target.write(json.dumps({"version": SNAPSHOT_VERSION, "producers": rows.tolist(),
                                     "transactions": transactions.tolist()}))
        os.replace(temporary, path)
    except OSError as error:
        raise StorageError(f"cannot write {path}: {error}") from error


def read_snapshot(directory: str, offset: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows and open transactions of the snapshot at ``offset``; None when it is
    missing or invalid (logged: the caller walks from an earlier one)."""
    path = snapshot_path(directory, offset)
    try:
        with open(path) as source:
            body = json.load(source)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("ignoring unreadable %s (%s)", path, error)
        return None
    readable = isinstance(body, dict) and body.get("version") in SNAPSHOT_VERSIONS_READ
    producers = body.get("producers") if readable else None
    transactions = body.get("transactions", []) if readable else None
    if not _int_rows(producers, COLUMNS) or not _int_rows(transactions, TRANSACTION_COLUMNS):
        log.warning("ignoring %s: not a producer snapshot of version %s", path,
                    " or ".join(map(str, SNAPSHOT_VERSIONS_READ)))
        return None
    return (np.array(producers, np.int64).reshape(-1, COLUMNS),
            np.array(transactions, np.int64).reshape(-1, TRANSACTION_COLUMNS))


def _int_rows(rows, width: int) -> bool:
    """Whether ``rows`` (from JSON) is a list of ``width`` integers each, in the range
    of offsets."""
    return isinstance(rows, list) and all(
        isinstance(row, list) and len(row) == width
        and all(isinstance(value, int) and not isinstance(value, bool)
                and -limits.OFFSET_MAX <= value <= limits.OFFSET_MAX for value in row)
        for row in rows)


def delete_snapshots(directory: str, offsets) -> None:
    """Remove the snapshots at ``offsets`` (those already gone are skipped).

    Raises
    ------
    StorageError
        A file could not be removed.
    """
    for offset in offsets:
        try:
            os.unlink(snapshot_path(directory, offset))
        except FileNotFoundError:
            pass
        except OSError as error:
            raise StorageError(f"cannot remove {snapshot_path(directory, offset)}: "
                               f"{error}") from error



class ProducerStateManager:
    """The producer state of one partition log below its active segment, and its
    snapshots (Kafka's ``ProducerStateManager``).

    The segments it is given are the log's (``log_segment.Segment``), in base-offset
    order, the active one last: it reads their ``base_offset``, ``next_offset``,
    ``log`` and ``size``.

    Parameters
    ----------
    directory : str
        The partition's directory, where the snapshots are.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self._state = ProducerState()

    def load(self, segments: list, log_start_offset: int) -> None:
        """The producer state below the active segment: its snapshot, or the latest
        one below it and a walk of the segments after that (from the log start if
        there is none), written as its snapshot for the next open. Snapshots past
        the active segment (of segments recovery or truncation removed) go."""
        active_base = segments[-1].base_offset
        offsets = snapshot_offsets(self.directory)
        delete_snapshots(self.directory, [offset for offset in offsets if offset > active_base])
        snapshot, start = None, -1
        for offset in reversed([offset for offset in offsets if offset <= active_base]):
            snapshot = read_snapshot(self.directory, offset)
            if snapshot is not None:
                start = offset
                break
        self._state = ProducerState(*(snapshot or ()))
        if start == active_base:
            return
        for segment in segments[:-1]:
            if segment.next_offset > start:
                self._state.remember(segment.log, 0, segment.size, start)
        if len(segments) > 1:               # walked: the next open need not
            self._write_snapshot(active_base, log_start_offset)

    def rolled(self, sealed, base_offset: int, log_start_offset: int) -> None:
        """Kafka's snapshot at each roll: every producer's last batches below the new
        active segment's ``base_offset``, ``sealed`` the segment just sealed."""
        self._state.remember(sealed.log, 0, sealed.size)
        self._write_snapshot(base_offset, log_start_offset)

    def _write_snapshot(self, offset: int, log_start_offset: int) -> None:
        """Write the producer state as the snapshot at ``offset``, forgetting first the
        producers whose last batch lies below the log start (Kafka's eviction), so
        neither the state nor its snapshots grow with every producer ever seen."""
        rows = self._state.rows(log_start_offset)
        transactions = self._state.open_transactions()
        if len(rows) < self._state.batches_held():
            self._state = ProducerState(rows, transactions)
        try:
            write_snapshot(self.directory, offset, rows, transactions)
        except StorageError as error:
            # Only a shortcut: the next open walks from the snapshot before it.
            log.warning("%s: producer snapshot at %d not written (%s)", self.directory, offset,
                        error)

    def aborts_from(self, segments: list, offset: int) -> list[tuple[object, np.ndarray]]:
        """For each closed segment (all of ``segments`` but the last, the active one)
        holding offsets at or past ``offset``: the segment and the aborted
        transactions whose markers it holds, as :meth:`ProducerState.aborts` gives
        them. One walk, from the latest readable snapshot at or below the first such
        segment's base (from the log's first segment when there is none, as
        :meth:`load` walks)."""
        closed = segments[:-1]
        wanted = [segment for segment in closed if segment.next_offset > offset]
        if not wanted:
            return []
        state, start = ProducerState(), -1
        for snapshot_offset in reversed([found for found in snapshot_offsets(self.directory)
                                         if found <= wanted[0].base_offset]):
            snapshot = read_snapshot(self.directory, snapshot_offset)
            if snapshot is not None:
                state, start = ProducerState(*snapshot), snapshot_offset
                break
        found = []
        for segment in closed:
            if segment.next_offset <= start:
                continue
            before = len(state.aborts())
            state.remember(segment.log, 0, segment.size, start)
            if segment.next_offset > offset:
                found.append((segment, state.aborts()[before:]))
        return found

    def batches(self, active, log_start_offset: int) -> np.ndarray:
        """The last batches of each producer in the log (those wholly below
        ``log_start_offset`` forgotten), as :meth:`ProducerState.rows`: the state
        below the ``active`` segment and a walk of it."""
        return self.state(active).rows(log_start_offset)

    def state(self, active) -> ProducerState:
        """The producer state of the whole log: a copy of the state below the
        ``active`` segment after a walk of it (whose aborts it holds)."""
        if not active.size and not len(self._state) and not self._state.open_transactions().size:
            return ProducerState()             # nobody: no copy, no walk (a new partition)
        state = self._state.copy()
        state.remember(active.log, 0, active.size)
        return state

    def clear(self) -> None:
        """The log restarted empty: every snapshot goes, and every producer.

        Raises
        ------
        StorageError
            A snapshot could not be removed.
        """
        delete_snapshots(self.directory, snapshot_offsets(self.directory))
        self._state = ProducerState()
