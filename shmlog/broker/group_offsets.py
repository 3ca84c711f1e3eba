"""The offsets manager of the group coordinator (Kafka's GroupMetadataManager): every
group a broker knows, what each committed, and how commits are stored in
``__consumer_offsets``, checked, read back, fetched, expired and deleted.

Rules
-----
* A commit is stored whole or refused whole: every partition it names must exist,
  every offset lie in [0, log end offset], every metadata string fit
  ``limits.OFFSET_METADATA_SIZE_MAX``.
* Committed offsets are records of the compacted topic ``__consumer_offsets`` (key:
  group, topic, partition; value: offset, metadata, commit time; :func:`offset_record`),
  appended before the commit is answered and kept here only once appended, and read
  back (:meth:`GroupMetadataManager.load`) when the broker starts.
* The committed offsets of a group without members expire ``offsets_retention_ms``
  (Kafka's ``offsets.retention.minutes``, 7 days) after its last member left, or
  after the commit if that came later; a group with nothing left is forgotten.
  A group with members keeps its offsets. An expiry whose append fails is tried
  again :data:`limits.OFFSETS_EXPIRY_RETRY_MS` later.
* No I/O of its own: the broker's state is read through the two callables it is
  made with (partition counts, log end offsets), and each call that stores records
  is handed the coordinator's append (``append_offsets(group_id, [(key, value),
  ...])``, which raises to refuse) and, for expiry, the retention and the time.

Theory of operation
-------------------
The manager holds the ``groups`` cache (:class:`~.group_metadata.GroupMetadata` by
id) that the coordinator's membership protocol works on. A group exists here while
it has members or committed offsets: a commit, a join or a load makes it; a
delete, the expiry of its last offset, or an unload (a cluster member that stopped
leading its offsets partition) forgets it. The coordinator asks here for the group
a request names, checks and stores commits through here, and answers fetches and
the offset half of a describe from here.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Iterable, Iterator, Mapping

from ..common import limits
from ..common.errors import (
    GroupIdNotFoundError,
    OffsetMetadataTooLargeError,
    OffsetOutOfRangeError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..groups import OFFSETS_TOPIC, GroupState, require_group_id, require_partition
from ..protocol.control import require
from .group_metadata import CommittedOffset, GroupMetadata

log = logging.getLogger("shmlog.groups")

__all__ = ["GroupMetadataManager", "OFFSETS_TOPIC_CONFIG",
           "offset_record", "parse_offset_record", "commit_entries"]

# What Kafka gives its offsets topic: compacted, 100 MiB segments.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 100 << 20}

# append_offsets(group_id, [(key, value), ...]): stores records durably, or raises.
AppendOffsets = Callable[[str, list], None]


def offset_record(group_id: str, topic: str, partition: int,
                  committed: CommittedOffset | None) -> tuple[bytes, bytes | None]:
    """The key and value of a commit in ``__consumer_offsets`` (None: a tombstone).
    The key is canonical JSON, so compaction keeps one record per partition."""
    key = json.dumps(["offset", group_id, topic, partition], separators=(",", ":")).encode()
    if committed is None:
        return key, None
    return key, json.dumps({"offset": committed.offset, "metadata": committed.metadata,
                            "timestamp": committed.timestamp}, separators=(",", ":")).encode()


def parse_offset_record(key: bytes | None, value: bytes | None):
    """(group, topic, partition, CommittedOffset or None), or None for a record that
    is not a commit (or is unreadable: logged, skipped)."""
    try:
        kind, group_id, topic, partition = json.loads(key)
        if kind != "offset":
            return None
        if value is None:
            return group_id, topic, int(partition), None
        body = json.loads(value)
        return group_id, topic, int(partition), CommittedOffset(
            int(body["offset"]), str(body.get("metadata", "")), int(body.get("timestamp", -1)))
    except (TypeError, ValueError, KeyError) as error:
        log.warning("skipping an unreadable %s record (%s)", OFFSETS_TOPIC, error)
        return None


def commit_entries(offsets, now: int) -> list[tuple[tuple[str, int], CommittedOffset]]:
    """A commit request's ``offsets`` ([[topic, partition, offset, metadata], ...],
    metadata optional) checked for shape, stamped with the commit time ``now``."""
    entries = []
    for entry in require(offsets, list, "offsets"):
        topic, partition, offset, metadata = (list(require(entry, list, "offsets[]"))
                                              + [""])[:4]
        entries.append(((require(topic, str, "topic"), require(partition, int, "partition")),
                        CommittedOffset(require(offset, int, "offset"),
                                        require(metadata, str, "metadata"), now)))
    return entries


class GroupMetadataManager:
    """Every group of one broker and the offsets each committed.

    Parameters
    ----------
    topics : callable
        Returns {topic: partition count} for every topic now.
    end_offset : callable
        ``end_offset(topic, partition)``: the high watermark (commits' upper bound,
        and lag), or None for a partition the broker does not host.
    """

    def __init__(self, *, topics: Callable[[], Mapping[str, int]],
                 end_offset: Callable[[str, int], int | None]):
        self._topics = topics
        self._end_offset = end_offset
        self.groups: dict[str, GroupMetadata] = {}
        # Commits made inside transactions not ended yet: producer id -> group id ->
        # {(topic, partition): CommittedOffset}.
        self.pending: dict[int, dict[str, dict]] = {}
        self._expiry_not_before_ms = 0         # after a failed expiry, when to try again

    # -- the groups ------------------------------------------------------------------
    def group(self, group_id) -> GroupMetadata:
        """The group a request names; GroupIdNotFoundError when there is none."""
        group = self.groups.get(require_group_id(group_id))
        if group is None or group.state is GroupState.DEAD:
            raise GroupIdNotFoundError(f"no group {group_id!r}")
        return group

    def group_or_new(self, group_id: str) -> GroupMetadata:
        """The group, or a new empty one in its place when there is none (or it died)."""
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            group = self.groups[group_id] = GroupMetadata(group_id)
        return group

    # -- recovery -------------------------------------------------------------------------
    def load(self, records: Iterable[tuple],
             belongs: Callable[[str], bool] = lambda group_id: True) -> None:
        """Replay ``__consumer_offsets`` records, oldest first (all of them at a
        start, or one partition's when a cluster member becomes its leader: the
        groups of other partitions are left as they are). Each record is (key, value,
        producer id of its transactional batch or -1, end-transaction marker or
        None): a transaction's commits wait for its marker, and those of a
        transaction still open at the end stay pending (``partition_host.InternalRecord``).
        ``records`` are one partition's when a marker is met: ``belongs`` says which
        groups that partition holds (a marker ends its producer's commits there alone)."""
        loaded = set()
        for key, value, producer_id, marker in records:
            if marker is not None:
                loaded.update(self.complete_transaction(marker.producer_id, marker.committed,
                                                        belongs))
                continue
            parsed = parse_offset_record(key, value)
            if parsed is None:
                continue
            group_id, topic, partition, committed = parsed
            if producer_id >= 0:
                self.pending.setdefault(producer_id, {}).setdefault(group_id, {})[
                    (topic, partition)] = committed
                continue
            self._apply(group_id, [((topic, partition), committed)])
            loaded.add(group_id)
        for group_id in loaded:
            group = self.groups.get(group_id)
            if group is not None and not group.offsets and not group.members:
                del self.groups[group_id]       # every commit was tombstoned

    def _apply(self, group_id: str, entries) -> None:
        """Keep commits ((topic, partition), CommittedOffset or None: a tombstone)."""
        group = self.groups.setdefault(group_id, GroupMetadata(group_id))
        for partition, committed in entries:
            if committed is None:
                group.offsets.pop(partition, None)
            else:
                group.offsets[partition] = committed

    # -- transactions (KIP-98's TxnOffsetCommit) ----------------------------------------------
    def store_pending(self, group_id: str, producer_id: int, entries: list,
                      append_offsets: Callable[[str, list], None]) -> None:
        """Store a checked commit made inside a producer's transaction: appended
        (``append_offsets`` writes it as that transaction's batch) and kept aside, not
        visible to fetches, until the transaction's marker
        (:meth:`complete_transaction`)."""
        append_offsets(group_id, [offset_record(group_id, *partition, committed)
                                  for partition, committed in entries])
        self.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(entries)

    def complete_transaction(self, producer_id: int, committed: bool,
                             belongs: Callable[[str], bool] = lambda group_id: True) -> list:
        """A marker of the producer's transaction was written to the offsets
        partition of the groups that ``belongs``: their pending commits are kept
        (COMMIT) or dropped (ABORT). The groups that changed."""
        groups = self.pending.get(producer_id, {})
        done = [group_id for group_id in groups if belongs(group_id)]
        for group_id in done:
            entries = groups.pop(group_id)
            if committed:
                # A commit made after the transaction's (a plain one) stands, as Kafka
                # keeps the later record.
                current = self.groups.get(group_id)
                self._apply(group_id, [
                    (partition, pending) for partition, pending in entries.items()
                    if current is None or partition not in current.offsets
                    or current.offsets[partition].timestamp <= pending.timestamp])
        if not groups:
            self.pending.pop(producer_id, None)
        return done if committed else []

    def pending_partitions(self, group_id: str) -> set:
        """The partitions of the group with a commit waiting for its transaction's end
        (Kafka answers a fetch of them UNSTABLE_OFFSET_COMMIT when asked to)."""
        return {partition for groups in self.pending.values()
                for partition in groups.get(group_id, {})}

    def unload(self, belongs: Callable[[str], bool]) -> list[GroupMetadata]:
        """Forget every group whose id ``belongs`` (Kafka's ``removeGroupsForPartition``);
        returns them, so the coordinator can answer the joins they hold."""
        gone = [group_id for group_id in self.groups if belongs(group_id)]
        return [self.groups.pop(group_id) for group_id in gone]

    # -- commits ----------------------------------------------------------------------
    def check_commit(self, group_id: str, entries: list) -> None:
        """Refuse a whole commit (nothing of it is stored) that names a partition the
        broker does not host, an offset outside [0, log end offset] (no consumer can
        have read past the end; a later fetch from there would fail), or metadata
        longer than Kafka's ``offset.metadata.max.bytes``."""
        counts = self._topics()
        for (topic, partition), committed in entries:
            where = f"group {group_id!r} committed {topic}-{partition}"
            end = self._end_offset(topic, partition) \
                if 0 <= partition < counts.get(topic, 0) else None
            if end is None:
                raise UnknownTopicOrPartitionError(
                    f"{where}, which the broker does not host (deleted, or never created); "
                    f"commit only partitions of existing topics")
            if not 0 <= committed.offset <= end:
                raise OffsetOutOfRangeError(
                    f"{where} at offset {committed.offset}, outside [0, {end}] (its log end "
                    f"offset); commit the offset of the next record to read",
                    offset=committed.offset, log_start_offset=0, log_end_offset=end)
            size = len(committed.metadata.encode(errors="surrogatepass"))
            if size > limits.OFFSET_METADATA_SIZE_MAX:
                raise OffsetMetadataTooLargeError(
                    f"{where} with {size} bytes of metadata; at most "
                    f"{limits.OFFSET_METADATA_SIZE_MAX} are kept (offset.metadata.max.bytes)")

    def store(self, group_id: str, entries: list, append_offsets: AppendOffsets) -> None:
        """Store a checked commit: appended through ``append_offsets`` (which raises
        to refuse it), then kept."""
        group = self.group_or_new(group_id)
        append_offsets(group_id, [offset_record(group_id, *partition, committed)
                                  for partition, committed in entries])
        group.offsets.update(entries)

    def delete(self, group: GroupMetadata, append_offsets: AppendOffsets) -> None:
        """Tombstone every committed offset of a group without members, and forget it."""
        append_offsets(group.group_id, [offset_record(group.group_id, *partition, None)
                                        for partition in sorted(group.offsets)])
        group.transition(GroupState.DEAD)
        del self.groups[group.group_id]

    def fetch_offsets(self, group_id, partitions=None) -> dict:
        """[[topic, partition, offset, metadata], ...] of the partitions asked (all
        by default); partitions without a commit are left out."""
        group = self.groups.get(require_group_id(group_id))
        offsets = group.offsets if group is not None else {}
        wanted = offsets.keys() if partitions is None else \
            [require_partition(entry) for entry in require(partitions, list, "partitions")]
        found = [key for key in sorted(wanted) if key in offsets]
        return {"offsets": [[topic, partition, offsets[(topic, partition)].offset,
                             offsets[(topic, partition)].metadata]
                            for topic, partition in found]}

    def describe_offsets(self, group: GroupMetadata) -> list[dict]:
        """Per partition committed or assigned: the committed offset and metadata, the
        log end offset, the lag (end - committed) and the member that owns it."""
        owners = {partition: member.member_id for member in group.members.values()
                  for partition in member.assignment}
        partitions = []
        for topic, partition in sorted(set(group.offsets) | set(owners)):
            committed = group.offsets.get((topic, partition))
            end = self._end_offset(topic, partition)
            partitions.append({
                "topic": topic, "partition": partition,
                "committed": committed.offset if committed else None,
                "metadata": committed.metadata if committed else None,
                "log_end_offset": end,
                "lag": end - committed.offset if committed is not None and end is not None
                else None,
                "member_id": owners.get((topic, partition))})
        return partitions

    # -- expiry ---------------------------------------------------------------------------
    def _expiry_ms(self, group: GroupMetadata, committed: CommittedOffset,
                   retention_ms: int) -> int:
        """When a committed offset of an empty group expires (Kafka's KIP-211):
        the retention after the group lost its last member, or after the commit
        when that came later (a consumer without a subscription commits so)."""
        return max(group.empty_since_ms, committed.timestamp) + retention_ms

    def expire(self, now: int, retention_ms: int, append_offsets: AppendOffsets) -> None:
        """Tombstone the committed offsets of groups without members that are past
        their retention (once ``now`` passed a failed attempt's retry time)."""
        if now < self._expiry_not_before_ms:
            return
        for group in list(self.groups.values()):
            if group.state is not GroupState.EMPTY or not group.offsets:
                continue
            expired = sorted(partition for partition, committed in group.offsets.items()
                             if self._expiry_ms(group, committed, retention_ms) <= now)
            if not expired:
                continue
            try:
                append_offsets(group.group_id, [offset_record(group.group_id, *partition, None)
                                                for partition in expired])
            except ShmlogError as error:
                log.warning("group %s: expiring %d committed offsets failed (%s); trying again "
                            "in %d ms", group.group_id, len(expired), error,
                            limits.OFFSETS_EXPIRY_RETRY_MS)
                self._expiry_not_before_ms = now + limits.OFFSETS_EXPIRY_RETRY_MS
                return
            log.info("group %s: %d committed offsets expired (offsets_retention_ms %d)",
                     group.group_id, len(expired), retention_ms)
            for partition in expired:
                del group.offsets[partition]
            if not group.offsets:
                group.transition(GroupState.DEAD)   # nothing left of it: forgotten
                del self.groups[group.group_id]

    def expiry_deadlines(self, retention_ms: int) -> Iterator[int]:
        """When :meth:`expire` next has something to do, per committed offset of a
        group without members (ms)."""
        for group in self.groups.values():
            if group.state is GroupState.EMPTY:
                for committed in group.offsets.values():
                    yield max(self._expiry_ms(group, committed, retention_ms),
                              self._expiry_not_before_ms)
