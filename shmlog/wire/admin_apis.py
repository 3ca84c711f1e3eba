"""Kafka's topic and cluster admin APIs on the listener: CreateTopics (versions 2-7),
DeleteTopics (1-6), CreatePartitions (0-3), DeleteRecords (0-2), DescribeCluster
(0-2) and DescribeLogDirs (1-5), over the broker's own topic service, so a Kafka
admin client and ``shmlog topics ...`` meet the same checks and the same errors.

Rules
-----
* **One path.** Topics are created, deleted and grown, and records deleted, by the
  topic service's handlers (``create_topics``, ``delete_topic``, ``add_partitions``,
  ``delete_records``, ``describe_log_dirs``): their refusals, typed, become Kafka's
  codes (``error_codes.for_error``) with their messages where the version carries
  one. ``validate_only`` runs the same checks in the same order
  (``_check_new_topic``, ``_check_growth``) and changes nothing.
* **Internal topics are refused** as the topic service refuses them: created,
  deleted or grown, INVALID_TOPIC_EXCEPTION; their records deleted, the same.
* **Per entry.** Each topic (partition) is answered on its own; one refused leaves
  the others done. A name given twice in one request is INVALID_REQUEST for that
  name (Kafka's rule), once in the answer; DeleteRecords keeps the last offset given
  for a partition, as Kafka's map does.
* **Kafka's defaults.** ``num_partitions`` -1 is the broker's ``num_partitions``, a
  replication factor of -1 is 1 (a single broker keeps one copy; any other factor is
  INVALID_REPLICATION_FACTOR). Replicas placed by hand are taken when they place
  each partition on this broker alone (partitions numbered from 0), else
  INVALID_REPLICA_ASSIGNMENT; given with a count or factor, INVALID_REQUEST.
* **Timeouts.** Nothing here waits: a single broker creates, deletes, grows and
  moves a log start before it answers (its low watermark is its own log start), so
  ``timeout_ms`` cannot run out and every answer is final.
* **A single broker's.** A cluster member's topic service answers a topic change
  once ZooKeeper carried it out (a held reply); these handlers answer at once, so
  a member's listener does not serve them (``kafka_listener``).
* DescribeCluster lists the brokers Metadata lists; a request for the controllers'
  endpoints (v1+, endpoint type 2) is MISMATCHED_ENDPOINT_TYPE, as a Kafka broker
  answers. With no authorizer every operation on the cluster is allowed, so the
  authorized operations asked for are all the cluster resource has (Kafka's answer
  without an authorizer).
* DescribeLogDirs answers for the broker's one log directory: the partitions asked
  for that exist (all when the request names none), with their bytes and offset lag;
  v4+ the file system's total and usable bytes.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter

from ..broker.topic_service import refuse_internal
from ..common import limits
from ..common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    LocalProtocolError,
    ShmlogError,
    TopicExistsError,
)
from ..common.topic_names import validate_topic_name
from ..protocol.control import decode_entry
from ..storage.topic_config import TopicConfig, config_sources
from . import codec
from . import error_codes as E
from .config_apis import topic_config_entries

__all__ = ["AdminApis"]

log = logging.getLogger("shmlog.broker.kafka")

CREATE_TOPICS_KEY = 19
DELETE_TOPICS_KEY = 20
DELETE_RECORDS_KEY = 21
DESCRIBE_LOG_DIRS_KEY = 35
CREATE_PARTITIONS_KEY = 37
DESCRIBE_CLUSTER_KEY = 60

# Kafka's DescribeClusterRequest endpoint types.
_BROKER_ENDPOINTS, _CONTROLLER_ENDPOINTS = 1, 2
# Kafka's AclOperation codes the CLUSTER resource supports (AclEntry.supportedOperations):
# ALTER, CREATE, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE.
_CLUSTER_OPERATIONS = frozenset((4, 5, 8, 9, 10, 11, 12))
_NO_UUID = uuid.UUID(int=0)


class AdminApis:
    """The topic and cluster admin APIs over broker ``core`` (a BrokerCore), whose
    brokers and cluster id ``metadata`` (a LocalMetadata) tells."""

    def __init__(self, core, metadata) -> None:
        self.core = core
        self.metadata = metadata

    def apis(self) -> dict:
        return {CREATE_TOPICS_KEY: (2, 7, self.create_topics),
                DELETE_TOPICS_KEY: (1, 6, self.delete_topics),
                CREATE_PARTITIONS_KEY: (0, 3, self.create_partitions),
                DELETE_RECORDS_KEY: (0, 2, self.delete_records),
                DESCRIBE_CLUSTER_KEY: (0, 2, self.describe_cluster),
                DESCRIBE_LOG_DIRS_KEY: (1, 5, self.describe_log_dirs)}

    # -- CreateTopics ------------------------------------------------------------------
    def create_topics(self, request, header, body):
        cls = codec.response_class(CREATE_TOPICS_KEY)
        results, wanted = {}, []
        for name in _repeated([topic.name for topic in body.topics]):
            results[name] = _refused(cls, name, LocalProtocolError(
                f"Create topics request from client `{header.client_id}` contains multiple "
                f"entries for the following topics: {name}"))
        for topic in body.topics:
            if topic.name in results:
                continue
            try:
                fields = self._new_topic(topic)
                if body.validate_only:
                    self._check_new_topic(fields)
                    results[topic.name] = self._created(cls, fields, None)
                else:
                    wanted.append(fields)
            except ShmlogError as error:
                results[topic.name] = _refused(cls, topic.name, error)
        if wanted:
            answer = self.core.topics.create_topics(wanted)
            for fields, entry in zip(wanted, answer["topics"]):
                try:
                    results[fields["name"]] = self._created(cls, fields, decode_entry(entry))
                except ShmlogError as error:
                    results[fields["name"]] = _refused(cls, fields["name"], error)
        return cls(version=header.api_version, throttle_time_ms=0,
                   topics=[results[name] for name in dict.fromkeys(t.name for t in body.topics)])

    def _new_topic(self, topic) -> dict:
        """The topic service's fields of one CreateTopics entry (Kafka's -1s resolved).

        Raises
        ------
        LocalProtocolError
            Replicas placed by hand along with a count or a factor.
        InvalidReplicaAssignmentError
            Replicas placed elsewhere than on this broker alone, or partitions not
            numbered 0 to n-1.
        InvalidConfigError
            A setting without a value.
        """
        partitions, factor = topic.num_partitions, topic.replication_factor
        if topic.assignments:
            if partitions != -1 or factor != -1:
                raise LocalProtocolError("Both numPartitions or replicationFactor and "
                                         "replicasAssignments were set. Both cannot be used "
                                         "at the same time.")
            partitions = _assigned_count(topic.name, topic.assignments, self._broker_id())
            factor = 1
        nulls = sorted(config.name for config in topic.configs if config.value is None)
        if nulls:
            raise InvalidConfigError(f"Null value not supported for topic configs: "
                                     f"{', '.join(nulls)}")
        fields = {"name": topic.name,
                  "partitions": self.core.config.num_partitions if partitions == -1
                  else partitions,
                  "config": {config.name: config.value for config in topic.configs}}
        if factor != -1:
            fields["replication_factor"] = factor
        return fields

    def _check_new_topic(self, fields: dict) -> None:
        """What creating the topic checks, in its order (``topic_service._checked_topic``
        then ``log_manager.create_topic``), creating nothing."""
        name = fields["name"]
        refuse_internal(name, "created")
        factor = fields.get("replication_factor")
        if factor is not None and factor != 1:
            raise InvalidReplicationFactorError(
                f"a single broker keeps one copy of each partition: replication factor "
                f"{factor} cannot be met for topic {name!r:.100} (a cluster can: see shmlog "
                f"cluster)")
        validate_topic_name(name)
        _check_partition_count(fields["partitions"])
        TopicConfig.from_overrides(fields["config"])
        if name in self.core.host.logs.list_topics():
            raise TopicExistsError(f"topic {name!r} already exists")

    def _created(self, cls, fields: dict, described: dict | None):
        """The answer for a topic created (``described``: its description) or that
        would be (validate_only: None)."""
        if described is None:
            config = TopicConfig.from_overrides(fields["config"])
            sources = config_sources(config, self.core.topics.broker_topic_defaults())
            topic_id, partitions = _NO_UUID, fields["partitions"]
        else:
            sources = self.core.topics.describe_topic(fields["name"])["config_sources"]
            topic_id, partitions = uuid.UUID(hex=described["topic_id"]), \
                len(described["partitions"])
        result = cls.CreatableTopicResult
        return result(name=fields["name"], topic_id=topic_id, error_code=E.NONE,
                      error_message=None, num_partitions=partitions, replication_factor=1,
                      configs=[result.CreatableTopicConfigs(
                          name=name, value=value, read_only=False, config_source=source,
                          is_sensitive=False)
                          for name, value, source in topic_config_entries(sources)])

    # -- DeleteTopics ------------------------------------------------------------------
    def delete_topics(self, request, header, body):
        cls = codec.response_class(DELETE_TOPICS_KEY)
        if header.api_version >= 6:
            asked = [(topic.name, topic.topic_id) for topic in body.topics]
        else:
            asked = [(name, None) for name in body.topic_names]
        repeated = set(_repeated([name if name is not None else topic_id
                                  for name, topic_id in asked]))
        results = []
        for name, topic_id in dict.fromkeys(asked):
            key = name if name is not None else topic_id
            results.append(self._deleted(cls, name, topic_id, key in repeated))
        return cls(version=header.api_version, throttle_time_ms=0, responses=results)

    def _deleted(self, cls, name: str | None, topic_id: uuid.UUID | None, repeated: bool):
        code, message = E.NONE, None
        if name is None and topic_id is not None and topic_id != _NO_UUID:
            name = self.metadata.topic_name_of(topic_id.hex)
            if name is None:
                code, message = E.UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id}"
        elif name is not None and topic_id not in (None, _NO_UUID):
            code, message = E.INVALID_REQUEST, "give a topic's name or its id, not both"
        elif name is None:
            code, message = E.INVALID_REQUEST, "a topic to delete needs a name or an id"
        if repeated:
            code, message = E.INVALID_REQUEST, "Duplicate topic in request"
        if code == E.NONE:
            try:
                refuse_internal(name, "deleted")
                described = uuid.UUID(hex=self.core.host.logs.describe_topic(name).topic_id)
                if topic_id not in (None, _NO_UUID, described):
                    # An id seen before the name was deleted and made again: not this topic.
                    raise _UnknownTopicId(f"no topic has the id {topic_id}")
                topic_id = described
                self.core.topics.delete_topic(name)
            except _UnknownTopicId as error:
                code, message = E.UNKNOWN_TOPIC_ID, str(error)
            except ShmlogError as error:
                code, message = E.for_error(error), str(error)
        return cls.DeletableTopicResult(name=name, topic_id=topic_id or _NO_UUID,
                                        error_code=code, error_message=message)

    # -- CreatePartitions --------------------------------------------------------------
    def create_partitions(self, request, header, body):
        cls = codec.response_class(CREATE_PARTITIONS_KEY)
        repeated = set(_repeated([topic.name for topic in body.topics]))
        results = []
        for topic in {topic.name: topic for topic in body.topics}.values():
            try:
                if topic.name in repeated:
                    raise LocalProtocolError(f"Duplicate topic in request: {topic.name}")
                self._grow(topic, body.validate_only)
                code, message = E.NONE, None
            except ShmlogError as error:
                code, message = E.for_error(error), str(error)
            results.append(cls.CreatePartitionsTopicResult(name=topic.name, error_code=code,
                                                            error_message=message))
        return cls(version=header.api_version, throttle_time_ms=0, results=results)

    def _grow(self, topic, validate_only: bool) -> None:
        """Grow one topic as ``topic_service.add_partitions`` does (its checks in its
        order), or with ``validate_only`` only check."""
        refuse_internal(topic.name, "given partitions")
        current = self.core.host.logs.describe_topic(topic.name).partitions
        if topic.assignments is not None:
            _check_new_assignments(topic.name, topic.assignments, topic.count - current,
                                   self._broker_id())
        if not validate_only:
            self.core.topics.add_partitions(topic.name, topic.count)
            return
        _check_partition_count(topic.count)
        if topic.count <= current:
            raise InvalidPartitionsError(f"topic {topic.name!r} has {current} partitions; the "
                                         f"new count must be larger, got {topic.count}")

    # -- DeleteRecords -----------------------------------------------------------------
    def delete_records(self, request, header, body):
        cls = codec.response_class(DELETE_RECORDS_KEY)
        offsets: dict[str, dict[int, int]] = {}
        for topic in body.topics:
            for partition in topic.partitions:
                offsets.setdefault(topic.name, {})[partition.partition_index] = partition.offset
        entries = self.core.topics.delete_records(
            [[name, partition, offset] for name, partitions in offsets.items()
             for partition, offset in partitions.items()])["partitions"]
        topics: dict[str, list] = {}
        result = cls.DeleteRecordsTopicResult
        for entry in entries:
            error = entry["error"]
            topics.setdefault(entry["topic"], []).append(result.DeleteRecordsPartitionResult(
                partition_index=entry["partition"], low_watermark=entry["low_watermark"],
                error_code=E.NONE if error is None else E.for_name(error)))
        return cls(version=header.api_version, throttle_time_ms=0,
                   topics=[result(name=name, partitions=partitions)
                           for name, partitions in topics.items()])

    # -- DescribeCluster ---------------------------------------------------------------
    def describe_cluster(self, request, header, body):
        cls = codec.response_class(DESCRIBE_CLUSTER_KEY)
        endpoint_type = getattr(body, "endpoint_type", _BROKER_ENDPOINTS) \
            if header.api_version >= 1 else _BROKER_ENDPOINTS
        code, message, brokers = E.NONE, None, []
        if endpoint_type == _CONTROLLER_ENDPOINTS:
            code, message = E.MISMATCHED_ENDPOINT_TYPE, \
                "The request was sent to an endpoint of type BROKER, but we wanted an " \
                "endpoint of type CONTROLLER"
        elif endpoint_type != _BROKER_ENDPOINTS:
            code, message = E.UNSUPPORTED_ENDPOINT_TYPE, f"Unknown endpoint type {endpoint_type}"
        else:
            brokers = [cls.DescribeClusterBroker(broker_id=node, host=host, port=port, rack=rack,
                                                 is_fenced=False)
                       for node, host, port, rack in self.metadata.brokers()]
        # None: not asked for (the codec writes Kafka's INT32_MIN).
        operations = set(_CLUSTER_OPERATIONS) if body.include_cluster_authorized_operations \
            else None
        return cls(version=header.api_version, throttle_time_ms=0, error_code=code,
                   error_message=message, endpoint_type=endpoint_type,
                   cluster_id=self.metadata.cluster_id,
                   controller_id=self.metadata.controller_id() if not code else -1,
                   brokers=brokers, authorized_operations=operations)

    # -- DescribeLogDirs ---------------------------------------------------------------
    def describe_log_dirs(self, request, header, body):
        cls = codec.response_class(DESCRIBE_LOG_DIRS_KEY)
        existing = set(self.core.host.logs.list_topics())
        if body.topics is None:
            wanted = None
        else:
            wanted = {}
            for topic in body.topics:
                if topic.topic in existing:
                    wanted.setdefault(topic.topic, set()).update(topic.partitions)
        described = self.core.topics.describe_log_dirs(
            None if wanted is None else sorted(wanted))
        topics: dict[str, list] = {}
        result = cls.DescribeLogDirsResult
        for entry in described["partitions"]:
            if wanted is None or entry["partition"] in wanted[entry["topic"]]:
                topics.setdefault(entry["topic"], []).append(
                    result.DescribeLogDirsTopic.DescribeLogDirsPartition(
                        partition_index=entry["partition"], partition_size=entry["size"],
                        offset_lag=entry["offset_lag"], is_future_key=False))
        total, usable = _disk_space(described["log_dir"])
        return cls(version=header.api_version, throttle_time_ms=0, error_code=E.NONE,
                   results=[result(error_code=E.NONE, log_dir=described["log_dir"],
                                   topics=[result.DescribeLogDirsTopic(name=name,
                                                                       partitions=partitions)
                                           for name, partitions in topics.items()],
                                   total_bytes=total, usable_bytes=usable, is_cordoned=False)])

    def _broker_id(self) -> int:
        return self.metadata.brokers()[0][0]


class _UnknownTopicId(Exception):
    """A topic id that names no topic here (stays inside this module: DeleteTopics
    answers it UNKNOWN_TOPIC_ID)."""


def _repeated(names: list) -> list:
    """The names given more than once, in their first order."""
    return [name for name, count in Counter(names).items() if count > 1]


def _refused(cls, name: str, error: ShmlogError):
    """A CreateTopics answer refusing topic ``name`` with ``error``."""
    return cls.CreatableTopicResult(name=name, topic_id=_NO_UUID, error_code=E.for_error(error),
                                    error_message=str(error), num_partitions=-1,
                                    replication_factor=-1, configs=None)


def _check_partition_count(count: int) -> None:
    """``log_manager``'s check of a partition count (its message)."""
    if not 1 <= count <= limits.PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(f"partition count must be an integer in "
                                     f"[1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {count!r}")


def _assigned_count(name: str, assignments, broker_id: int) -> int:
    """The partition count of replicas placed by hand, when each partition (numbered
    0 to n-1) is on this broker alone.

    Raises
    ------
    InvalidReplicaAssignmentError
        Another broker, several replicas, or partitions not numbered 0 to n-1.
    """
    indexes = sorted(assignment.partition_index for assignment in assignments)
    if indexes != list(range(len(indexes))):
        raise InvalidReplicaAssignmentError(
            f"topic {name!r}: partitions {indexes} are not numbered 0 to {len(indexes) - 1}")
    for assignment in assignments:
        if list(assignment.broker_ids) != [broker_id]:
            raise InvalidReplicaAssignmentError(
                f"topic {name!r}: partition {assignment.partition_index} is placed on brokers "
                f"{list(assignment.broker_ids)}; this broker ({broker_id}) is the only one")
    return len(indexes)


def _check_new_assignments(name: str, assignments, added: int, broker_id: int) -> None:
    """CreatePartitions' replicas placed by hand: one per new partition, each on this
    broker alone.

    Raises
    ------
    InvalidReplicaAssignmentError
        Another broker, several replicas, or not one assignment per new partition.
    """
    if added > 0 and len(assignments) != added:
        raise InvalidReplicaAssignmentError(
            f"Increasing the number of partitions by {added} but {len(assignments)} "
            f"assignments provided (topic {name!r})")
    for index, assignment in enumerate(assignments):
        if list(assignment.broker_ids) != [broker_id]:
            raise InvalidReplicaAssignmentError(
                f"topic {name!r}: new partition {index} is placed on brokers "
                f"{list(assignment.broker_ids)}; this broker ({broker_id}) is the only one")


def _disk_space(directory: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding ``directory`` (-1s, Kafka's
    unknown, when it cannot be read)."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return -1, -1
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
