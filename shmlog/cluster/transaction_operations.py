"""The operators' transaction requests on a cluster member (Kafka's kafka-transactions.sh
against a cluster: DescribeProducers and find-hanging of the partitions a broker
hosts, and the abort of a hanging transaction in one it leads), and what its
``stats`` shows of transactions.

Rules
-----
* The scans are one broker's (``broker.transaction_operations``'s rules), but whether
  a coordinator holds a transaction is known to that coordinator, perhaps on another
  broker. So each request first asks every live broker what its coordinator holds
  (``transaction_holders``, gathered), and judges the partitions' open transactions
  against all of it.
* A transaction nobody holds is called hanging only when every partition of
  ``__transaction_state`` was loaded by a coordinator that answered, and the
  transaction opened below its partition's log end when the brokers were asked (a
  coordinator adds a partition before its first batch goes in); a moving or silent
  coordinator
  leaves it unjudged (only its age can make it hanging). An abort needs that whole
  view: without it it is refused (``CoordinatorNotAvailableError``, retriable),
  nothing written. It needs this broker to lead the partition too
  (``NotCoordinatorError`` names the leader's broker otherwise).
* ``stats`` (``shmlog status``, Prometheus) judges by the last view gathered, and
  asks for a new one when that is older than ``limits.TRANSACTION_HOLDERS_MAX_AGE_MS``:
  its hanging transactions may lag that much. Its coordinator figures (ids by state,
  commits, aborts, timeouts) are this broker's coordinator's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..broker.group_service import with_request_signature
from ..broker.transaction_coordinator import TransactionMetadata, TransactionState
from ..broker.transaction_operations import OPERATOR_REQUESTS, TransactionOperations
from ..common import limits
from ..common.errors import CoordinatorNotAvailableError, ShmlogError
from ..record.records import now_ms

if TYPE_CHECKING:
    from .transactions import ClusterTransactionService

__all__ = ["ClusterTransactionOperations"]


@dataclasses.dataclass
class _Holders:
    """What every coordinator held, as of a moment."""
    by_producer: dict            # producer id -> TransactionMetadata
    log_ends: dict               # (topic id, partition) -> its log end when they were asked
    complete: bool               # every coordinator answered, every partition loaded


class ClusterTransactionOperations(TransactionOperations):
    """The operators' requests of a cluster member (see the module's rules).

    Parameters
    ----------
    service : ClusterTransactionService
        The member's transactions: its host, coordinator, marker writes, channel
        and the replies it hands back.
    """

    def __init__(self, service: ClusterTransactionService):
        super().__init__(service)
        self.service = service
        self._view: _Holders | None = None
        self._asking = False
        self._gathered_at = -limits.TRANSACTION_HOLDERS_MAX_AGE_MS - 1

    def handlers(self) -> dict:
        return {name: self._after_asking(name) for name in OPERATOR_REQUESTS}

    def _after_asking(self, name: str):
        """The base request, answered once every coordinator said what it holds."""
        method = getattr(super(), name)

        def handler(**fields):
            ticket = self.service.context.ticket
            self.service.relaying(ticket)
            self._gather(lambda: self._answer(ticket, name, method, fields))
            return None
        return with_request_signature(handler, method)

    def _answer(self, ticket, name: str, method, fields: dict) -> None:
        if name == "abort_hanging_transaction" and not self._view.complete:
            result = CoordinatorNotAvailableError(
                "not every transaction coordinator answered (a broker down, a coordinator "
                "moving): whether the transaction is held is not known, nothing was "
                "aborted; ask again")
        else:
            try:
                result = method(**fields)
            except ShmlogError as error:
                result = error
        self.service.reply(ticket, result)

    def _gather(self, then=None) -> None:
        """Ask every broker what its coordinator holds; keep it as the view."""
        # A transaction opened below these offsets opened before the coordinators
        # answered: had one held it, it would have said so.
        log_ends = {(hosted.log.topic_id, hosted.partition): hosted.log.log_end_offset
                    for hosted in self.host.partition_list()}
        self._asking = True
        self._gathered_at = now_ms()

        def gathered(result) -> None:
            self._asking = False
            if isinstance(result, ShmlogError):          # not expected: gather never raises
                result = {"transactions": [], "unreachable_brokers": [-1], "loaded": []}
            partitions = self.service.state_topic.partition_count()
            complete = not result["unreachable_brokers"] and partitions is not None \
                and set(result["loaded"]) >= set(range(partitions))
            holders = {}
            for entry in result["transactions"]:
                try:
                    holders[entry["producer_id"]] = _holder(entry)
                except (KeyError, TypeError, ValueError):      # a peer's malformed entry
                    complete = False
            self._view = _Holders(holders, log_ends, complete)
            if then is not None:
                then()
        self.service.channel.gather("transaction_holders", {}, gathered)

    # -- the base's judgement, against the gathered view --------------------------------
    def _holders(self) -> dict[int, TransactionMetadata]:
        return self._view.by_producer if self._view is not None else {}

    def _known(self, hosted, first_offset: int) -> bool:
        view = self._view
        return view is not None and view.complete and first_offset < view.log_ends.get(
            (hosted.log.topic_id, hosted.partition), -1)

    def summary(self):
        """The base's figures, by the last view; a new one asked for when it is old."""
        if not self._asking and now_ms() - self._gathered_at > \
                limits.TRANSACTION_HOLDERS_MAX_AGE_MS:
            self._gather()
        return super().summary()


def _holder(entry: dict) -> TransactionMetadata:
    """A coordinator's DescribeTransactions entry as the state it describes."""
    return TransactionMetadata(
        entry["transactional_id"], entry["producer_id"], entry["producer_epoch"],
        entry["timeout_ms"], TransactionState(entry["state"]),
        {(topic, partition) for topic, partition in entry["partitions"]}, entry["start_ms"])
