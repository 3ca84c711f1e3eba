"""The operators' transaction requests (Kafka's kafka-transactions.sh: DescribeProducers,
find-hanging, and the abort of a hanging transaction it makes with WriteTxnMarkers),
and what ``stats`` shows of transactions: the transactions open in each partition
set against what the transaction coordinator holds.

Rules
-----
* A transaction is **open in a partition** from its producer's first transactional
  batch there to its marker (``Appender.open_transactions``, first offset >= 0; one
  added by the coordinator that wrote nothing yet holds no offset back and is left
  out). Its start is the first batch's offset and timestamp (its max timestamp: the
  append time on a LogAppendTime topic), read once from the log and remembered while
  it stays open.
* The coordinator **holds** an open transaction when a transactional id maps to its
  producer id and that id's transaction is Ongoing, or being ended (PrepareCommit,
  PrepareAbort: its markers are being written, or retried), with the partition among
  its partitions. The coordinator then ends it: its producer commits or aborts, or
  its timeout aborts it.
* A transaction is **hanging** (Kafka's find-hanging) when it is open and either the
  coordinator does not hold it (a marker never came: a coordinator that lost its
  state, a partition restored from elsewhere), or it has been open longer than a
  bound: ``find_hanging_transactions``' ``max_transaction_timeout_ms`` (the broker's
  ``transaction_max_timeout_ms`` unless given, as Kafka's default is its broker's
  default), and for ``stats`` (``shmlog status``) the transaction's own timeout at
  the coordinator (the max for one it does not hold). Nothing ends a hanging
  transaction but an operator: it holds the partition's last stable offset back, so
  ``read_committed`` consumers read nothing past its start.
* ``abort_hanging_transaction(topic, partition, start_offset)`` writes an ABORT
  marker, under the producer id and epoch of the transaction open there that starts
  at ``start_offset`` (``OpenTransactionNotFoundError`` when none does), through the
  transaction service (so a marker in ``__consumer_offsets`` drops the commits it
  covers). It refuses a transaction the coordinator holds
  (``TransactionStillOngoingError``): aborting under the coordinator would leave it
  believing in a transaction the partition ended; let it time out, or fence its
  producer (a new producer of its transactional id aborts it).

Theory of operation
-------------------
A service without a clock. Whether a transaction is held is asked of the
coordinator in place (``_holders``); a cluster member's subclass asks every
coordinator first (``cluster.transaction_operations``). Only partitions whose
published last stable offset is below their log end can hold an open transaction
that wrote, so a scan reads two words of every row of the state table at once and
asks the appender only about those.
"""

from __future__ import annotations

import logging

import numpy as np

from ..common.errors import (
    OpenTransactionNotFoundError,
    ShmlogError,
    TransactionStillOngoingError,
)
from ..protocol.control import require
from ..record.batch_header import batch_info
from ..record.control import EndTransactionMarker
from ..record.records import now_ms
from ..shm import state_layout as S
from .service import ImmediateService
from .transaction_coordinator import TransactionMetadata, TransactionState
from .transaction_service import TransactionService

log = logging.getLogger("shmlog.transactions")

__all__ = ["TransactionOperations", "OpenTransaction", "HELD_STATES", "OPERATOR_REQUESTS"]

# The requests this service answers (a cluster member's: cluster.transaction_operations).
OPERATOR_REQUESTS = ("describe_producers", "find_hanging_transactions",
                     "abort_hanging_transaction")

# The coordinator's states in which it still ends the transaction itself.
HELD_STATES = (TransactionState.ONGOING, TransactionState.PREPARE_COMMIT,
               TransactionState.PREPARE_ABORT)
_ROW_WORDS = np.array([S.LAST_STABLE_OFFSET_WORD, S.LOG_END_OFFSET_WORD], np.int64)
_NOT_READ = -1                      # a start time the log could not tell


class OpenTransaction:
    """One transaction open in a partition, and what the coordinator says of it."""

    __slots__ = ("topic", "partition", "producer_id", "producer_epoch", "start_offset",
                 "start_ms", "holder", "known")

    def __init__(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                 start_offset: int, start_ms: int, holder: TransactionMetadata | None,
                 known: bool = True):
        self.topic = topic
        self.partition = partition
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.start_offset = start_offset
        self.start_ms = start_ms
        self.holder = holder              # the coordinator's state of its producer id
        # Whether what the coordinators hold was known when it opened (a cluster's
        # view of them is as of a moment: one opened since is not called unheld).
        self.known = known

    @property
    def held(self) -> bool:
        """Does the coordinator still end this transaction itself?"""
        return self.holder is not None and self.holder.state in HELD_STATES \
            and (self.topic, self.partition) in self.holder.partitions

    def duration_ms(self, now: int) -> int:
        return now - self.start_ms if self.start_ms != _NOT_READ else -1

    def hanging(self, now: int, bound_ms: int) -> bool:
        """Not held by the coordinator (as far as is known), or open longer than
        ``bound_ms``."""
        return (self.known and not self.held) or self.duration_ms(now) > bound_ms

    def as_dict(self, now: int) -> dict:
        holder = self.holder
        return {"topic": self.topic, "partition": self.partition,
                "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "start_offset": self.start_offset, "start_ms": self.start_ms,
                "duration_ms": self.duration_ms(now),
                "transactional_id": None if holder is None else holder.transactional_id,
                "coordinator_state": None if holder is None else holder.state.value,
                "timeout_ms": None if holder is None else holder.timeout_ms,
                "held_by_coordinator": self.held}


class TransactionOperations(ImmediateService):
    """The operators' transaction requests over a broker's transaction service (see
    the module's rules).

    Parameters
    ----------
    transactions : TransactionService
        The broker's coordinator, and the way its markers are written.

    Attributes
    ----------
    hanging_aborted : int
        Transactions an operator aborted since the start.
    """

    def __init__(self, transactions: TransactionService):
        self.transactions = transactions        # its host, coordinator and write_marker
        self.host = transactions.host
        self.coordinator = transactions.coordinator
        self.hanging_aborted = 0
        self._starts: dict[tuple, int] = {}      # (topic id, partition, pid, offset) -> ms

    def handlers(self) -> dict:
        return {name: getattr(self, name) for name in OPERATOR_REQUESTS}

    # -- the requests --------------------------------------------------------------------
    def describe_producers(self, topic, partition) -> dict:
        """Kafka's DescribeProducers, narrowed to the producers with a transaction open
        in the partition: each one's id, epoch, start offset and time, and what the
        coordinator holds of it."""
        now = now_ms()
        found = self.open_in(require(topic, str, "topic"), require(partition, int, "partition"))
        return {"topic": topic, "partition": partition,
                "producers": [entry.as_dict(now) for entry in found]}

    def find_hanging_transactions(self, max_transaction_timeout_ms=None, topic=None,
                                  partition=None) -> dict:
        """Kafka's find-hanging: the open transactions the coordinator does not hold,
        or open longer than ``max_transaction_timeout_ms`` (default: the broker's
        ``transaction_max_timeout_ms``), of every partition, or of ``topic`` (and
        ``partition``)."""
        bound = self.coordinator.max_timeout_ms if max_transaction_timeout_ms is None \
            else require(max_transaction_timeout_ms, int, "max_transaction_timeout_ms")
        if topic is not None:
            require(topic, str, "topic")
        if partition is not None:
            require(partition, int, "partition")
        now = now_ms()
        return {"max_transaction_timeout_ms": bound,
                "transactions": [entry.as_dict(now) for entry in self.open_transactions(
                    topic, partition) if entry.hanging(now, bound)]}

    def abort_hanging_transaction(self, topic, partition, start_offset) -> dict:
        """Kafka's abort of a hanging transaction: an ABORT marker for the producer
        whose open transaction starts at ``start_offset`` in the partition.

        Raises
        ------
        OpenTransactionNotFoundError
            No transaction open there starts at that offset.
        TransactionStillOngoingError
            The coordinator holds that transaction.
        """
        topic = require(topic, str, "topic")
        partition = require(partition, int, "partition")
        start_offset = require(start_offset, int, "start_offset")
        found = [entry for entry in self.open_in(topic, partition)
                 if entry.start_offset == start_offset]
        if not found:
            raise OpenTransactionNotFoundError(
                f"no transaction open in {topic}-{partition} starts at offset {start_offset}: "
                f"'shmlog transactions find-hanging' lists the start offsets of the hanging "
                f"ones")
        entry = found[0]
        if entry.held:
            holder = entry.holder
            ends = "when its producer commits or aborts it, or at its timeout" \
                if holder.state is TransactionState.ONGOING \
                else "once its markers are written (the coordinator retries them)"
            raise TransactionStillOngoingError(
                f"the transaction of producer {entry.producer_id} in {topic}-{partition} "
                f"(start offset {start_offset}) is {holder.state.value} at the coordinator, "
                f"transactional id {holder.transactional_id!r} (timeout "
                f"{holder.timeout_ms} ms): it ends {ends}; let it time out, or fence its "
                f"producer (a new producer of transactional id {holder.transactional_id!r} "
                f"aborts it). Nothing was written")
        marker = EndTransactionMarker(entry.producer_id, entry.producer_epoch, False,
                                      self.coordinator.coordinator_epoch)
        marker_offset = self.transactions.write_marker(topic, partition, marker)
        self.hanging_aborted += 1
        log.warning("an operator aborted the hanging transaction of producer %d (epoch %d) in "
                    "%s-%d that started at offset %d: ABORT marker at offset %d",
                    entry.producer_id, entry.producer_epoch, topic, partition, start_offset,
                    marker_offset)
        return {"topic": topic, "partition": partition, "producer_id": entry.producer_id,
                "producer_epoch": entry.producer_epoch, "start_offset": start_offset,
                "marker_offset": marker_offset}

    # -- what stats shows ----------------------------------------------------------------
    def summary(self) -> tuple[dict, dict[tuple[str, int], int]]:
        """(the broker-wide figures ``stats`` shows, {(topic, partition): transactions
        open there}); hanging by each transaction's own timeout (the max for one the
        coordinator does not hold)."""
        now = now_ms()
        found = self.open_transactions()
        counts: dict[tuple[str, int], int] = {}
        for entry in found:
            counts[(entry.topic, entry.partition)] = \
                counts.get((entry.topic, entry.partition), 0) + 1
        hanging = [entry.as_dict(now) for entry in found if entry.hanging(
            now, entry.holder.timeout_ms if entry.held else self.coordinator.max_timeout_ms)]
        coordinator = self.coordinator
        return ({"states": coordinator.state_counts(), "commits": coordinator.commits,
                 "aborts": coordinator.aborts, "timed_out": coordinator.timed_out,
                 "open": len(found), "hanging": hanging,
                 "hanging_aborted": self.hanging_aborted}, counts)

    # -- the scan --------------------------------------------------------------------------
    def open_transactions(self, topic: str | None = None,
                          partition: int | None = None) -> list[OpenTransaction]:
        """Every transaction open in the hosted partitions (of ``topic``, of
        ``partition``), by topic, partition and start offset."""
        hosted = self.host.partition_list()
        if topic is not None:
            hosted = [entry for entry in hosted if entry.topic == topic
                      and (partition is None or entry.partition == partition)]
        if not hosted:
            return []
        rows = np.fromiter((entry.row for entry in hosted), np.int64, len(hosted))
        words = self.host.table.rows.reshape(-1, S.ROW_WORDS)[rows[:, None], _ROW_WORDS]
        holders = self._holders()
        found: list[OpenTransaction] = []
        seen: set = set()
        unstable = np.flatnonzero(words[:, 0] < words[:, 1]).tolist()
        by_row = self.host.appender.open_transactions_by_row() if unstable else {}
        for index in unstable:
            found += self._open_at(hosted[index], holders, seen,
                                   by_row.get(hosted[index].row, []))
        self._starts = {key: value for key, value in self._starts.items() if key in seen}
        return found

    def open_in(self, topic: str, partition: int) -> list[OpenTransaction]:
        """The transactions open in one partition (looked up whatever its row says).

        Raises
        ------
        UnknownTopicOrPartitionError
        """
        hosted = self.host.partition(topic, partition)
        return self._open_at(hosted, self._holders(), set(),
                             self.host.appender.open_transactions(hosted.row))

    def _holders(self) -> dict[int, TransactionMetadata]:
        """The coordinator's state of each producer id it maps a transactional id to."""
        return {metadata.producer_id: metadata
                for metadata in self.coordinator.transactions.values()}

    def _known(self, hosted, first_offset: int) -> bool:
        """Whether a transaction opened at ``first_offset`` of ``hosted`` with no
        holder is known to be held by none (one broker: its coordinator is always
        known)."""
        return True

    def _open_at(self, hosted, holders: dict, seen: set,
                 entries: list[tuple[int, int, int]]) -> list[OpenTransaction]:
        """The open ones of a partition's transaction entries (producer id, epoch,
        first offset: ``Appender.open_transactions``)."""
        found = []
        for producer_id, epoch, first_offset in entries:
            if first_offset < 0:
                continue
            key = (hosted.log.topic_id, hosted.partition, producer_id, first_offset)
            seen.add(key)
            start_ms = self._starts.get(key)
            if start_ms is None:
                start_ms = self._starts[key] = self._start_ms(hosted.log, first_offset)
            holder = holders.get(producer_id)
            found.append(OpenTransaction(hosted.topic, hosted.partition, producer_id, epoch,
                                         first_offset, start_ms, holder,
                                         holder is not None or self._known(hosted,
                                                                           first_offset)))
        return sorted(found, key=lambda entry: (entry.start_offset, entry.producer_id))

    @staticmethod
    def _start_ms(partition_log, offset: int) -> int:
        """The max timestamp of the batch at ``offset``, or -1 when it cannot be read
        (retention took it, or the segment is damaged)."""
        try:
            result = partition_log.read(offset, max_bytes=1)
        except ShmlogError as error:
            log.warning("the start of a transaction open at offset %d of %s is not read: %s",
                        offset, partition_log.directory, error)
            return _NOT_READ
        if not result.data.size:
            return _NOT_READ
        return batch_info(result.data, 0).max_timestamp

