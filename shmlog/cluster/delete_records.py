"""DeleteRecords in a cluster: a client's request, sent to its local broker, carried
out by each partition's leader.

Rules
-----
* A partition this broker leads is done here at once (``ReplicaService.
  delete_records_as_leader``). Those led elsewhere are sent, one DELETE_RECORDS
  per leader, over the replication endpoint (Kafka's admin client sends one
  DeleteRecords per leader itself; here clients talk only to their own broker, as
  group requests and produces do), and the client's reply waits for every
  leader's answer, or ``forward.request.timeout.ms``: a leader that does not
  answer in time gives its partitions ``REQUEST_TIMED_OUT`` (the deletion may or
  may not have happened; asking again is safe: the log start never moves back).
* An internal topic's partition is refused here, before any leader is asked
  (``delete_records.refuse_internal``: ``INVALID_TOPIC_EXCEPTION``).
* A partition without a live leader is answered ``NOT_LEADER_OR_FOLLOWER`` at once
  (retriable: Kafka's client would look the leader up again); one unknown here,
  ``UNKNOWN_TOPIC_OR_PARTITION``.
* The leader answers with the low watermark (``delete_records``' rules); the
  followers, this broker among them, learn the new log start from the leader's
  fetch responses (``PartitionReplica.apply_fetched``).

Theory of operation
-------------------
Runs on the loop thread. :meth:`ClusterDeleteRecords.handle` answers at once or
holds the request's ticket; the replica service calls back with each leader's
answer (or None when it got none); once none is outstanding the reply is queued
for :meth:`take_replies`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..common.errors import ShmlogError
from ..storage import delete_records as deletion
from .replication.messages import (
    DeleteRecords,
    DeleteRecordsPartition,
    DeleteRecordsResponse,
    ErrorCode,
)
from .replication.partition import Role
from .replication.replica_service import ReplicaService
from .zk.paths import NO_LEADER

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterDeleteRecords"]


@dataclasses.dataclass
class _Held:
    """A client's request waiting for leaders' answers."""
    order: list[tuple[str, int]]                     # the partitions, as asked
    answers: dict[tuple[str, int], dict]
    waiting: set[int]                                # leaders not answered yet


class ClusterDeleteRecords:
    """A cluster member's DeleteRecords (see the module's rules).

    Parameters
    ----------
    replication : ReplicaService
    """

    def __init__(self, replication: ReplicaService):
        self.replication = replication
        self._held: dict[Any, _Held] = {}
        self._replies: list = []

    def handle(self, ticket, entries: list[tuple[str, int, int]]) -> dict | None:
        """Delete records of ``entries`` ((topic, partition, offset)); the reply now,
        or None when it is held for ``ticket`` (see :meth:`take_replies`)."""
        answers: dict[tuple[str, int], dict] = {}
        by_leader: dict[int, list] = {}
        for topic, partition, offset in entries:
            replica = self.replication.replicas.get((topic, partition))
            refused = deletion.refuse_internal(topic, partition, offset)
            if refused is not None:
                answers[(topic, partition)] = refused
            elif replica is not None and replica.role is Role.LEADER:
                error, resolved, low = self.replication.delete_records_as_leader(
                    topic, partition, offset)
                answers[(topic, partition)] = deletion.answer(topic, partition, resolved, low,
                                                              error)
            elif replica is None:
                answers[(topic, partition)] = deletion.answer(
                    topic, partition, offset, deletion.UNKNOWN_OFFSET,
                    deletion.UNKNOWN_TOPIC_OR_PARTITION)
            elif replica.leader_id == NO_LEADER or \
                    replica.leader_id not in self.replication.view.brokers:
                answers[(topic, partition)] = deletion.answer(
                    topic, partition, offset, deletion.UNKNOWN_OFFSET,
                    deletion.NOT_LEADER_OR_FOLLOWER, "the partition has no live leader")
            else:
                by_leader.setdefault(replica.leader_id, []).append((replica, offset))
        order = [(topic, partition) for topic, partition, _ in entries]
        held = _Held(order, answers, set())
        for leader_id, items in by_leader.items():
            self._send(ticket, held, leader_id, items)
        if not held.waiting:
            return self._reply(held)
        self._held[ticket] = held
        return None

    def _send(self, ticket, held: _Held, leader_id: int, items: list) -> None:
        body = DeleteRecords(tuple(DeleteRecordsPartition(*replica.key, offset)
                                   for replica, offset in items))
        names = {replica.key: (replica.hosted.topic, replica.hosted.partition, offset)
                 for replica, offset in items}
        try:
            self.replication.ask(
                leader_id, body, self.replication.config.forward_request_timeout_ms,
                lambda reply: self._answered(ticket, leader_id, names, reply))
        except ShmlogError as error:
            log.warning("delete-records: cannot ask broker %d: %s", leader_id, error)
            self._fill(held, names, deletion.NOT_LEADER_OR_FOLLOWER, str(error))
            return
        held.waiting.add(leader_id)

    def _answered(self, ticket, leader_id: int, names: dict, reply) -> None:
        held = self._held.get(ticket)
        if held is None:
            return
        held.waiting.discard(leader_id)
        if isinstance(reply, DeleteRecordsResponse):
            for entry in reply.partitions:
                name = names.pop((entry.topic_key, entry.partition), None)
                if name is not None:
                    error = None if entry.error is ErrorCode.NONE else entry.error.name
                    held.answers[name[:2]] = deletion.answer(name[0], name[1], entry.offset,
                                                             entry.low_watermark, error)
        message = f"broker {leader_id} did not answer in time" if reply is None else \
            f"broker {leader_id} answered {reply!r:.200}"
        self._fill(held, names, deletion.REQUEST_TIMED_OUT, message)
        if not held.waiting:
            del self._held[ticket]
            self._replies.append((ticket, self._reply(held)))

    @staticmethod
    def _fill(held: _Held, names: dict, error: str, message: str) -> None:
        """Answer ``error`` for the partitions of ``names`` not answered yet."""
        for topic, partition, offset in names.values():
            held.answers.setdefault((topic, partition), deletion.answer(
                topic, partition, offset, deletion.UNKNOWN_OFFSET, error, message))

    @staticmethod
    def _reply(held: _Held) -> dict:
        return {"partitions": [held.answers[name] for name in held.order]}

    def take_replies(self) -> list:
        """Replies completed since the last call: (ticket, reply fields)."""
        replies, self._replies = self._replies, []
        return replies

    def pending_tickets(self) -> list:
        """Tickets of requests still waiting for a leader."""
        return list(self._held)
