"""A cluster coordinator's transaction markers (Kafka's
``TransactionMarkerChannelManager``): each transaction's COMMIT or ABORT markers sent
to the leaders of its partitions once its decision is replicated.

Rules
-----
* Markers go out only once the decision (the Prepare* state, or for a coordinator
  that just loaded the partition, everything it read) is under the high watermark of
  its ``__transaction_state`` partition: a coordinator that takes over finds every
  decision a marker was written for. Markers queued by a coordinator that lost the
  partition are dropped: the new one sends them.
* One ``write_txn_markers`` request per leader names its partitions; the leader
  answers once its high watermark covers the markers (``ClusterTransactionService``).
  A partition with no live leader, a leader that refuses or does not answer, is a
  failed marker: the coordinator sends it again after
  ``limits.TRANSACTION_MARKER_RETRY_MS``. A deleted topic's partitions need none.
* Every marker carries the coordinator's leader epoch (Kafka's coordinator epoch),
  and each partition the leader epoch the coordinator sees: a leader at another
  epoch writes nothing (a request delivered late to a broker that leads again).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..common.errors import ShmlogError, UnknownTopicOrPartitionError
from ..record.control import EndTransactionMarker
from ..record.records import now_ms
from .transaction_verification import Ask

__all__ = ["MarkerSender"]


@dataclasses.dataclass
class _Markers:
    """A transaction's markers, waiting for its decision to be replicated, then out."""
    transactional_id: str
    round: int                              # the coordinator's round of these markers
    marker: EndTransactionMarker
    partitions: list
    decision: tuple | None                  # (replica, epoch, offset) of the decision
    waiting: int = 0                        # leaders asked, not answered
    failed: dict = dataclasses.field(default_factory=dict)


class MarkerSender:
    """The markers one coordinator sends (see the module's rules).

    Parameters
    ----------
    ask : callable
        Sends a transaction request to a broker (``ClusterTransactionService``).
    leader_of : callable
        ``leader_of(topic, partition)``: (its live leader's broker id, leader epoch),
        or raises.
    topics : callable
        The topics that exist now.
    replicated : callable
        ``replicated((replica, leader epoch, offset))``: whether that offset is under
        the high watermark, None if it never will be here (the leadership lost).
    written : callable
        ``TransactionCoordinator.markers_written``.
    """

    def __init__(self, ask: Ask, leader_of: Callable[[str, int], tuple[int, int]],
                 topics: Callable,
                 replicated: Callable[[tuple | None], bool | None], written: Callable):
        self.ask = ask
        self.leader_of = leader_of
        self.topics = topics
        self.replicated = replicated
        self.written = written
        self._queued: list[_Markers] = []

    def queue(self, transactional_id: str, marker: EndTransactionMarker, partitions: list,
              round_: int, decision: tuple | None) -> None:
        """Send the transaction's markers once ``decision`` is replicated."""
        self._queued.append(_Markers(transactional_id, round_, marker, list(partitions),
                                     decision))

    def forget(self, transactional_ids: set) -> None:
        """Drop the queued markers of ids no longer coordinated here."""
        self._queued = [markers for markers in self._queued
                        if markers.transactional_id not in transactional_ids]

    def poll(self, now: int) -> None:
        """Send the markers whose decision is replicated now."""
        waiting = []
        for markers in self._queued:
            replicated = self.replicated(markers.decision)
            if replicated is None:
                continue                   # not coordinated here any more: the new one sends
            if not replicated:
                waiting.append(markers)
                continue
            self._send(markers, now)
        self._queued = waiting

    def _send(self, markers: _Markers, now: int) -> None:
        """One WriteTxnMarkers per leader of the transaction's partitions."""
        by_leader: dict[int, list] = {}
        for topic, partition in markers.partitions:
            if topic not in self.topics():
                markers.failed[(topic, partition)] = UnknownTopicOrPartitionError(
                    f"{topic} does not exist")
                continue
            try:
                leader, leader_epoch = self.leader_of(topic, partition)
            except ShmlogError as error:
                markers.failed[(topic, partition)] = error
                continue
            by_leader.setdefault(leader, []).append([topic, partition, leader_epoch])
        markers.waiting = len(by_leader)
        fields = {"producer_id": markers.marker.producer_id,
                  "producer_epoch": markers.marker.producer_epoch,
                  "committed": markers.marker.committed,
                  "coordinator_epoch": markers.marker.coordinator_epoch}
        if not by_leader:
            self._done(markers)
        for leader, partitions in sorted(by_leader.items()):
            self.ask(leader, "write_txn_markers", {**fields, "partitions": partitions},
                     lambda result, partitions=partitions:
                     self._answered(markers, [entry[:2] for entry in partitions], result))

    def _answered(self, markers: _Markers, partitions: list,
                  result: dict | ShmlogError) -> None:
        if isinstance(result, ShmlogError):
            for topic, partition in partitions:
                markers.failed[(topic, partition)] = result
        else:
            for topic, partition, name, message in result.get("errors", ()):
                markers.failed[(topic, partition)] = \
                    UnknownTopicOrPartitionError(message) \
                    if name == UnknownTopicOrPartitionError.__name__ else ShmlogError(message)
        markers.waiting -= 1
        if markers.waiting <= 0:
            self._done(markers)

    def _done(self, markers: _Markers) -> None:
        written = [(topic, partition) for topic, partition in markers.partitions
                   if (topic, partition) not in markers.failed]
        self.written(markers.transactional_id, markers.round, written, markers.failed,
                     now_ms())
