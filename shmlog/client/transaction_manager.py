"""The transactional producer's state (the transactional half of Kafka's
``TransactionManager``, KIP-98): its transactional id, the transaction under way, the
partitions and groups added to it, and what a failed send or a newer producer of the
id leaves it able to do.

Rules
-----
* The states are Kafka's: uninitialised, ready, in a transaction, committing,
  aborting, an abortable error (a send of the transaction failed: only an abort
  ends it), a fatal error (fenced by a newer producer of the id: only ``close``).
  A call the state does not allow is :class:`IllegalStateError` naming the state.
* A partition joins the transaction when its first batch reaches the broker: the
  partition asks the coordinator (KIP-890's implicit AddPartitionsToTxn), so a
  transaction costs no request per partition. The producer only notes the
  partitions it sent to (:meth:`TransactionManager.ensure_added`, where a batch takes
  its identity), to know whether a transaction has anything to end.
* The coordinator's ProducerFencedError, and a batch refused with
  ``INVALID_PRODUCER_EPOCH``, are fatal: the producer is fenced. Any other refused
  batch makes the transaction abortable; the abort then asks for a new epoch
  (``init_transactions`` again), so the partitions whose sequences the refusal
  broke start again from 0.
* A coordinator's retriable errors (moving, loading, ending the previous
  transaction, a reply not come: ``_RETRIABLE``) are asked again after
  ``limits.COORDINATOR_RETRY_BACKOFF_MS``, until the transaction's timeout.
* Every method but :meth:`ensure_added` and :meth:`failed` runs outside the
  producer's lock (they wait for the broker); those two run under it.
"""

from __future__ import annotations

import enum
import time
from typing import Callable

from ..common import limits
from ..common.errors import (
    ConcurrentTransactionsError,
    CoordinatorError,
    IllegalStateError,
    InvalidProducerEpochError,
    ProducerFencedError,
    ProducerIdsUnavailableError,
    RequestTimedOutError,
    ShmlogError,
    TransactionAbortedError,
)
from ..common.structs import TopicPartition
from ..protocol.control_client import request

__all__ = ["TransactionManager", "TransactionalState"]

# What the coordinator may answer that asking again can cure (Kafka's retriable
# coordinator errors): it is moving, loading or ending the previous transaction, its
# reply did not come, or no producer id could be drawn yet.
_RETRIABLE = (CoordinatorError, ConcurrentTransactionsError, RequestTimedOutError,
              ProducerIdsUnavailableError)


class TransactionalState(enum.Enum):
    UNINITIALIZED = "uninitialised"
    READY = "ready"
    IN_TRANSACTION = "in a transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "in a failed transaction"
    FATAL_ERROR = "fenced"


# The states in which a batch of the transaction may still ship.
_SHIPPING = (TransactionalState.IN_TRANSACTION, TransactionalState.COMMITTING,
             TransactionalState.ABORTING, TransactionalState.ABORTABLE_ERROR)


class TransactionManager:
    """One transactional producer's transactions (see the module's rules).

    Parameters
    ----------
    data_dir : str
        The broker's data directory (its control socket).
    transactional_id : str
    timeout_ms : int
        How long the coordinator lets a transaction stay open before it aborts it.
    adopt : callable
        ``adopt(producer_id, producer_epoch)``: the producer's batches carry these
        from now on, every partition from sequence 0 (``EpochManager.adopt``).
    """

    def __init__(self, data_dir: str, transactional_id: str, timeout_ms: int,
                 adopt: Callable[[int, int], None]):
        self.data_dir = data_dir
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self._adopt = adopt
        self.state = TransactionalState.UNINITIALIZED
        self.producer_id, self.producer_epoch = -1, -1
        self.partitions: set[tuple[str, int]] = set()   # added to the transaction
        self.groups: set[str] = set()                    # whose offsets it commits
        self.error: ShmlogError | None = None           # why it is abortable or fenced
        self._abort_failed = False                      # the abort under way takes an epoch

    # -- the calls ------------------------------------------------------------------
    def init(self) -> None:
        """``init_transactions``: this producer's id and a new epoch, fencing any older
        producer of the id (whose open transaction the coordinator aborts)."""
        self._require(TransactionalState.UNINITIALIZED, TransactionalState.READY)
        self._new_epoch()
        self.state = TransactionalState.READY

    def begin(self) -> None:
        self._require(TransactionalState.READY)
        self.partitions.clear()
        self.groups.clear()
        self.state = TransactionalState.IN_TRANSACTION

    def sendable(self) -> bool:
        """Whether a send belongs to a transaction now."""
        return self.state is TransactionalState.IN_TRANSACTION

    def check_sendable(self) -> None:
        """Refuse a send outside a transaction (or after its failure)."""
        if self.state is not TransactionalState.IN_TRANSACTION:
            self._refuse("send")

    def ensure_added(self, topic: str, partition: int) -> None:
        """Note a partition the transaction sends a batch to (lock held): the broker
        adds it to the transaction itself when the batch arrives."""
        if (topic, partition) not in self.partitions:
            # A batch gathered in the transaction ships while it commits or aborts too.
            if self.state not in _SHIPPING:
                self._refuse("send")
            self.partitions.add((topic, partition))

    def send_offsets(self, offsets, group) -> None:
        """Kafka's ``sendOffsetsToTransaction``: the group's offsets partition joins
        the transaction and ``offsets`` are committed in it."""
        self.check_sendable()
        group_id, member_id, generation = _group_fields(group)
        if group_id not in self.groups:
            self._ask("add_offsets_to_txn", group_id=group_id)
            self.groups.add(group_id)
        self._ask("txn_offset_commit", group_id=group_id, offsets=_offset_entries(offsets),
                  member_id=member_id, generation=generation)

    def failed(self, error: ShmlogError) -> None:
        """A batch of the transaction was refused (lock held): the transaction can
        only abort now, or (an older epoch) the producer is fenced."""
        if isinstance(error, InvalidProducerEpochError):
            self._fence(ProducerFencedError(
                f"transactional id {self.transactional_id!r}: the broker fenced producer "
                f"{self.producer_id} at epoch {self.producer_epoch} ({error})"))
        elif self.state in (TransactionalState.IN_TRANSACTION, TransactionalState.COMMITTING):
            self.error = error
            self.state = TransactionalState.ABORTABLE_ERROR

    def commit_ready(self) -> None:
        """Before the commit's flush: only a transaction under way commits (a failed
        one is told so by :meth:`commit`); from now no send joins it."""
        self._require(TransactionalState.IN_TRANSACTION, TransactionalState.ABORTABLE_ERROR)
        if self.state is TransactionalState.IN_TRANSACTION:
            self.state = TransactionalState.COMMITTING

    def commit_unflushed(self) -> None:
        """The commit's flush ran out of time: the transaction is under way again (a
        commit may be tried again), unless a send of it failed meanwhile."""
        if self.state is TransactionalState.COMMITTING:
            self.state = TransactionalState.IN_TRANSACTION

    def commit(self) -> None:
        """After the flush: end the transaction committed, or raise why it cannot
        (a send failed: :class:`TransactionAbortedError`, abort it)."""
        if self.state is TransactionalState.ABORTABLE_ERROR:
            raise TransactionAbortedError(
                f"transaction of {self.transactional_id!r} cannot commit: a send failed "
                f"({self.error}); abort_transaction() and begin another") from self.error
        self._require(TransactionalState.COMMITTING)
        self._end(committed=True)

    def abort_ready(self) -> None:
        """Before the abort's flush: from now no send joins the transaction."""
        self._require(TransactionalState.IN_TRANSACTION, TransactionalState.ABORTABLE_ERROR)
        self._abort_failed = self.state is TransactionalState.ABORTABLE_ERROR
        self.state = TransactionalState.ABORTING

    def abort_unflushed(self) -> None:
        """The abort's flush failed or ran out of time: batches of the transaction may
        still reach the broker, so the abort takes a new epoch (which fences them)
        rather than ending the transaction while they could start another."""
        self._abort_failed = True

    def abort(self) -> None:
        """After the flush: end the transaction aborted. After a failed send or flush,
        by a new epoch instead (``init_transactions`` again, KIP-360's recovery): the
        coordinator aborts whatever of the transaction reached the broker, batches
        still on their way are fenced, and the partitions' sequences start again."""
        failed = self._abort_failed
        self._require(TransactionalState.ABORTING)
        if failed:
            try:
                self._new_epoch()
            except ShmlogError:
                if self.state is not TransactionalState.FATAL_ERROR:
                    self.state = TransactionalState.ABORTABLE_ERROR     # abort again
                raise
            self.partitions.clear()
            self.groups.clear()
            self.error = None
            self.state = TransactionalState.READY
            return
        self._end(committed=False)

    # -- helpers --------------------------------------------------------------------
    def _end(self, committed: bool) -> None:
        if self.partitions or self.groups:
            try:
                self._ask("end_txn", committed=committed)
            except ShmlogError:
                if self.state is not TransactionalState.FATAL_ERROR:
                    self.state = TransactionalState.IN_TRANSACTION if committed \
                        else TransactionalState.ABORTABLE_ERROR
                raise
        self.partitions.clear()
        self.groups.clear()
        self.error = None
        self.state = TransactionalState.READY

    def _new_epoch(self) -> None:
        reply = self._ask("init_transactions", transaction_timeout_ms=self.timeout_ms,
                          identified=False)
        self.producer_id, self.producer_epoch = reply["producer_id"], reply["producer_epoch"]
        self._adopt(self.producer_id, self.producer_epoch)

    def _ask(self, request_type: str, *, identified: bool = True, **fields) -> dict:
        """A request to the coordinator for this transactional id, asked again after a
        retriable error until the transaction's timeout has passed (the last error
        is then raised); fencing is fatal."""
        if identified:
            fields.update(producer_id=self.producer_id, producer_epoch=self.producer_epoch)
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            try:
                return request(self.data_dir, request_type,
                               transactional_id=self.transactional_id, **fields)
            except ProducerFencedError as error:
                self._fence(error)
                raise
            except _RETRIABLE:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(limits.COORDINATOR_RETRY_BACKOFF_MS / 1000)

    def _fence(self, error: ProducerFencedError) -> None:
        self.error = error
        self.state = TransactionalState.FATAL_ERROR

    def _require(self, *states: TransactionalState) -> None:
        if self.state not in states:
            self._refuse(None)

    def _refuse(self, call: str | None):
        if self.state is TransactionalState.FATAL_ERROR:
            raise ProducerFencedError(str(self.error)) from self.error
        what = f"{call}: " if call else ""
        hint = {TransactionalState.UNINITIALIZED: "call init_transactions() first",
                TransactionalState.READY: "call begin_transaction() first",
                TransactionalState.ABORTABLE_ERROR: "call abort_transaction()"}.get(
            self.state, "wait for it to end")
        raise IllegalStateError(f"{what}the transactional producer {self.transactional_id!r} "
                                f"is {self.state.value}: {hint}")


def _group_fields(group) -> tuple[str, str, int]:
    """(group id, member id, generation) of a group id or a consumer's group metadata
    (``Consumer.group_metadata()``: KIP-447 fences a zombie of an older generation)."""
    if isinstance(group, str):
        return group, "", -1
    try:
        return str(group.group_id), str(group.member_id), int(group.generation_id)
    except AttributeError:
        raise IllegalStateError(f"the group is a group id or a consumer's group_metadata(), "
                                f"got {group!r:.100}") from None


def _offset_entries(offsets) -> list:
    """[[topic, partition, offset, metadata], ...] of ``offsets``: a dict of
    TopicPartition (or (topic, partition)) to an OffsetAndMetadata (shmlog's or
    kafka-python's, with its leader epoch) or an int."""
    entries = []
    for partition, committed in dict(offsets).items():
        topic, number = TopicPartition(*partition)
        if hasattr(committed, "offset"):      # OffsetAndMetadata, or kafka-python's
            offset, metadata = int(committed.offset), committed.metadata or ""
        else:
            offset, metadata = int(committed), ""
        entries.append([topic, number, offset, metadata])
    return entries
