"""Open transactions: which producer has a transaction open in which hosted partition,
from which offset, and the last stable offset that follows (the ongoing transactions of
Kafka's ``ProducerStateManager``, KIP-98, with KIP-890's verification).

Rules
-----
* One table for every hosted partition: (row, producer id) -> (producer epoch, first
  offset). An entry whose first offset is :data:`NOT_STARTED` is a partition the
  transaction coordinator added to the producer's transaction (AddPartitionsToTxn,
  :meth:`TransactionTable.expect`) that holds no batch of it yet: it admits the
  transaction's first batch there, nothing else does (KIP-890's verification, so a
  zombie's or a late batch cannot open a transaction nobody will end).
* A transactional batch is admitted only under its transaction's entry and epoch
  (:func:`transaction_verdict`): a lower epoch is ``INVALID_PRODUCER_EPOCH``, a higher
  one while its older transaction is open ``INVALID_TXN_STATE``. One with no entry for
  its epoch goes to Python, which asks the coordinator (the appender's verifier,
  KIP-890's implicit AddPartitionsToTxn: the producer's transaction at that epoch is
  under way or begins, and the partition joins it); with no verifier, or refused, it
  is ``INVALID_TXN_STATE``. A batch that is not transactional, of a producer whose
  transaction is open in the partition, is ``INVALID_TXN_STATE``.
* A batch whose producer is held in the partition (``HELD``: a coordinator on
  another broker is verifying its transaction, ``cluster.transaction_verification``)
  goes to Python before its sequence is looked at, so it queues behind the batch
  held first.
* A transaction's first batch in a partition goes to Python
  (:meth:`TransactionTable.begin`), which records its first offset before the append
  publishes the row; the batches after it are the compiled loop's, at the cost of one
  lookup.
* ``ROW_FIRST_UNSTABLE_OFFSET`` is the lowest first offset of the row's open
  transactions (-1: none open); the last stable offset published is that, or the high
  watermark (``drain.last_stable_offset``).
* A marker ends its producer's transaction in the partition
  (:meth:`TransactionTable.end`): the entry goes, the first unstable offset is found
  again. Before the marker is appended the entry is marked ending (its epoch
  ``ENDING``), so no batch joins a decided transaction even while a failed marker
  waits for its retry; an aborted transaction is written into the partition's
  ``.txnindex`` before the entry goes, and the row published after.
* The table follows every append that does not come through the producer's checks: a
  follower's (the leader's batches and markers, :meth:`TransactionTable.observe`) and
  the log's own walk when a partition is opened or truncated.
* Everything runs on the draining thread.

Theory of operation
-------------------
Transactions are rare next to batches: the compiled loop pays for them only when a
batch says it is transactional, or its partition has a transaction open (the row's
first unstable offset is set), and then one lookup in the table. Ending a transaction
looks at every open transaction of the table for the row's new lowest first offset;
there are as many as transactional producers writing at once, and a marker is one per
transaction and partition, never per record.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.typed import Dict

from ...native.jit import kernel, load_i16, load_i64, load_u16
from ...native.typed_containers import get_or
from ...record import batch_layout as B
from ...record.control import NOT_A_MARKER, marker_type
from ...record.records import batch_frame
from ...shm.completion import CompletionCode
from .layout import ROW_FIRST_UNSTABLE_OFFSET

__all__ = ["TransactionTable", "transaction_verdict", "held", "TXN_NONE", "TXN_CONTINUES",
           "TXN_BEGINS", "TXN_VERIFY", "NOT_STARTED", "HELD"]

# A batch's transaction verdict (a negative one is the completion result that refuses it)
TXN_NONE = 0                   # not transactional: nothing to do
TXN_CONTINUES = 1              # its transaction is open in the partition
TXN_BEGINS = 2                 # it opens its transaction in the partition (Python's)
TXN_VERIFY = 3                 # no entry for its epoch: Python asks the coordinator

NOT_STARTED = -1               # an entry's first offset before the transaction's first batch
ENDING = -1                    # an entry's epoch once its end is decided: no batch matches it
NO_ENTRY = (np.int64(-1), np.int64(NOT_STARTED - 1))   # what a lookup finds for no entry
# An entry's first offset while its producer's batches are held for a coordinator
# elsewhere (TransactionTable.hold): every batch of the producer for the partition
# goes to Python, before its sequence is looked at.
HELD = NOT_STARTED - 2
_EPOCH = 0
_FIRST_OFFSET = 1
# columns of what observe gives back: one row per marker walked
ENDED_PRODUCER = 0
ENDED_FIRST_OFFSET = 1         # NOT_STARTED: no batch of the transaction was walked
ENDED_MARKER_OFFSET = 2
ENDED_TYPE = 3                 # a record.control.ControlType
ENDED_COLUMNS = 4

_KEY = types.UniTuple(types.int64, 2)
_ENTRY = types.UniTuple(types.int64, 2)


@kernel
def _transaction_table():
    return Dict.empty(key_type=_KEY, value_type=_ENTRY)


@kernel(inline="always")
def transaction_verdict(transactions, row_settings, row, producer_id, producer_epoch,
                        transactional):
    """What a batch of ``producer_id`` at ``producer_epoch`` bound for ``row`` is to
    its partition's transactions: ``TXN_*``, or the negative completion result that
    refuses it (see the module's rules)."""
    if not transactional:
        if row_settings[row, ROW_FIRST_UNSTABLE_OFFSET] < 0 or producer_id < 0:
            return TXN_NONE
        entry = get_or(transactions, (row, producer_id), NO_ENTRY)
        if entry[_FIRST_OFFSET] >= 0:
            return -CompletionCode.INVALID_TXN_STATE.value
        return TXN_NONE
    if producer_id < 0:
        return -CompletionCode.INVALID_TXN_STATE.value
    entry = get_or(transactions, (row, producer_id), NO_ENTRY)
    if entry[_FIRST_OFFSET] < NOT_STARTED:
        return TXN_VERIFY
    if producer_epoch < entry[_EPOCH]:
        return -CompletionCode.INVALID_PRODUCER_EPOCH.value
    if producer_epoch > entry[_EPOCH]:
        return TXN_VERIFY if entry[_FIRST_OFFSET] == NOT_STARTED \
            else -CompletionCode.INVALID_TXN_STATE.value
    return TXN_BEGINS if entry[_FIRST_OFFSET] == NOT_STARTED else TXN_CONTINUES


@kernel(inline="always")
def held(transactions, row, producer_id):
    """Whether the producer's batches for ``row`` are held (:meth:`TransactionTable.hold`)."""
    return get_or(transactions, (row, producer_id), NO_ENTRY)[_FIRST_OFFSET] == HELD


@kernel
def _held(transactions, row, producer_id):
    return held(transactions, row, producer_id)


@kernel
def _hold(transactions, row, producer_id, producer_epoch):
    transactions[(row, producer_id)] = (producer_epoch, np.int64(HELD))


@kernel
def _release(transactions, row, producer_id):
    if held(transactions, row, producer_id):
        del transactions[(row, producer_id)]


@kernel
def _verdict(transactions, row_settings, row, producer_id, producer_epoch, transactional):
    return transaction_verdict(transactions, row_settings, row, producer_id, producer_epoch,
                               transactional)


@kernel(inline="always")
def _open(transactions, row_settings, row, producer_id, producer_epoch, first_offset):
    transactions[(row, producer_id)] = (producer_epoch, first_offset)
    # The lowest: a rebuild opens the log's transactions in any order.
    if row_settings[row, ROW_FIRST_UNSTABLE_OFFSET] < 0 \
            or first_offset < row_settings[row, ROW_FIRST_UNSTABLE_OFFSET]:
        row_settings[row, ROW_FIRST_UNSTABLE_OFFSET] = first_offset


@kernel
def _begin(transactions, row_settings, row, producer_id, producer_epoch, first_offset):
    _open(transactions, row_settings, row, producer_id, producer_epoch, first_offset)


@kernel(inline="always")
def _close(transactions, row_settings, row, producer_id):
    """Remove the producer's entry for ``row``; its first offset (NOT_STARTED when it had
    none, or no entry), and the row's first unstable offset found again."""
    entry = get_or(transactions, (row, producer_id), NO_ENTRY)
    if entry[_FIRST_OFFSET] < NOT_STARTED:
        return np.int64(NOT_STARTED)
    del transactions[(row, producer_id)]
    if entry[_FIRST_OFFSET] >= 0 \
            and entry[_FIRST_OFFSET] == row_settings[row, ROW_FIRST_UNSTABLE_OFFSET]:
        lowest = np.int64(-1)
        for key, other in transactions.items():
            if key[0] == row and other[_FIRST_OFFSET] >= 0 \
                    and (lowest < 0 or other[_FIRST_OFFSET] < lowest):
                lowest = other[_FIRST_OFFSET]
        row_settings[row, ROW_FIRST_UNSTABLE_OFFSET] = lowest
    return entry[_FIRST_OFFSET]


@kernel
def _end(transactions, row_settings, row, producer_id):
    return _close(transactions, row_settings, row, producer_id)


@kernel
def _expect(transactions, row, producer_id, producer_epoch):
    """Let the partition at ``row`` take the first batch of the producer's
    transaction at ``producer_epoch``: False when a transaction of an older epoch is
    open there (the caller aborts it first)."""
    entry = get_or(transactions, (row, producer_id), NO_ENTRY)
    if entry[_FIRST_OFFSET] >= 0 and entry[_EPOCH] != producer_epoch:
        return False
    if entry[_FIRST_OFFSET] < NOT_STARTED or entry[_EPOCH] != producer_epoch:
        transactions[(row, producer_id)] = (np.int64(producer_epoch), np.int64(NOT_STARTED))
    return True


@kernel
def _ending(transactions, row, producer_id):
    """The coordinator decided the producer's transaction: no batch joins it in the
    partition at ``row`` any more (its epoch becomes ENDING), and an expectation with
    nothing written goes."""
    entry = get_or(transactions, (row, producer_id), NO_ENTRY)
    if entry[_FIRST_OFFSET] >= 0:
        transactions[(row, producer_id)] = (np.int64(ENDING), entry[_FIRST_OFFSET])
    elif entry[_FIRST_OFFSET] == NOT_STARTED:
        del transactions[(row, producer_id)]


@kernel
def _first_offset(transactions, row, producer_id):
    return get_or(transactions, (row, producer_id), NO_ENTRY)[_FIRST_OFFSET]


@kernel
def _forget(transactions, row_settings, row):
    stale = [key for key in transactions.keys() if key[0] == row]
    for key in stale:
        del transactions[key]
    row_settings[row, ROW_FIRST_UNSTABLE_OFFSET] = -1


@kernel
def _observe(transactions, row_settings, row, buffer, end):
    """Follow the (valid, whole) batches in ``buffer[:end]`` appended to ``row``: a
    transactional batch opens its producer's transaction where none is open, a marker
    ends it. One row per marker (``ENDED_*``)."""
    markers = 0
    position = 0
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != 0:
            break
        if load_u16(buffer, position + B.ATTRIBUTES_OFFSET) & B.CONTROL_BIT:
            markers += 1
        position += length
    ended = np.empty((markers, ENDED_COLUMNS), np.int64)
    count = 0
    position = 0
    while position < end:
        status, length = batch_frame(buffer, position, end)
        if status != 0:
            break
        attributes = load_u16(buffer, position + B.ATTRIBUTES_OFFSET)
        producer_id = load_i64(buffer, position + B.PRODUCER_ID_OFFSET)
        if attributes & B.CONTROL_BIT:
            kind = marker_type(buffer, position, position + length)
            if kind != NOT_A_MARKER and count < markers:
                ended[count, ENDED_PRODUCER] = producer_id
                ended[count, ENDED_FIRST_OFFSET] = _close(transactions, row_settings, row,
                                                          producer_id)
                ended[count, ENDED_MARKER_OFFSET] = load_i64(buffer,
                                                             position + B.BASE_OFFSET_OFFSET)
                ended[count, ENDED_TYPE] = kind
                count += 1
        elif attributes & B.TRANSACTIONAL_BIT and producer_id >= 0:
            entry = get_or(transactions, (row, producer_id), NO_ENTRY)
            if entry[_FIRST_OFFSET] < 0:
                _open(transactions, row_settings, row, producer_id,
                      np.int64(load_i16(buffer, position + B.PRODUCER_EPOCH_OFFSET)),
                      load_i64(buffer, position + B.BASE_OFFSET_OFFSET))
        position += length
    return ended[:count]


class TransactionTable:
    """Every hosted partition's open transactions, by the partition's row (see the
    module's rules). ``table`` is what the compiled loop takes."""

    def __init__(self):
        self.table = _transaction_table()

    def verdict(self, settings: np.ndarray, row: int, producer_id: int, producer_epoch: int,
                transactional: bool) -> int:
        """:func:`transaction_verdict` from Python (the slow path's appends)."""
        return int(_verdict(self.table, settings, row, producer_id, producer_epoch,
                            transactional))

    def expect(self, row: int, producer_id: int, producer_epoch: int) -> bool:
        """The coordinator added the partition at ``row`` to the producer's transaction
        at ``producer_epoch``: its first transactional batch there is admitted. False
        when a transaction of another epoch is still open there."""
        return bool(_expect(self.table, row, producer_id, producer_epoch))

    def begin(self, settings: np.ndarray, row: int, producer_id: int, producer_epoch: int,
              first_offset: int) -> None:
        """Open the producer's transaction in the partition at ``row`` from
        ``first_offset`` (before the append that writes it there is published)."""
        _begin(self.table, settings, row, producer_id, producer_epoch, first_offset)

    def ending(self, row: int, producer_id: int) -> None:
        """The producer's transaction is decided (its marker is being written): no
        batch joins it in the partition at ``row`` any more."""
        _ending(self.table, row, producer_id)

    def first_offset(self, row: int, producer_id: int) -> int:
        """Where the producer's open transaction begins in the partition at ``row``
        (negative: none open)."""
        return int(_first_offset(self.table, row, producer_id))

    def end(self, settings: np.ndarray, row: int, producer_id: int) -> int:
        """End the producer's transaction in the partition at ``row``: its first offset,
        or :data:`NOT_STARTED` when it wrote nothing there."""
        return int(_end(self.table, settings, row, producer_id))

    def observe(self, settings: np.ndarray, row: int, batches: np.ndarray) -> np.ndarray:
        """Follow whole, valid batches appended to ``row`` without the producer's
        checks (a follower's, or the log's own walk): the markers among them, one row
        each (``ENDED_*``)."""
        return _observe(self.table, settings, row, batches, batches.size)

    def forget(self, settings: np.ndarray, row: int) -> None:
        """Forget every transaction of the partition at ``row``."""
        _forget(self.table, settings, row)

    def hold(self, row: int, producer_id: int, producer_epoch: int) -> None:
        """The producer's batches for ``row`` are held while a coordinator elsewhere
        verifies its transaction (the verification starts with no entry of its epoch
        open there): the compiled loop hands them all to Python."""
        _hold(self.table, row, producer_id, producer_epoch)

    def held(self, row: int, producer_id: int) -> bool:
        return bool(_held(self.table, row, producer_id))

    def release(self, row: int, producer_id: int) -> None:
        """The verification ended refused: the hold goes (an expectation replaces it
        when the verification admitted the producer: :meth:`expect`)."""
        _release(self.table, row, producer_id)

    def open_transactions_by_row(self) -> dict[int, list[tuple[int, int, int]]]:
        """:meth:`open_transactions` of every row, in one walk of the table."""
        by_row: dict[int, list[tuple[int, int, int]]] = {}
        for (row, producer_id), (epoch, first_offset) in _items(self.table):
            if first_offset != HELD:
                by_row.setdefault(row, []).append((producer_id, epoch, first_offset))
        return {row: sorted(entries) for row, entries in by_row.items()}

    def open_transactions(self, row: int) -> list[tuple[int, int, int]]:
        """(producer id, epoch, first offset) of every transaction open in the
        partition at ``row`` (those added with no batch yet too: first offset
        :data:`NOT_STARTED`), for operators."""
        return sorted((int(key[1]), int(entry[0]), int(entry[1]))
                      for key, entry in _items(self.table) if key[0] == row)


@kernel
def _items_kernel(transactions):
    out = np.empty((len(transactions), 4), np.int64)
    index = 0
    for key, entry in transactions.items():
        out[index, 0], out[index, 1] = key[0], key[1]
        out[index, 2], out[index, 3] = entry[0], entry[1]
        index += 1
    return out


def _items(transactions):
    """The table's entries as ((row, producer id), (epoch, first offset)): walked in
    compiled code (a typed dict's iterator compiles in every process that walks it
    from Python)."""
    return [((int(r[0]), int(r[1])), (int(r[2]), int(r[3]))) for r in _items_kernel(transactions)]
