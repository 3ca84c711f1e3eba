"""The consumer-group requests (join, sync, heartbeat, leave, commit and fetch
offsets, list, describe, delete) and the storage of committed offsets: the
:class:`group_coordinator.GroupCoordinator` put into the broker.

Rules
-----
* Committed offsets are records of the compacted internal topic
  ``__consumer_offsets`` (``group_offsets.OFFSETS_TOPIC_CONFIG``,
  ``offsets_topic_num_partitions`` partitions), made by the broker on the first
  commit (as Kafka does), appended
  through the partition host (so through the appender, like every append) before
  the commit is answered, and read back, oldest first, when the broker starts.
* A group's records go to partition ``groups.offsets_partition(group id)``.
* A join is answered when its rebalance completes: its handler returns None and the
  reply comes from :meth:`GroupService.take_replies`.

Theory of operation
-------------------
The coordinator is a state machine without I/O; this service gives it what it
needs from the broker (the topics' partition counts, an append of offset records,
a partition's log end offset for lag), the ticket of the request being handled and
the time, and hears from the partition host when topics change (a subscribed
topic's partitions changing starts a rebalance).
"""

from __future__ import annotations

import inspect
from typing import Any

from ..common.errors import ShmlogError
from ..config.broker import BrokerConfig
from ..groups import OFFSETS_TOPIC, offsets_partition
from ..record.records import encode_batch, now_ms
from .group_coordinator import CoordinatorConfig, GroupCoordinator
from .group_offsets import OFFSETS_TOPIC_CONFIG
from .partition_host import PartitionHost
from .service import RequestContext

__all__ = ["GroupService", "GROUP_REQUESTS", "coordinator_config", "with_request_signature"]

# The coordinator's request methods, each served under its own name.
GROUP_REQUESTS = ("join_group", "sync_group", "heartbeat", "leave_group", "commit_offsets",
                  "fetch_offsets", "list_groups", "describe_group", "delete_group")


def with_request_signature(handler, method):
    """``handler`` with the signature of the coordinator's ``method`` less the
    ``ticket`` and ``now`` the service supplies (the control server checks a
    request's fields against it)."""
    signature = inspect.signature(method)
    handler.__signature__ = signature.replace(parameters=[
        parameter for parameter in signature.parameters.values()
        if parameter.name not in ("ticket", "now")])
    return handler


def coordinator_config(config: BrokerConfig) -> CoordinatorConfig:
    """The group coordinator's settings from the broker's."""
    return CoordinatorConfig(config.group_initial_rebalance_delay_ms,
                             config.group_min_session_timeout_ms,
                             config.group_max_session_timeout_ms,
                             config.offsets_retention_minutes * 60_000)


class GroupService:
    """The group coordinator and its offsets storage in a :class:`PartitionHost`.

    Parameters
    ----------
    config : BrokerConfig
        The group settings and ``offsets_topic_num_partitions``.
    host : PartitionHost
    context : RequestContext
        Who sent the request being handled (a join keeps the ticket).

    Raises
    ------
    StorageError, CorruptSegmentError
        ``__consumer_offsets`` cannot be read back.
    """

    def __init__(self, config: BrokerConfig, host: PartitionHost, context: RequestContext):
        self.host = host
        self.context = context
        self.offsets_topic_partitions = config.offsets_topic_num_partitions
        self.coordinator = GroupCoordinator(
            coordinator_config(config),
            topics=host.partition_counts, append_offsets=self._append_offsets,
            end_offset=self._log_end_offset)
        if OFFSETS_TOPIC in host.logs.list_topics():
            count = host.logs.describe_topic(OFFSETS_TOPIC).partitions
            for partition in range(count):
                self.coordinator.load(
                    host.internal_records(OFFSETS_TOPIC, partition),
                    lambda group_id, partition=partition:
                    offsets_partition(group_id, count) == partition)
        host.when_topics_change(self.coordinator.topics_changed)

    # -- the service -----------------------------------------------------------------
    def handlers(self) -> dict:
        return {name: self._handler(getattr(self.coordinator, name)) for name in GROUP_REQUESTS}

    def _handler(self, method):
        """A coordinator request method as a control handler: the request's fields,
        plus who asked and the time."""
        def handler(**fields):
            return method(**fields, ticket=self.context.ticket, now=now_ms())
        return with_request_signature(handler, method)

    def tick(self, now: int) -> None:
        self.coordinator.tick(now)

    def next_deadline(self) -> int | None:
        return self.coordinator.next_deadline()

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        return self.coordinator.take_replies()

    def pending_tickets(self) -> list:
        return self.coordinator.pending_tickets()

    # -- storage -----------------------------------------------------------------------
    def _log_end_offset(self, topic: str, partition: int) -> int | None:
        try:
            return self.host.partition(topic, partition).log.log_end_offset
        except ShmlogError:
            return None

    def offsets_partition(self, group_id: str) -> int:
        """The group's partition of __consumer_offsets, the topic made on first use
        (as Kafka does)."""
        if OFFSETS_TOPIC not in self.host.logs.list_topics():
            self.host.create_topic(OFFSETS_TOPIC, self.offsets_topic_partitions,
                                   OFFSETS_TOPIC_CONFIG)
        return offsets_partition(group_id,
                                 self.host.logs.describe_topic(OFFSETS_TOPIC).partitions)

    def _append_offsets(self, group_id: str, records: list, producer_id: int = -1,
                        producer_epoch: int = -1) -> None:
        """Append commit records to the group's partition of __consumer_offsets through
        the partition host; with a producer id, as a batch of its transaction."""
        if not records:
            return
        transactional = producer_id >= 0
        self.host.append(OFFSETS_TOPIC, self.offsets_partition(group_id),
                         encode_batch([value for _, value in records],
                                      keys=[key for key, _ in records],
                                      producer_id=producer_id, producer_epoch=producer_epoch,
                                      transactional=transactional),
                         sequenced=not transactional)

    def txn_offset_commit(self, group_id, offsets, producer_id: int, producer_epoch: int,
                          member_id="", generation=-1, group_instance_id=None) -> dict:
        """Commit offsets inside the producer's transaction (the transaction service
        checked that the producer holds it and added the group's partition)."""
        return self.coordinator.txn_offset_commit(
            group_id, offsets, producer_id, member_id, generation, group_instance_id,
            append_offsets=lambda group, records: self._append_offsets(
                group, records, producer_id, producer_epoch),
            now=now_ms())

    def transaction_ended(self, partition: int, producer_id: int, committed: bool) -> None:
        """A marker of the producer's transaction is in ``partition`` of
        __consumer_offsets: its groups' pending commits are kept or dropped."""
        count = self.host.logs.describe_topic(OFFSETS_TOPIC).partitions
        self.coordinator.offsets.complete_transaction(
            producer_id, committed,
            lambda group_id: offsets_partition(group_id, count) == partition)

