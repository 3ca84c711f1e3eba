"""Kafka's admin APIs over shmlog's topic service: CreateTopics (2-7), DeleteTopics
(1-5), CreatePartitions (0-3), DeleteRecords (0-2) and DescribeCluster (0-1).

Rules
-----
* Each operation is the one ``shmlog topics`` and ``Admin`` run (the broker's topic
  service, with its checks; a cluster member's writes ZooKeeper and answers once the
  change is seen), so the wire and shmlog's tools agree. A refusal is the topic's (or
  partition's) Kafka error code with shmlog's message where the version carries one.
* CreateTopics: -1 partitions or replication factor take the broker's defaults
  (``num_partitions``, a cluster's ``default.replication.factor``); configs are
  Kafka's names; ``validate_only`` checks the name, the counts and the configs and
  creates nothing. A manual replica assignment is refused
  (INVALID_REPLICA_ASSIGNMENT): place replicas with ``shmlog cluster reassign``.
* Internal topics are refused as shmlog refuses them (create, delete, grow, delete
  records).
* Responses wait for every item of the request; an item the service answers later
  (a cluster's) holds the response until it comes.
"""

from __future__ import annotations

import uuid

from ..common.errors import ShmlogError, TopicExistsError
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.topic_names import validate_topic_name
from ..storage import delete_records as deletion
from ..storage.topic_config import TopicConfig
from . import codec
from .error_codes import (
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
    for_error,
)
from .tickets import Gather, ask_service

__all__ = ["AdminApis"]

CREATE_TOPICS_KEY = 19
DELETE_TOPICS_KEY = 20
DELETE_RECORDS_KEY = 21
CREATE_PARTITIONS_KEY = 37
DESCRIBE_CLUSTER_KEY = 60


class AdminApis:
    """The admin APIs on broker ``core``; ``metadata`` gives the brokers (a
    LocalMetadata or ClusterMetadata); ``respond`` sends a held response."""

    def __init__(self, core, metadata, respond) -> None:
        self.core = core
        self.metadata = metadata
        self._respond = respond

    def apis(self) -> dict:
        return {CREATE_TOPICS_KEY: (2, 7, self.create_topics),
                DELETE_TOPICS_KEY: (1, 5, self.delete_topics),
                DELETE_RECORDS_KEY: (0, 2, self.delete_records),
                CREATE_PARTITIONS_KEY: (0, 3, self.create_partitions),
                DESCRIBE_CLUSTER_KEY: (0, 1, self.describe_cluster)}

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
        topics = list(body.topics)

        def complete(results):
            answers = []
            for index, topic in enumerate(topics):
                error, message = self._error(results[index])
                described = results[index] if isinstance(results[index], dict) else {}
                topic_id = described.get("topic_id")
                answers.append(cls.CreatableTopicResult(
                    name=topic.name, topic_id=uuid.UUID(hex=topic_id) if topic_id else
                    uuid.UUID(int=0), error_code=error, error_message=message,
                    topic_config_error_code=NONE,
                    num_partitions=len(described.get("partitions", ())) or -1,
                    replication_factor=-1, configs=[]))
            return cls(version=header.api_version, throttle_time_ms=0, topics=answers)

        gather = Gather(len(topics), complete,
                         lambda response: self._respond(request, header, response))
        for index, topic in enumerate(topics):
            config = {entry.name: entry.value for entry in topic.configs}
            partitions = topic.num_partitions if topic.num_partitions != -1 else \
                self.core.config.num_partitions                   # -1: the broker's
            factor = topic.replication_factor if topic.replication_factor != -1 else None
            refusal = self._creation_refusal(topic, partitions, config)
            if refusal is not None:
                gather.put(index, refusal)
            elif getattr(body, "validate_only", False):
                gather.put(index, {})
            else:
                self._ask(gather, index, self.core.topics.create_topic, name=topic.name,
                          partitions=partitions, config=config, replication_factor=factor)
        return gather.outcome()

    def _creation_refusal(self, topic, partitions: int, config: dict):
        """Why ``topic`` cannot be created (a ShmlogError or (code, message)), checked
        before anything is written; None when it can."""
        if topic.assignments:
            return (INVALID_REPLICA_ASSIGNMENT,
                    "shmlog places replicas itself; move them with shmlog cluster reassign")
        if topic.name in INTERNAL_TOPICS:
            return INVALID_TOPIC_EXCEPTION, f"{topic.name!r} is an internal topic"
        if partitions < 1:
            return INVALID_PARTITIONS, f"a topic needs at least one partition, got {partitions}"
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
        names = list(body.topic_names)

        def complete(results):
            answers = []
            for index, name in enumerate(names):
                error, message = self._error(results[index])
                answers.append(cls.DeletableTopicResult(name=name, error_code=error,
                                                        error_message=message))
            return cls(version=header.api_version, throttle_time_ms=0, responses=answers)

        gather = Gather(len(names), complete,
                         lambda response: self._respond(request, header, response))
        for index, name in enumerate(names):
            self._ask(gather, index, self.core.topics.delete_topic, name=name)
        return gather.outcome()

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
        return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                   error_message=None, endpoint_type=1, cluster_id=self.metadata.cluster_id,
                   controller_id=self.metadata.controller_id(),
                   brokers=[cls.DescribeClusterBroker(broker_id=node, host=host, port=port,
                                                      rack=rack)
                            for node, host, port, rack in
                            self.metadata.brokers(request.listener)])

