"""The transaction coordinator (Kafka's ``TransactionCoordinator``, KIP-98): each
transactional id's producer id and epoch, its transaction's state and partitions, and
the end of every transaction, committed or aborted, in each partition it wrote to.

Rules
-----
* A transactional id maps to one producer id at a time. :meth:`init_transactions`
  gives it one (a new id the first time), and bumps its epoch every time after: the
  older producer of the id is fenced (``ProducerFencedError`` from the coordinator,
  ``INVALID_PRODUCER_EPOCH`` from a partition). A transaction the older one left
  open is aborted first, its markers written under the new epoch. An epoch that
  cannot grow (``batch_layout.PRODUCER_EPOCH_MAX``) takes a new producer id.
* The states are Kafka's (:class:`TransactionState`): Empty, Ongoing, PrepareCommit and
  PrepareAbort (the decision is stored, markers are being written), CompleteCommit
  and CompleteAbort. Every change is stored (``store``, which raises to refuse)
  before it is answered, so a coordinator that restarts (:meth:`load`) finishes a
  decision it stored and keeps an Ongoing transaction going.
* A partition is added to the transaction (``add_partition``: the partition's host
  then admits the producer's first transactional batch there) before the producer
  writes to it: by AddPartitionsToTxn (a Kafka client's), or when its first batch
  reaches the partition (:meth:`verify_partition`, KIP-890's implicit add, which
  saves shmlog's producer a request per partition and transaction). A request with
  another producer id is ``InvalidProducerIdMappingError``, an older epoch
  ``ProducerFencedError``, one made while the last transaction's markers are not all
  written ``ConcurrentTransactionsError`` (retriable).
* Ending a transaction stores the decision (Prepare*), then writes a marker to every
  partition of it (``write_marker``), then stores Complete*. A marker that cannot be
  written (a full disk, a partition moving) is tried again every
  ``limits.TRANSACTION_MARKER_RETRY_MS`` until it is; meanwhile the id's next
  transaction waits (``ConcurrentTransactionsError``). A decision once stored is
  never changed.
* A transaction open longer than its timeout is aborted by :meth:`tick`, its
  producer fenced (the epoch bumped), as Kafka's coordinator does. An id with no
  transaction under way is forgotten (a tombstone) once idle for ``expiration_ms``
  (Kafka's ``transactional.id.expiration.ms``, 7 days), so ids do not pile up.
* For operators (``stats``): the transactions ended since the start, committed and
  aborted (:attr:`commits`, :attr:`aborts`, :attr:`timed_out`: counted once each,
  when the end is decided), and the ids by state (:meth:`state_counts`).
* No I/O of its own: it is made with the callables that allocate producer ids,
  store a state, add a partition and write a marker (``transaction_service``); time
  is passed in (ms).

Theory of operation
-------------------
Kafka writes a transaction's markers asynchronously after answering EndTxn; here a
coordinator and the partitions it writes markers to are on the same broker (on a
single host, every partition), so the markers are written in the request that ends
the transaction, and a producer that commits hears of it once its records are
visible to read_committed consumers. Only a marker that fails is left to the retry.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from typing import Callable, Iterable

from ..common import limits
from ..common.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    LocalProtocolError,
    ProducerFencedError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..protocol.control import require
from ..record import batch_layout as B
from ..record.control import EndTransactionMarker
from ..shm.completion import CompletionCode

log = logging.getLogger("shmlog.transactions")

__all__ = ["TransactionCoordinator", "TransactionMetadata", "TransactionState",
           "transaction_record", "parse_transaction_record", "parse_transaction_key",
           "transaction_key", "require_transactional_id"]


class TransactionState(enum.Enum):
    """A transactional id's state (Kafka's ``TransactionState``)."""
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


_PREPARING = (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)
_ENDED = (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT,
          TransactionState.COMPLETE_ABORT)


@dataclasses.dataclass
class TransactionMetadata:
    """What the coordinator keeps of a transactional id (Kafka's
    ``TransactionMetadata``)."""
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState = TransactionState.EMPTY
    partitions: set = dataclasses.field(default_factory=set)   # {(topic, partition)}
    start_ms: int = -1                 # when the transaction began (Ongoing), else -1
    last_update_ms: int = -1

    def describe(self, now: int) -> dict:
        """Kafka's DescribeTransactions fields."""
        return {"transactional_id": self.transactional_id, "state": self.state.value,
                "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "timeout_ms": self.timeout_ms, "start_ms": self.start_ms,
                "duration_ms": now - self.start_ms if self.start_ms >= 0 else -1,
                "partitions": [list(entry) for entry in sorted(self.partitions)]}


def transaction_key(transactional_id: str) -> bytes:
    """A transactional id's key in ``__transaction_state``: canonical JSON (compaction
    keeps one record per id; a tombstone under it forgets the id)."""
    return json.dumps(["transaction", transactional_id], separators=(",", ":")).encode()


def transaction_record(metadata: TransactionMetadata) -> tuple[bytes, bytes]:
    """The key and value of a transactional id's state in ``__transaction_state``."""
    key = transaction_key(metadata.transactional_id)
    value = json.dumps({"producer_id": metadata.producer_id,
                        "producer_epoch": metadata.producer_epoch,
                        "timeout_ms": metadata.timeout_ms, "state": metadata.state.value,
                        "partitions": sorted(metadata.partitions),
                        "start_ms": metadata.start_ms,
                        "last_update_ms": metadata.last_update_ms}, separators=(",", ":"))
    return key, value.encode()


def parse_transaction_key(key: bytes | None) -> str | None:
    """The transactional id a ``__transaction_state`` key names, or None."""
    try:
        kind, transactional_id = json.loads(key)
    except (TypeError, ValueError):
        return None
    return transactional_id if kind == "transaction" and isinstance(transactional_id, str) \
        else None


def parse_transaction_record(key: bytes | None,
                             value: bytes | None) -> TransactionMetadata | None:
    """A stored state, or None for a record that is none (logged, skipped)."""
    try:
        kind, transactional_id = json.loads(key)
        if kind != "transaction" or not isinstance(transactional_id, str):
            raise ValueError("not a transaction's key")
        fields = json.loads(value)
        return TransactionMetadata(
            transactional_id, int(fields["producer_id"]), int(fields["producer_epoch"]),
            int(fields["timeout_ms"]), TransactionState(fields["state"]),
            {(str(topic), int(partition)) for topic, partition in fields["partitions"]},
            int(fields["start_ms"]), int(fields["last_update_ms"]))
    except (TypeError, ValueError, KeyError) as error:
        log.warning("skipping an unreadable __transaction_state record (%s): %r", error,
                    key)
        return None


class TransactionCoordinator:
    """Every transactional id this broker coordinates (see the module's rules).

    Parameters
    ----------
    allocate_producer_id : callable
        A producer id never handed out before.
    store : callable
        ``store(metadata)``: the state stored durably, or an exception raised.
    add_partition : callable
        ``add_partition(topic, partition, producer_id, epoch)``: the partition admits
        the producer's transactional batches from now on, or raises (no such
        partition, or a transaction of another epoch still open there).
    write_marker : callable
        ``write_marker(topic, partition, marker)``: the marker is in the partition,
        or an exception raised (one broker's; a cluster's give ``send_markers``).
    max_timeout_ms : int
        The longest timeout a transaction may ask for.
    coordinator_epoch : int
        Written into every marker (a cluster's coordinators move; one broker's is 0).
    forget : callable
        ``forget(transactional_id)``: the id's state removed durably (a tombstone), or
        an exception raised.
    expiration_ms : int
        How long an id with no transaction under way is kept after its last change
        (Kafka's ``transactional.id.expiration.ms``).
    send_markers : callable, optional
        ``send_markers(transactional_id, marker, [(topic, partition), ...], round)``:
        the markers are sent (a cluster's partitions have leaders elsewhere), and
        their outcome comes back later through :meth:`markers_written` with the same
        ``round``. Given, it is used instead of ``write_marker``.
    """

    def __init__(self, *, allocate_producer_id: Callable[[], int],
                 store: Callable[[TransactionMetadata], None],
                 add_partition: Callable[[str, int, int, int], None],
                 max_timeout_ms: int,
                 write_marker: Callable[[str, int, EndTransactionMarker], None] | None = None,
                 coordinator_epoch: int = 0,
                 forget: Callable[[str], None] = lambda transactional_id: None,
                 expiration_ms: int = limits.TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
                 send_markers: Callable[[str, EndTransactionMarker, list, int], None]
                 | None = None):
        self._allocate = allocate_producer_id
        self._send_markers = send_markers
        self._sending: dict[str, int] = {}       # id -> the round of its markers out
        self._rounds = 0
        self._store = store
        self._forget = forget
        self.expiration_ms = expiration_ms
        self._deadline: int | None = None      # next_deadline's, until a state changes
        self._deadline_known = False
        self._add_partition = add_partition
        self._write_marker = write_marker
        self.max_timeout_ms = max_timeout_ms
        self.coordinator_epoch = coordinator_epoch
        self.transactions: dict[str, TransactionMetadata] = {}
        self._by_producer: dict[int, str] = {}   # producer id -> its transactional id
        self._unwritten: dict[str, set] = {}     # id -> partitions whose marker failed
        self._retry_at = -1
        self.commits = 0                 # transactions ended since the start, committed,
        self.aborts = 0                  # aborted (by its producer, a fence or a timeout),
        self.timed_out = 0               # of them aborted at their timeout

    # -- loading ---------------------------------------------------------------------
    def load(self, records: Iterable[tuple[bytes | None, bytes | None]], now: int) -> None:
        """Replay ``__transaction_state`` (or, in a cluster, one partition of it),
        oldest first; then finish what the states loaded say: a stored decision's
        markers are written (again: a partition that has its marker already ends
        nothing), and an Ongoing transaction's partitions admit its producer's
        batches again."""
        loaded = set()
        for key, value in records:
            if value is None:                      # an expired id's tombstone
                transactional_id = parse_transaction_key(key)
                if transactional_id in self.transactions:
                    self._drop(transactional_id)
                loaded.discard(transactional_id)
                continue
            metadata = parse_transaction_record(key, value)
            if metadata is not None:
                self._keep(metadata)
                loaded.add(metadata.transactional_id)
        for metadata in [self.transactions[name] for name in sorted(loaded)]:
            if metadata.state in _PREPARING:
                self._unwritten[metadata.transactional_id] = set(metadata.partitions)
                self._write_markers(metadata, now)
            elif metadata.state is TransactionState.ONGOING:
                for topic, partition in sorted(metadata.partitions):
                    try:
                        self._add_partition(topic, partition, metadata.producer_id,
                                            metadata.producer_epoch)
                    except ShmlogError as error:
                        log.warning("transaction %r: %s-%d not added again: %s",
                                    metadata.transactional_id, topic, partition, error)

    def unload(self, belongs: Callable[[str], bool]) -> list[str]:
        """Forget the transactional ids ``belongs`` says (a cluster's coordinator no
        longer leads their partition of ``__transaction_state``; the new one loads
        them); returns them. Markers still out for them are no longer awaited."""
        gone = [name for name in self.transactions if belongs(name)]
        for name in gone:
            self._drop(name)
            self._unwritten.pop(name, None)
            self._sending.pop(name, None)
        return gone

    # -- requests --------------------------------------------------------------------
    def init_transactions(self, transactional_id, transaction_timeout_ms, producer_id=-1,
                          producer_epoch=-1, *, now) -> dict:
        """Kafka's InitProducerId with a transactional id: the producer id and the new
        epoch, which fences every older producer of the id; a transaction the older
        one left open is aborted under the new epoch first. A ``producer_id`` and
        ``producer_epoch`` given (KIP-360: a client recovering the pair it holds) must
        be the id's current ones, else the client is fenced."""
        transactional_id = require_transactional_id(transactional_id)
        timeout_ms = require(transaction_timeout_ms, int, "transaction_timeout_ms")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout {timeout_ms} ms is outside (0, {self.max_timeout_ms}] "
                f"(the broker's transaction_max_timeout_ms)")
        metadata = self.transactions.get(transactional_id)
        held = (require(producer_id, int, "producer_id"),
                require(producer_epoch, int, "producer_epoch"))
        if held[0] != -1 and (metadata is None or
                              (metadata.producer_id, metadata.producer_epoch) != held):
            raise ProducerFencedError(f"producer {held[0]} at epoch {held[1]} no longer holds "
                                      f"transactional id {transactional_id!r}")
        if metadata is None:
            metadata = TransactionMetadata(transactional_id, self._allocate(), 0, timeout_ms,
                                           last_update_ms=now)
            self._change(metadata, now)
            return self._identity(metadata)
        self._check_settled(metadata)
        if metadata.state is TransactionState.ONGOING:
            self._end(self._fencing(metadata), committed=False, now=now)
            metadata = self.transactions[transactional_id]
            self._check_settled(metadata)          # a marker not written yet: retry
            # Fenced by the abort's epoch already, unless that was the last one.
            ready = dataclasses.replace(metadata) \
                if metadata.producer_epoch < B.PRODUCER_EPOCH_MAX else self._bumped(metadata)
        else:
            ready = self._bumped(metadata)
        ready.state, ready.partitions, ready.start_ms = TransactionState.EMPTY, set(), -1
        ready.timeout_ms = timeout_ms
        self._change(ready, now)
        return self._identity(ready)

    def add_partitions_to_txn(self, transactional_id, producer_id, producer_epoch, partitions,
                              *, now) -> dict:
        """Kafka's AddPartitionsToTxn: ``partitions`` ([[topic, partition], ...]) join
        the transaction, which begins with the first of them."""
        metadata = self.producer_of(transactional_id, producer_id, producer_epoch)
        wanted = {(require(topic, str, "topic"), require(partition, int, "partition"))
                  for topic, partition in require(partitions, list, "partitions")}
        self._check_settled(metadata)
        new = wanted - metadata.partitions if metadata.state is TransactionState.ONGOING \
            else wanted
        # Every partition asked, added before or not: a retry after a failed add (a
        # cluster's leader did not answer) tells them again.
        for topic, partition in sorted(wanted):
            self._add_partition(topic, partition, metadata.producer_id, metadata.producer_epoch)
        if not new and metadata.state is TransactionState.ONGOING:
            return {}
        changed = dataclasses.replace(metadata, partitions=set(metadata.partitions))
        if changed.state is not TransactionState.ONGOING:
            changed.state, changed.partitions, changed.start_ms = \
                TransactionState.ONGOING, set(), now
        changed.partitions |= new
        self._change(changed, now)
        return {}

    def verify_partition(self, topic: str, partition: int, producer_id: int,
                         producer_epoch: int, *, now: int) -> CompletionCode | None:
        """A partition's first transactional batch of the producer at
        ``producer_epoch`` came with no AddPartitionsToTxn before it (KIP-890's
        implicit add, which shmlog's producer relies on): None when the producer's
        transactional id is at that epoch, its transaction under way or beginning
        now, and the partition added to it (stored, as add_partitions_to_txn); else
        why the batch is refused (an older epoch: ``INVALID_PRODUCER_EPOCH``, the
        producer is fenced; anything else ``INVALID_TXN_STATE``)."""
        transactional_id = self._by_producer.get(producer_id)
        metadata = self.transactions.get(transactional_id) if transactional_id else None
        if metadata is None or metadata.producer_epoch < producer_epoch \
                or metadata.state in _PREPARING:
            return CompletionCode.INVALID_TXN_STATE
        if metadata.producer_epoch > producer_epoch:
            return CompletionCode.INVALID_PRODUCER_EPOCH
        try:
            self.add_partitions_to_txn(transactional_id, producer_id, producer_epoch,
                                       [[topic, partition]], now=now)
        except ShmlogError as error:
            log.warning("transaction %r: %s-%d not added for producer %d: %s",
                        transactional_id, topic, partition, producer_id, error)
            return CompletionCode.INVALID_TXN_STATE
        return None

    def end_txn(self, transactional_id, producer_id, producer_epoch, committed, *, now) -> dict:
        """Kafka's EndTxn: commit or abort the transaction; the answer comes once its
        markers are written (or their retry is under way, the decision stored). A
        retry of an end already made is answered the same way."""
        metadata = self.producer_of(transactional_id, producer_id, producer_epoch)
        committed = require(committed, bool, "committed")
        done = TransactionState.COMPLETE_COMMIT if committed else TransactionState.COMPLETE_ABORT
        preparing = TransactionState.PREPARE_COMMIT if committed \
            else TransactionState.PREPARE_ABORT
        if metadata.state in (done, preparing):
            return {}                                  # a retry of this very end
        if metadata.state is not TransactionState.ONGOING:
            raise InvalidTxnStateError(
                f"transaction {transactional_id!r} cannot {'commit' if committed else 'abort'} "
                f"in state {metadata.state.value}: begin it by adding a partition first")
        self._end(dataclasses.replace(metadata), committed=committed, now=now)
        return {}

    # -- operators --------------------------------------------------------------------
    def describe_transactions(self, transactional_ids, *, now) -> dict:
        """Kafka's DescribeTransactions, per id (unknown ones left out)."""
        return {"transactions": [self.transactions[name].describe(now)
                                 for name in require(transactional_ids, list,
                                                     "transactional_ids")
                                 if name in self.transactions]}

    def list_transactions(self, states=None, *, now) -> dict:
        """Kafka's ListTransactions: every id, or those in ``states`` (their names)."""
        wanted = None if states is None else set(require(states, list, "states"))
        return {"transactions": [
            {"transactional_id": name, "producer_id": metadata.producer_id,
             "state": metadata.state.value}
            for name, metadata in sorted(self.transactions.items())
            if wanted is None or metadata.state.value in wanted]}

    def state_counts(self) -> dict[str, int]:
        """{state name: how many transactional ids are in it}, every state named."""
        counts = dict.fromkeys((state.value for state in TransactionState), 0)
        for metadata in self.transactions.values():
            counts[metadata.state.value] += 1
        return counts

    # -- time --------------------------------------------------------------------------
    def next_deadline(self) -> int | None:
        """When a transaction times out, a marker is retried or an id expires next
        (ms), or None. Found again only after a change: the broker's loop asks every
        turn, and a walk of every id each time would grow with them."""
        if not self._deadline_known:
            deadlines = [self._deadline_of(metadata) for metadata in self.transactions.values()]
            if self._unwritten.keys() - self._sending.keys():     # some wait for their retry
                deadlines.append(self._retry_at)
            self._deadline = min(deadlines, default=None)
            self._deadline_known = True
        return self._deadline

    def _deadline_of(self, metadata: TransactionMetadata) -> int:
        if metadata.state is TransactionState.ONGOING:
            return metadata.start_ms + metadata.timeout_ms
        return metadata.last_update_ms + self.expiration_ms

    def tick(self, now: int) -> None:
        """Abort (fencing their producers) the transactions open past their timeout,
        write again the markers that failed, and forget the ids idle past their
        expiration."""
        self._deadline_known = False
        for metadata in list(self.transactions.values()):
            if metadata.state in _ENDED and now >= metadata.last_update_ms + self.expiration_ms \
                    and metadata.transactional_id not in self._unwritten:
                self._expire(metadata)
                continue
            if metadata.state is TransactionState.ONGOING \
                    and now >= metadata.start_ms + metadata.timeout_ms:
                log.info("transaction %r of producer %d timed out after %d ms: aborted",
                         metadata.transactional_id, metadata.producer_id, metadata.timeout_ms)
                try:
                    self._end(self._fencing(metadata), committed=False, now=now)
                    self.timed_out += 1
                except ShmlogError as error:       # the store failed: try at the next tick
                    log.warning("transaction %r not aborted yet: %s",
                                metadata.transactional_id, error)
        if self._unwritten and now >= self._retry_at:
            for transactional_id in list(self._unwritten):
                if transactional_id not in self._sending:
                    self._write_markers(self.transactions[transactional_id], now)

    # -- the state changes -------------------------------------------------------------
    def _end(self, metadata: TransactionMetadata, *, committed: bool, now: int) -> None:
        """Store the decision, write the markers, store the completion (or leave the
        markers that failed to the retry)."""
        metadata.state = TransactionState.PREPARE_COMMIT if committed \
            else TransactionState.PREPARE_ABORT
        self._change(metadata, now)
        if committed:
            self.commits += 1
        else:
            self.aborts += 1
        self._unwritten[metadata.transactional_id] = set(metadata.partitions)
        self._write_markers(metadata, now)

    def _write_markers(self, metadata: TransactionMetadata, now: int) -> None:
        committed = metadata.state is TransactionState.PREPARE_COMMIT
        marker = EndTransactionMarker(metadata.producer_id, metadata.producer_epoch, committed,
                                      self.coordinator_epoch)
        unwritten = self._unwritten[metadata.transactional_id]
        if self._send_markers is not None:
            self._rounds += 1
            self._sending[metadata.transactional_id] = self._rounds
            self._deadline_known = False
            self._send_markers(metadata.transactional_id, marker, sorted(unwritten),
                               self._rounds)
            return
        failed = {}
        for topic, partition in sorted(unwritten):
            try:
                self._write_marker(topic, partition, marker)
            except ShmlogError as error:
                failed[(topic, partition)] = error
        self._written(metadata, unwritten - failed.keys(), failed, now)

    def markers_written(self, transactional_id: str, round_: int,
                        written: Iterable[tuple[str, int]], failed: dict, now: int) -> None:
        """The outcome of the markers ``send_markers`` sent for the id in ``round_``:
        the partitions that have theirs, and {partition: error} for those that do
        not (written again after ``limits.TRANSACTION_MARKER_RETRY_MS``). Ignored
        for an id no longer coordinated here, and for an earlier round's (a reply
        come after the id was unloaded and loaded again)."""
        if self._sending.get(transactional_id) != round_:
            return
        del self._sending[transactional_id]
        self._deadline_known = False
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.state not in _PREPARING \
                or transactional_id not in self._unwritten:
            return
        self._written(metadata, set(written), failed, now)

    def markers_unwritten(self, transactional_id: str) -> bool:
        """Whether the id's transaction is decided and some partition still lacks its
        marker (out now, or waiting for the retry)."""
        return transactional_id in self._unwritten

    def _written(self, metadata: TransactionMetadata, written: set, failed: dict,
                 now: int) -> None:
        """Take the outcome of one attempt at the transaction's markers; once every
        partition has its marker, store the completion."""
        committed = metadata.state is TransactionState.PREPARE_COMMIT
        unwritten = self._unwritten[metadata.transactional_id]
        unwritten -= written
        for (topic, partition), error in sorted(failed.items()):
            if isinstance(error, UnknownTopicOrPartitionError):
                log.info("transaction %r: %s-%d is gone (deleted): no marker to write",
                         metadata.transactional_id, topic, partition)
                unwritten.discard((topic, partition))
                continue
            log.warning("transaction %r: the %s marker for %s-%d is not written (%s); "
                        "tried again in %d ms", metadata.transactional_id,
                        "COMMIT" if committed else "ABORT", topic, partition, error,
                        limits.TRANSACTION_MARKER_RETRY_MS)
            self._retry_at = now + limits.TRANSACTION_MARKER_RETRY_MS
            self._deadline_known = False
        if unwritten:
            return
        del self._unwritten[metadata.transactional_id]
        done = dataclasses.replace(
            metadata, state=TransactionState.COMPLETE_COMMIT if committed
            else TransactionState.COMPLETE_ABORT, partitions=set(), start_ms=-1)
        try:
            self._change(done, now)
        except ShmlogError as error:
            # The markers are written: a restart that finds the decision writes them
            # again, which ends nothing more.
            log.warning("transaction %r: its completion is not stored (%s)",
                        metadata.transactional_id, error)
            self._keep(done)

    def _change(self, metadata: TransactionMetadata, now: int) -> None:
        """Store ``metadata`` (its id's new state), then keep it."""
        metadata.last_update_ms = now
        self._store(metadata)
        self._keep(metadata)

    def _expire(self, metadata: TransactionMetadata) -> None:
        """Forget an id idle past its expiration (a tombstone stored first): its next
        init_transactions gets a new producer id (Kafka's expiration)."""
        try:
            self._forget(metadata.transactional_id)
        except ShmlogError as error:              # tried again at the next tick
            log.warning("transactional id %r not expired yet: %s",
                        metadata.transactional_id, error)
            return
        log.info("transactional id %r expired after %d ms without a transaction",
                 metadata.transactional_id, self.expiration_ms)
        self._drop(metadata.transactional_id)

    def _drop(self, transactional_id: str) -> None:
        metadata = self.transactions.pop(transactional_id)
        if self._by_producer.get(metadata.producer_id) == transactional_id:
            del self._by_producer[metadata.producer_id]
        self._deadline_known = False

    def _keep(self, metadata: TransactionMetadata) -> None:
        self._deadline_known = False
        previous = self.transactions.get(metadata.transactional_id)
        if previous is not None and previous.producer_id != metadata.producer_id:
            self._by_producer.pop(previous.producer_id, None)
        self.transactions[metadata.transactional_id] = metadata
        self._by_producer[metadata.producer_id] = metadata.transactional_id

    def _fencing(self, metadata: TransactionMetadata) -> TransactionMetadata:
        """``metadata`` at the epoch its fencing abort is written under: one higher, on
        the same producer id (the partitions' open transactions are that id's), the
        last epoch if it cannot grow."""
        return dataclasses.replace(
            metadata, producer_epoch=min(metadata.producer_epoch + 1, B.PRODUCER_EPOCH_MAX),
            partitions=set(metadata.partitions))

    def _bumped(self, metadata: TransactionMetadata) -> TransactionMetadata:
        """``metadata`` with its epoch one higher, or a new producer id at epoch 0 once
        the epoch cannot grow."""
        if metadata.producer_epoch >= B.PRODUCER_EPOCH_MAX:
            return dataclasses.replace(metadata, producer_id=self._allocate(),
                                       producer_epoch=0, partitions=set(metadata.partitions))
        return dataclasses.replace(metadata, producer_epoch=metadata.producer_epoch + 1,
                                   partitions=set(metadata.partitions))

    # -- checks ------------------------------------------------------------------------
    def producer_of(self, transactional_id, producer_id, producer_epoch) -> TransactionMetadata:
        """The id's state, checked to be the producer's: its id, and its epoch."""
        transactional_id = require_transactional_id(transactional_id)
        producer_id = require(producer_id, int, "producer_id")
        producer_epoch = require(producer_epoch, int, "producer_epoch")
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {transactional_id!r} is not mapped to producer id "
                f"{producer_id}: call init_transactions first")
        if producer_epoch != metadata.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} of transactional id {transactional_id!r} is at "
                f"epoch {producer_epoch}, fenced by epoch {metadata.producer_epoch} (another "
                f"producer initialised the id, or its transaction timed out): close it")
        return metadata

    def _check_settled(self, metadata: TransactionMetadata) -> None:
        if metadata.state in _PREPARING:
            ending = "committing" if metadata.state is TransactionState.PREPARE_COMMIT \
                else "aborting"
            raise ConcurrentTransactionsError(
                f"transaction {metadata.transactional_id!r} is still {ending} (its markers "
                f"are being written): retry")

    @staticmethod
    def _identity(metadata: TransactionMetadata) -> dict:
        return {"producer_id": metadata.producer_id, "producer_epoch": metadata.producer_epoch}


def require_transactional_id(value) -> str:
    """``value`` if it is a transactional id (a non-empty string, at most
    ``limits.TRANSACTIONAL_ID_LENGTH_MAX`` long), else ``LocalProtocolError``."""
    if not isinstance(value, str) or not value:
        raise LocalProtocolError(f"a transactional id is a non-empty string, got {value!r}")
    if len(value) > limits.TRANSACTIONAL_ID_LENGTH_MAX:
        raise LocalProtocolError(f"a transactional id is at most "
                                 f"{limits.TRANSACTIONAL_ID_LENGTH_MAX} characters, got "
                                 f"{len(value)}")
    return value
