"""The verification of a transaction's first batch in a partition this broker leads
(KIP-890's implicit AddPartitionsToTxn, across hosts): the batch is held while the
transactional id's coordinator, perhaps on another broker, adds the partition to the
transaction.

Rules
-----
* The appender hands over a transactional batch whose producer it does not expect in
  the partition at that epoch (``Appender.set_transaction_verifier``): the batch, and
  every later one of the producer for the partition, is held, in order, as a
  :class:`~shmlog.cluster.replication.forwarding.HeldBatch`: a ring's entry with its
  completion parked, a forwarded PRODUCE with its answer.
* ``verify_partition`` goes to the coordinator, found by the producer's transactional
  id (``TransactionalIds``: learned from the ``init_transactions`` replies this broker
  passes on and carried by forwarded batches). A producer whose id is not known is
  refused ``INVALID_TXN_STATE``.
* The coordinator's answer decides: the partition is in the transaction (added and
  replicated): the producer is admitted at that epoch and the held batches appended,
  in order, as they would have been; refused: every held batch gets the code
  (``INVALID_PRODUCER_EPOCH`` for a fenced producer, else ``INVALID_TXN_STATE``).
* A refusal refuses the held batches of the verification's epoch and older; a later
  epoch's (the producer started again meanwhile) are verified anew.
* A partition that is no longer the one verified, or no longer led here (deleted,
  its leadership lost), refuses its held batches with ``NOT_LEADER_OR_FOLLOWER``:
  their producers send them to its leader again.
* A retriable answer (the coordinator moving, loading, ending the previous
  transaction; no answer) asks again after ``limits.TRANSACTION_VERIFY_RETRY_MS``.
  After ``forward_delivery_timeout_ms`` (a forwarded batch's bound) the held batches
  are refused with ``REQUEST_TIMED_OUT`` (not appended), logged at WARNING.

Theory of operation
-------------------
Everything runs on the broker's loop thread. The appender's verifier only notes the
verification (it runs inside a drain); :meth:`TransactionVerifier.poll`, at the end
of the loop turn, sends it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from ..broker.appender import ForwardedEntry
from ..broker.partition_host import PartitionHost
from ..common import limits
from ..common.errors import (
    ConcurrentTransactionsError,
    CoordinatorError,
    ProducerFencedError,
    RequestTimedOutError,
    ShmlogError,
)
from ..common.throttled_log import ThrottledWarnings
from ..config.cluster import ClusterConfig
from ..record.records import now_ms
from ..shm.completion import CompletionCode
from .replication.forwarding import Forwarding, HeldBatch, transactional_producer

log = logging.getLogger("shmlog.transactions")

__all__ = ["TransactionVerifier", "RETRIABLE"]

# What asking again can cure: the coordinator moving, loading or ending the previous
# transaction, or a reply that did not come.
RETRIABLE = (CoordinatorError, ConcurrentTransactionsError, RequestTimedOutError)

# ask(broker id, request name, fields, answered(reply dict | error)).
Ask = Callable[[int, str, dict, Callable[[dict | ShmlogError], None]], None]


@dataclasses.dataclass
class _Verification:
    """A producer's batches held for a partition this broker leads while the
    coordinator verifies the partition is in its transaction."""
    transactional_id: str
    topic: str
    partition: int
    row: int
    producer_id: int
    producer_epoch: int
    deadline: int
    hosted: object                          # the partition's HostedPartition when it began
    held: list = dataclasses.field(default_factory=list)
    asked: bool = False                     # a verify_partition is out
    retry_at: int = 0


class TransactionVerifier:
    """Held batches and their verifications on one broker (see the module's rules).

    Parameters
    ----------
    host : PartitionHost
        Its appender's verifier becomes this object's.
    forwarding : Forwarding
        Appends and answers held batches; its transactional ids name the coordinators.
    config : ClusterConfig
        ``forward_delivery_timeout_ms``.
    ask : callable
        Sends a transaction request to a broker (``ClusterTransactionService``).
    coordinator_of : callable
        ``coordinator_of(transactional_id)``: the coordinator's broker id, or raises
        (none now).
    """

    def __init__(self, host: PartitionHost, forwarding: Forwarding, config: ClusterConfig,
                 ask: Ask, coordinator_of: Callable[[str], int]):
        self.host = host
        self.appender = host.appender
        self.forwarding = forwarding
        self.config = config
        self.ask = ask
        self.coordinator_of = coordinator_of
        self.verifications: dict[tuple[int, int], _Verification] = {}
        self.refusals = ThrottledWarnings(log, limits.TRANSACTION_REFUSAL_WARNING_INTERVAL_S)
        self.appender.set_transaction_verifier(self.verify, self.hold_entry)
        forwarding.hold = self.hold

    def next_deadline(self) -> int | None:
        return min((verification.retry_at for verification in self.verifications.values()
                    if not verification.asked), default=None)

    def verify(self, topic: str, partition: int, producer_id: int,
               producer_epoch: int) -> CompletionCode | None:
        """The appender's verifier: hold the batch and ask the coordinator."""
        transactional_id = self.forwarding.transactional_ids.get(producer_id)
        if not transactional_id:
            self.refusals.warn(
                "%s-%d: producer %d's transactional batch is refused (INVALID_TXN_STATE): this "
                "broker knows no transactional id for it, so no coordinator can verify it",
                topic, partition, producer_id)
            return CompletionCode.INVALID_TXN_STATE
        hosted = self.host.partition(topic, partition)
        key = (hosted.row, producer_id)
        if key in self.verifications:           # one of a partition gone from this row
            self._verified(key, CompletionCode.NOT_LEADER_OR_FOLLOWER)
        # Bounded as a forwarded batch's delivery is (forward.delivery.timeout.ms).
        self.verifications[key] = _Verification(
            transactional_id, topic, partition, hosted.row, producer_id, producer_epoch,
            now_ms() + self.config.forward_delivery_timeout_ms, hosted)
        return CompletionCode.TRANSACTION_VERIFYING

    def _still_led(self, verification: _Verification) -> bool:
        """Whether the partition verified is still the one at its row, led here (a
        leadership lost or a topic deleted meanwhile: its batches go elsewhere)."""
        return self._same_partition(verification) \
            and self.appender.is_leader(verification.row)

    def _same_partition(self, verification: _Verification) -> bool:
        try:
            hosted = self.host.partition(verification.topic, verification.partition)
        except ShmlogError:
            return False
        return hosted is verification.hosted

    def hold_entry(self, entry: ForwardedEntry) -> None:
        """A ring's entry the appender held (its completion parked)."""
        held = self.forwarding.held(entry)
        if held is not None:
            self.hold(held)

    def hold(self, held: HeldBatch) -> None:
        """A batch held behind its verification (appended at once if that ended)."""
        producer = transactional_producer(held.batch)
        verification = self.verifications.get((held.replica.row, producer[0])) \
            if producer is not None else None
        if verification is None:                  # its verification ended meanwhile
            self.forwarding.append_held(held)
            return
        verification.held.append(held)

    def poll(self, now: int) -> None:
        """Send the verifications due; refuse the batches of those out of time."""
        for key, verification in list(self.verifications.items()):
            if not self._still_led(verification):
                self._verified(key, CompletionCode.NOT_LEADER_OR_FOLLOWER)
                continue
            if verification.asked:
                continue
            if now >= verification.deadline:
                log.warning("%s-%d: producer %d's transaction was not verified by its "
                            "coordinator in time (transactional id %r): its %d held batches "
                            "are refused (REQUEST_TIMED_OUT)", verification.topic,
                            verification.partition, verification.producer_id,
                            verification.transactional_id, len(verification.held))
                self._verified(key, CompletionCode.REQUEST_TIMED_OUT)
                continue
            if now < verification.retry_at:
                continue
            try:
                coordinator = self.coordinator_of(verification.transactional_id)
            except ShmlogError:
                verification.retry_at = now + limits.TRANSACTION_VERIFY_RETRY_MS
                continue
            verification.asked = True
            self.ask(coordinator, "verify_partition", {
                "transactional_id": verification.transactional_id,
                "topic": verification.topic, "partition": verification.partition,
                "producer_id": verification.producer_id,
                "producer_epoch": verification.producer_epoch},
                lambda result, key=key, verification=verification:
                self._answered(key, verification, result))

    def _answered(self, key: tuple[int, int], verification: _Verification,
                         result: dict | ShmlogError) -> None:
        if self.verifications.get(key) is not verification:
            return
        verification.asked = False
        now = now_ms()
        if isinstance(result, ProducerFencedError):
            self._verified(key, CompletionCode.INVALID_PRODUCER_EPOCH)
        elif isinstance(result, RETRIABLE):
            verification.retry_at = now + limits.TRANSACTION_VERIFY_RETRY_MS
        elif isinstance(result, ShmlogError) or result.get("code") is not None:
            code = CompletionCode.INVALID_TXN_STATE if isinstance(result, ShmlogError) \
                else CompletionCode(result["code"])
            if code is not CompletionCode.INVALID_PRODUCER_EPOCH:     # a zombie's: routine
                self.refusals.warn(
                    "%s-%d: producer %d's transaction (transactional id %r, epoch %d) was "
                    "refused by its coordinator (%s): its %d held batches are refused",
                    verification.topic, verification.partition, verification.producer_id,
                    verification.transactional_id, verification.producer_epoch,
                    result if isinstance(result, ShmlogError) else code.name,
                    len(verification.held))
            self._verified(key, code)
        else:
            self._verified(key, None)

    def _verified(self, key: tuple[int, int], refusal: CompletionCode | None) -> None:
        """End a verification: append its held batches in order, or refuse those of its
        epoch and older (a later epoch's batches, held behind it, are verified anew)."""
        verification = self.verifications.pop(key)
        same = self._same_partition(verification)
        if not same or not self.appender.is_leader(verification.row):
            refusal = CompletionCode.NOT_LEADER_OR_FOLLOWER      # its leader is elsewhere
        if same:                              # the hold goes, an expectation if admitted
            try:
                admitted = self.appender.transaction_verified(
                    verification.row, verification.producer_id, verification.producer_epoch,
                    refusal is None)
            except ShmlogError:
                admitted = False
            if not admitted and refusal is None:
                refusal = CompletionCode.INVALID_TXN_STATE
        for held in verification.held:
            producer = transactional_producer(held.batch)
            if refusal is None or (producer is not None
                                   and producer[1] > verification.producer_epoch):
                self.forwarding.append_held(held)
            else:
                self.forwarding.refuse_held(held, refusal)
