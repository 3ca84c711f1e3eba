"""DeleteRecords on the leader (``storage.delete_records``' rules): a partition this
broker leads has its log start moved here, for its own services and for the
DELETE_RECORDS its peers forward (Kafka's ``ReplicaManager.deleteRecords``).

Rules
-----
* Only the leader deletes: a partition not hosted is ``UNKNOWN_TOPIC_OR_PARTITION``,
  one led elsewhere ``NOT_LEADER_OR_FOLLOWER``; a refusal of the local storage is
  ``KAFKA_STORAGE_ERROR`` (logged).
* The answer carries the low watermark over this log and the log starts its live
  followers last reported (``storage.delete_records.low_watermark``): followers take
  the leader's log start from its fetch responses, so it rises as they fetch.

Theory of operation
-------------------
:meth:`DeleteRecordsServing.delete_records_as_leader` is the whole operation, on the
loop thread; :meth:`DeleteRecordsServing.serve` runs it for each partition of a
peer's DELETE_RECORDS and replies with the wire's error codes.
"""

from __future__ import annotations

import logging
from typing import Callable

from ...common.errors import ShmlogError
from ...storage import delete_records as deletion
from ...zmq_replication import ReceivedRequest, ReplicationEndpoint
from .hosted_replicas import HostedReplicas, partition_name
from .messages import (
    DeleteRecords,
    DeleteRecordsResponse,
    DeleteRecordsResponsePartition,
    ErrorCode,
)
from .partition import PartitionReplica, Role

log = logging.getLogger("shmlog.broker")

__all__ = ["DeleteRecordsServing"]


class DeleteRecordsServing:
    """DeleteRecords on the partitions this broker leads (see the module's rules).

    Parameters
    ----------
    hosted : HostedReplicas
    endpoint : ReplicationEndpoint
    log_start_moved : callable
        Told of each partition whose log start a deletion moved (the leader's fetch
        serving: its followers' fetch sessions carry it to them).
    """

    def __init__(self, hosted: HostedReplicas, endpoint: ReplicationEndpoint,
                 log_start_moved: Callable[[PartitionReplica], None]):
        self.hosted = hosted
        self.endpoint = endpoint
        self._log_start_moved = log_start_moved

    def delete_records_as_leader(self, topic: str, partition: int,
                                 offset: int) -> tuple[str | None, int, int]:
        """Kafka's DeleteRecords on a partition this broker leads (``delete_records``'
        rules): (a Kafka error name or None, the offset resolved, the low watermark
        over this log and its live followers' reported log starts)."""
        refused = deletion.refuse_internal(topic, partition, offset)
        if refused is not None:                  # also when a peer forwards one
            return refused["error"], offset, deletion.UNKNOWN_OFFSET
        replica = self.hosted.replicas.get((topic, partition))
        if replica is None:
            return deletion.UNKNOWN_TOPIC_OR_PARTITION, offset, deletion.UNKNOWN_OFFSET
        if replica.role is not Role.LEADER:
            return deletion.NOT_LEADER_OR_FOLLOWER, offset, deletion.UNKNOWN_OFFSET
        try:
            error, offset = self.hosted.host.delete_records(topic, partition, offset)
        except ShmlogError as refused:
            log.error("%r: delete-records to %d failed: %s", replica, offset, refused)
            return deletion.KAFKA_STORAGE_ERROR, offset, deletion.UNKNOWN_OFFSET
        self._log_start_moved(replica)
        followers = [state.log_start_offset
                     for broker_id, state in replica.leader.followers.items()
                     if broker_id in self.hosted.view.brokers]
        return error, offset, deletion.low_watermark(replica.log.log_start_offset, followers)

    def serve(self, event: ReceivedRequest, request: DeleteRecords) -> None:
        """Answer a peer's DELETE_RECORDS."""
        answers = []
        for entry in request.partitions:
            replica = self.hosted.by_key((entry.topic_key, entry.partition))
            error, offset, low = (deletion.UNKNOWN_TOPIC_OR_PARTITION, entry.offset,
                                  deletion.UNKNOWN_OFFSET) if replica is None else \
                self.delete_records_as_leader(*partition_name(replica), entry.offset)
            answers.append(DeleteRecordsResponsePartition(
                entry.topic_key, entry.partition,
                ErrorCode.NONE if error is None else ErrorCode[error], offset, low))
        self.endpoint.reply(event, DeleteRecordsResponse(tuple(answers)))
