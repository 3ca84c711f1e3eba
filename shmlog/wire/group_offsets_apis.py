"""Kafka's group offsets and listings over shmlog's group coordinator: OffsetCommit
(2-8), OffsetFetch (1-7), DescribeGroups (0-5) and ListGroups (0-4).

Rules
-----
* Offsets are the ones shmlog's own consumers commit and fetch (``__consumer_offsets``),
  so either kind of client sees the other's commits, and ``shmlog groups describe``
  a Kafka client's lag. A commit is fenced as the coordinator fences it (generation,
  and only the partitions this member owns); a refusal applies to every partition
  of the request, with its Kafka code. Leader epochs of commits are not kept:
  OffsetFetch answers -1 for them (Kafka's "unknown"), and clients then skip their
  truncation check.
* OffsetFetch names every partition asked; one without a commit gets offset -1, as
  in Kafka. Asked for no topics (null, v2+), it gives every commit of the group.
* DescribeGroups gives Kafka's states (Empty, PreparingRebalance, Stable, Dead), the
  assignor as the protocol, and per member its subscription and assignment encoded
  as Kafka's consumer protocol does. A group the coordinator does not know is Dead.
* ListGroups lists the groups of the whole cluster (the group service asks every
  broker), filtered by state from v4.
"""

from __future__ import annotations

from ..common.errors import GroupIdNotFoundError, ShmlogError
from . import codec
from .error_codes import NONE, for_error
from .group_apis import CONSUMER_PROTOCOL, GroupServiceArea, call_service
from .tickets import Gather

__all__ = ["GroupOffsetsApis"]

OFFSET_COMMIT_KEY = 8
OFFSET_FETCH_KEY = 9
DESCRIBE_GROUPS_KEY = 15
LIST_GROUPS_KEY = 16
_DEAD = "Dead"


class GroupOffsetsApis(GroupServiceArea):
    """OffsetCommit, OffsetFetch, DescribeGroups and ListGroups on broker ``core``;
    ``respond`` sends a response the group service answered later."""

    def apis(self) -> dict:
        return {OFFSET_COMMIT_KEY: (2, 8, self.offset_commit),
                OFFSET_FETCH_KEY: (1, 7, self.offset_fetch),
                DESCRIBE_GROUPS_KEY: (0, 5, self.describe_groups),
                LIST_GROUPS_KEY: (0, 4, self.list_groups)}

    # -- OffsetCommit --------------------------------------------------------------------
    def offset_commit(self, request, header, body):
        cls = codec.response_class(OFFSET_COMMIT_KEY)
        topic_class = cls.OffsetCommitResponseTopic
        offsets = [[topic.name, partition.partition_index, partition.committed_offset,
                    partition.committed_metadata or ""]
                   for topic in body.topics for partition in topic.partitions]

        def build(result):
            code = for_error(result) if isinstance(result, ShmlogError) else NONE
            return cls(version=header.api_version, throttle_time_ms=0, topics=[
                topic_class(name=topic.name, partitions=[
                    topic_class.OffsetCommitResponsePartition(
                        partition_index=partition.partition_index, error_code=code)
                    for partition in topic.partitions])
                for topic in body.topics])

        return self._call("commit_offsets", request, header, build, group_id=body.group_id,
                          offsets=offsets, member_id=body.member_id or "",
                          generation=body.generation_id_or_member_epoch,
                          group_instance_id=getattr(body, "group_instance_id", None))

    # -- OffsetFetch ---------------------------------------------------------------------
    def offset_fetch(self, request, header, body):
        cls = codec.response_class(OFFSET_FETCH_KEY)
        topic_class = cls.OffsetFetchResponseTopic
        partition_class = topic_class.OffsetFetchResponsePartition
        asked = None if body.topics is None else \
            [[topic.name, index] for topic in body.topics for index in topic.partition_indexes]

        def build(result):
            if isinstance(result, ShmlogError):
                code, found = for_error(result), {}
            else:
                code = NONE
                found = {(topic, partition): (offset, metadata)
                         for topic, partition, offset, metadata in result["offsets"]}
            wanted = asked if asked is not None else sorted(found)
            by_topic: dict[str, list] = {}
            for topic, partition in wanted:
                offset, metadata = found.get((topic, partition), (-1, ""))
                by_topic.setdefault(topic, []).append(partition_class(
                    partition_index=partition, committed_offset=offset,
                    committed_leader_epoch=-1, metadata=metadata, error_code=NONE))
            return cls(version=header.api_version, throttle_time_ms=0, error_code=code,
                       topics=[topic_class(name=topic, partitions=partitions)
                               for topic, partitions in by_topic.items()])

        return self._call("fetch_offsets", request, header, build, group_id=body.group_id,
                          partitions=asked)

    # -- DescribeGroups ------------------------------------------------------------------
    def describe_groups(self, request, header, body):
        cls = codec.response_class(DESCRIBE_GROUPS_KEY)
        group_ids = list(dict.fromkeys(body.groups))

        def complete(results):
            described = {group_id: results[index] for index, group_id in enumerate(group_ids)}
            return cls(version=header.api_version, throttle_time_ms=0,
                       groups=[described[group_id] for group_id in body.groups])

        gather = Gather(len(group_ids), complete,
                        lambda response: self._respond(request, header, response))
        for index, group_id in enumerate(group_ids):     # a cluster member asks coordinators
            call_service(
                self.core, self._handlers["describe_group"],
                lambda result, index=index, group_id=group_id:
                gather.put(index, self._described(cls, group_id, result)),
                group_id=group_id)
        return gather.outcome()

    @staticmethod
    def _described(cls, group_id: str, result):
        group_class = cls.DescribedGroup
        if isinstance(result, GroupIdNotFoundError):
            return group_class(error_code=NONE, error_message=None, group_id=group_id,
                               group_state=_DEAD, protocol_type="", protocol_data="",
                               members=[])
        if isinstance(result, ShmlogError):
            return group_class(error_code=for_error(result), error_message=str(result),
                               group_id=group_id, group_state=_DEAD, protocol_type="",
                               protocol_data="", members=[])
        return group_class(
            error_code=NONE, error_message=None, group_id=group_id,
            group_state=result["state"], protocol_type=CONSUMER_PROTOCOL,
            protocol_data=result["protocol"] or "",
            members=[group_class.DescribedGroupMember(
                member_id=member["member_id"],
                group_instance_id=member.get("group_instance_id"),
                client_id=member["client_id"], client_host=member["client_host"],
                member_metadata=codec.encode_subscription(member["topics"]),
                member_assignment=codec.encode_assignment(member["assignment"]))
                for member in result["members"]])

    # -- ListGroups ----------------------------------------------------------------------
    def list_groups(self, request, header, body):
        cls = codec.response_class(LIST_GROUPS_KEY)
        states = set(getattr(body, "states_filter", None) or [])

        def build(result):
            if isinstance(result, ShmlogError):
                return cls(version=header.api_version, throttle_time_ms=0,
                           error_code=for_error(result), groups=[])
            return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                       groups=[cls.ListedGroup(group_id=group["group_id"],
                                               protocol_type=CONSUMER_PROTOCOL,
                                               group_state=group["state"])
                               for group in result["groups"]
                               if not states or group["state"] in states])

        return self._call("list_groups", request, header, build)

