"""Kafka's admin APIs over shmlog's topic service: CreateTopics (2-7), DeleteTopics
(1-6), CreatePartitions (0-3), DeleteRecords (0-2), DescribeCluster (0-2) and
DescribeLogDirs (1-5). The config APIs are in ``config_apis``.

Rules
-----
* Each operation is the one ``shmlog topics`` and ``Admin`` run (the broker's topic
  service, with its checks; a cluster member's writes ZooKeeper and answers once the
  change is seen), so the wire and shmlog's tools agree. A refusal is the topic's (or
  partition's) Kafka error code with shmlog's message where the version carries one.
* CreateTopics: a name given twice in one request is INVALID_REQUEST, answered once
  (Kafka's rule); -1 partitions or replication factor take the broker's defaults
  (``num_partitions``, a cluster's ``default.replication.factor``); configs are
  Kafka's names; ``validate_only`` checks the name, the counts and the configs and
  creates nothing. A manual replica assignment is refused
  (INVALID_REPLICA_ASSIGNMENT): place replicas with ``shmlog cluster reassign``.
* Internal topics are refused as shmlog refuses them (create, delete, grow, delete
  records).
* DeleteTopics v6 names topics by name or by id: an id no topic has now (one seen
  before its topic was deleted and made again included) is UNKNOWN_TOPIC_ID.
* DescribeCluster lists the brokers Metadata lists; a request for the controllers'
  endpoints (v1+, endpoint type 2) is MISMATCHED_ENDPOINT_TYPE, as a Kafka broker
  answers. With no authorizer, the authorized operations asked for are all the
  cluster resource has (Kafka's answer without an authorizer).
* DescribeLogDirs answers for this broker's one log directory: the partitions it
  hosts of those asked (all when the request names none), with their bytes and
  offset lag, and v4+ the file system's total and usable bytes.
* Responses wait for every item of the request; an item the service answers later
  (a cluster's) holds the response until it comes.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter

from ..common import limits
from ..common.errors import ShmlogError, TopicExistsError
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.topic_names import validate_topic_name
from ..storage import delete_records as deletion
from ..storage.topic_config import TopicConfig, config_sources
from . import codec
from .config_apis import topic_config_entries
from .error_codes import (
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    MISMATCHED_ENDPOINT_TYPE,
    NONE,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_ENDPOINT_TYPE,
    for_error,
)
from .tickets import Gather, ask_service

__all__ = ["AdminApis"]

CREATE_TOPICS_KEY = 19
DELETE_TOPICS_KEY = 20
DELETE_RECORDS_KEY = 21
CREATE_PARTITIONS_KEY = 37
DESCRIBE_LOG_DIRS_KEY = 35
DESCRIBE_CLUSTER_KEY = 60
# Kafka's DescribeClusterRequest endpoint types.
_BROKER_ENDPOINTS, _CONTROLLER_ENDPOINTS = 1, 2
# Kafka's AclOperation codes the CLUSTER resource supports (AclEntry.supportedOperations):
# ALTER, CREATE, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE.
_CLUSTER_OPERATIONS = frozenset((4, 5, 8, 9, 10, 11, 12))
_NO_UUID = uuid.UUID(int=0)


class AdminApis:
    """The admin APIs on broker ``core``; ``metadata`` gives the brokers (a
    LocalMetadata or ClusterMetadata); ``respond`` sends a held response."""

    def __init__(self, core, metadata, respond) -> None:
        self.core = core
        self.metadata = metadata
        self._respond = respond

    def apis(self) -> dict:
        return {CREATE_TOPICS_KEY: (2, 7, self.create_topics),
                DELETE_TOPICS_KEY: (1, 6, self.delete_topics),
                DELETE_RECORDS_KEY: (0, 2, self.delete_records),
                CREATE_PARTITIONS_KEY: (0, 3, self.create_partitions),
                DESCRIBE_CLUSTER_KEY: (0, 2, self.describe_cluster),
                DESCRIBE_LOG_DIRS_KEY: (1, 5, self.describe_log_dirs)}

    def _ask(self, gather: Gather, index: int, handler, **fields) -> None:
        """One item through a topic service handler, its result into ``gather``."""
        try:
            result = ask_service(self.core, handler, lambda later: gather.put(index, later),
                                 **fields)
        except ShmlogError as refused:
            gather.put(index, refused)
            return
        if result is not None:
            gather.put(index, result)

    @staticmethod
    def _error(result) -> tuple[int, str | None]:
        """(Kafka error code, message) of an item's result: a reply (dict), a
        ShmlogError, or a (code, message) refused here."""
        if isinstance(result, ShmlogError):
            return for_error(result), str(result)
        if isinstance(result, tuple):
            return result
        return NONE, None

    # -- CreateTopics --------------------------------------------------------------------
    def create_topics(self, request, header, body):
        cls = codec.response_class(CREATE_TOPICS_KEY)
        counts = Counter(topic.name for topic in body.topics)
        topics = list({topic.name: topic for topic in body.topics}.values())   # each once

        def complete(results):
            return cls(version=header.api_version, throttle_time_ms=0, topics=[
                self._created(cls.CreatableTopicResult, topic, results[index])
                for index, topic in enumerate(topics)])

        gather = Gather(len(topics), complete,
                         lambda response: self._respond(request, header, response))
        for index, topic in enumerate(topics):
            config = {entry.name: entry.value for entry in topic.configs}
            partitions = topic.num_partitions if topic.num_partitions != -1 else \
                self.core.config.num_partitions                   # -1: the broker's
            factor = topic.replication_factor if topic.replication_factor != -1 else None
            refusal = self._creation_refusal(topic, partitions, factor, config) \
                if counts[topic.name] == 1 else (INVALID_REQUEST, "Duplicate topic in request")
            if refusal is not None:
                gather.put(index, refusal)
            elif getattr(body, "validate_only", False):
                gather.put(index, {"partitions": partitions, "factor": factor or 1,
                                   "config": config})
            else:
                self._ask(gather, index, self.core.topics.create_topic, name=topic.name,
                          partitions=partitions, config=config, replication_factor=factor)
        return gather.outcome()

    def _created(self, result, topic, outcome):
        """The answer for one topic: created (``outcome`` its description), one that
        would be (validate_only: the counts and settings it would have), or refused."""
        error, message = self._error(outcome)
        if error != NONE:
            return result(name=topic.name, topic_id=_NO_UUID, error_code=error,
                          error_message=message, topic_config_error_code=NONE,
                          num_partitions=-1, replication_factor=-1, configs=None)
        if "topic_id" in outcome:
            sources = self.core.topics.describe_topic(topic.name)["config_sources"]
            replicas = outcome["partitions"][0].get("replicas", [self.metadata.broker_id])
            topic_id, partitions, factor = uuid.UUID(hex=outcome["topic_id"]), \
                len(outcome["partitions"]), len(replicas)
        else:
            sources = config_sources(TopicConfig.from_overrides(outcome["config"]),
                                     self.core.topics.broker_topic_defaults())
            topic_id, partitions, factor = _NO_UUID, outcome["partitions"], outcome["factor"]
        return result(name=topic.name, topic_id=topic_id, error_code=NONE, error_message=None,
                      topic_config_error_code=NONE, num_partitions=partitions,
                      replication_factor=factor,
                      configs=[result.CreatableTopicConfigs(
                          name=name, value=value, read_only=False, config_source=source,
                          is_sensitive=False)
                          for name, value, source in topic_config_entries(sources)])

    def _creation_refusal(self, topic, partitions: int, factor: int | None, config: dict):
        """Why ``topic`` cannot be created (a ShmlogError or (code, message)), checked
        before anything is written; None when it can."""
        if topic.assignments:
            return (INVALID_REPLICA_ASSIGNMENT,
                    "shmlog places replicas itself; move them with shmlog cluster reassign")
        if topic.name in INTERNAL_TOPICS:
            return INVALID_TOPIC_EXCEPTION, f"{topic.name!r} is an internal topic"
        if not 1 <= partitions <= limits.PARTITIONS_PER_TOPIC_MAX:
            return INVALID_PARTITIONS, (f"partition count must be an integer in "
                                        f"[1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {partitions}")
        brokers = len(self.metadata.brokers())
        if factor is not None and not 1 <= factor <= brokers:
            return INVALID_REPLICATION_FACTOR, (
                f"replication factor {factor} cannot be met for topic {topic.name!r:.100}: "
                f"{brokers} broker(s) can hold a copy")
        try:
            validate_topic_name(topic.name)
            TopicConfig.from_overrides(config)
            if self.metadata.topic(topic.name) is not None:
                raise TopicExistsError(f"topic {topic.name!r} already exists")
        except ShmlogError as refused:
            return refused
        return None

    # -- DeleteTopics --------------------------------------------------------------------
    def delete_topics(self, request, header, body):
        cls = codec.response_class(DELETE_TOPICS_KEY)
        asked = [(topic.name, topic.topic_id) for topic in body.topics] \
            if header.api_version >= 6 else [(name, None) for name in body.topic_names]
        named = [self._name_of(name, topic_id) for name, topic_id in asked]

        def complete(results):
            answers = []
            for index, (name, topic_id) in enumerate(named):
                error, message = self._error(results[index])
                answers.append(cls.DeletableTopicResult(
                    name=name, topic_id=topic_id or _NO_UUID, error_code=error,
                    error_message=message))
            return cls(version=header.api_version, throttle_time_ms=0, responses=answers)

        gather = Gather(len(named), complete,
                        lambda response: self._respond(request, header, response))
        for index, (name, topic_id) in enumerate(named):
            if name is None:
                gather.put(index, (UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id}"))
            else:
                self._ask(gather, index, self.core.topics.delete_topic, name=name)
        return gather.outcome()

    def _name_of(self, name: str | None, topic_id: uuid.UUID | None):
        """(name, id) of a topic DeleteTopics names by name or (v6) by id; the name
        is None when no topic has that id now."""
        if topic_id is None or topic_id == _NO_UUID:
            return name, None
        found = self.metadata.topic_name_of(topic_id.hex)
        described = self.metadata.topic(found) if found is not None else None
        if described is None or described[0] != topic_id.hex:
            return None, topic_id          # gone, or its name is another topic's now
        return found, topic_id

    # -- CreatePartitions ----------------------------------------------------------------
    def create_partitions(self, request, header, body):
        cls = codec.response_class(CREATE_PARTITIONS_KEY)
        topics = list(body.topics)

        def complete(results):
            answers = []
            for index, topic in enumerate(topics):
                error, message = self._error(results[index])
                answers.append(cls.CreatePartitionsTopicResult(
                    name=topic.name, error_code=error, error_message=message))
            return cls(version=header.api_version, throttle_time_ms=0, results=answers)

        gather = Gather(len(topics), complete,
                         lambda response: self._respond(request, header, response))
        for index, topic in enumerate(topics):
            if topic.assignments:
                gather.put(index, (INVALID_REPLICA_ASSIGNMENT, "shmlog places replicas itself"))
            elif body.validate_only:
                described = self.metadata.topic(topic.name)
                grows = described is not None and topic.count > len(described[2])
                gather.put(index, {} if grows else
                           (INVALID_PARTITIONS, f"{topic.name!r} cannot grow to {topic.count}"))
            else:
                self._ask(gather, index, self.core.topics.add_partitions, name=topic.name,
                          total=topic.count)
        return gather.outcome()

    # -- DeleteRecords -------------------------------------------------------------------
    def delete_records(self, request, header, body):
        cls = codec.response_class(DELETE_RECORDS_KEY)
        topic_class = cls.DeleteRecordsTopicResult
        asked = [(topic.name, partition.partition_index, partition.offset)
                 for topic in body.topics for partition in topic.partitions]

        def complete(results):
            outcome = results[0]
            found = {}
            if isinstance(outcome, dict):
                for entry in outcome["partitions"]:
                    found[(entry["topic"], entry["partition"])] = entry
            answers: dict[str, list] = {}
            for topic, partition, _ in asked:
                entry = found.get((topic, partition))
                if isinstance(outcome, ShmlogError):
                    code, low = for_error(outcome), -1
                elif entry is None:
                    code, low = UNKNOWN_TOPIC_OR_PARTITION, -1
                elif (error := deletion.partition_error(entry)) is not None:
                    code, low = for_error(error), -1
                else:
                    code, low = NONE, entry["low_watermark"]
                answers.setdefault(topic, []).append(
                    topic_class.DeleteRecordsPartitionResult(partition_index=partition,
                                                             low_watermark=low, error_code=code))
            return cls(version=header.api_version, throttle_time_ms=0, topics=[
                topic_class(name=name, partitions=partitions)
                for name, partitions in answers.items()])

        gather = Gather(1, complete, lambda response: self._respond(request, header, response))
        self._ask(gather, 0, self.core.topics.delete_records,
                  partitions=[list(entry) for entry in asked])
        return gather.outcome()

    # -- DescribeCluster -----------------------------------------------------------------
    def describe_cluster(self, request, header, body):
        cls = codec.response_class(DESCRIBE_CLUSTER_KEY)
        endpoint_type = getattr(body, "endpoint_type", _BROKER_ENDPOINTS) \
            if header.api_version >= 1 else _BROKER_ENDPOINTS
        code, message, brokers = NONE, None, []
        if endpoint_type == _CONTROLLER_ENDPOINTS:
            code, message = MISMATCHED_ENDPOINT_TYPE, \
                "The request was sent to an endpoint of type BROKER, but we wanted an " \
                "endpoint of type CONTROLLER"
        elif endpoint_type != _BROKER_ENDPOINTS:
            code, message = UNSUPPORTED_ENDPOINT_TYPE, f"Unknown endpoint type {endpoint_type}"
        else:
            brokers = [cls.DescribeClusterBroker(broker_id=node, host=host, port=port,
                                                 rack=rack, is_fenced=False)
                       for node, host, port, rack in self.metadata.brokers(request.listener)]
        # None: not asked for (the codec writes Kafka's INT32_MIN).
        operations = set(_CLUSTER_OPERATIONS) \
            if body.include_cluster_authorized_operations else None
        return cls(version=header.api_version, throttle_time_ms=0, error_code=code,
                   error_message=message, endpoint_type=endpoint_type,
                   cluster_id=self.metadata.cluster_id,
                   controller_id=self.metadata.controller_id() if not code else -1,
                   brokers=brokers, authorized_operations=operations)

    # -- DescribeLogDirs -----------------------------------------------------------------
    def describe_log_dirs(self, request, header, body):
        cls = codec.response_class(DESCRIBE_LOG_DIRS_KEY)
        hosted = set(self.core.host.logs.list_topics())
        wanted = None if body.topics is None else {}
        for topic in body.topics or ():
            if topic.topic in hosted:
                wanted.setdefault(topic.topic, set()).update(topic.partitions)
        described = self.core.topics.describe_log_dirs(
            None if wanted is None else sorted(wanted))
        result = cls.DescribeLogDirsResult
        topics: dict[str, list] = {}
        for entry in described["partitions"]:
            if wanted is None or entry["partition"] in wanted[entry["topic"]]:
                topics.setdefault(entry["topic"], []).append(
                    result.DescribeLogDirsTopic.DescribeLogDirsPartition(
                        partition_index=entry["partition"], partition_size=entry["size"],
                        offset_lag=entry["offset_lag"], is_future_key=False))
        total, usable = _disk_space(described["log_dir"])
        return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                   results=[result(error_code=NONE, log_dir=described["log_dir"],
                                   topics=[result.DescribeLogDirsTopic(name=name,
                                                                       partitions=partitions)
                                           for name, partitions in topics.items()],
                                   total_bytes=total, usable_bytes=usable, is_cordoned=False)])


def _disk_space(directory: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding ``directory`` (-1s, Kafka's
    unknown, when it cannot be read)."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return -1, -1
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
