"""Making a cluster's internal topic (``__consumer_offsets``, ``__transaction_state``)
the first time a coordinator needs it, as Kafka's brokers do.

Rules
-----
* The topic is written to ZooKeeper like any other (the controller then elects its
  leaders), on a thread of its own, never the loop's, and once at a time.
* Its replicas are placed as a topic's are (``metadata.assign_replicas``, rack aware).
  While fewer brokers are live than its replication factor it is not made (Kafka 2.8
  does the same: nothing is capped), and the coordinators' clients hear
  ``CoordinatorNotAvailableError`` meanwhile.
* Another broker making it first is no error.
"""

from __future__ import annotations

import logging
import threading

from ..common.errors import TopicExistsError
from .metadata import assign_replicas
from .replication.replica_service import ReplicaService
from .zk.paths import TopicAssignment, new_topic_id

log = logging.getLogger("shmlog.broker")

__all__ = ["InternalTopic"]


class InternalTopic:
    """One internal topic of the cluster, made on first use (see the module's rules).

    Parameters
    ----------
    replication : ReplicaService
        The cluster view and the ZooKeeper session.
    name : str
    partitions, replication_factor : int
    config : dict
        Its topic config (compacted, and so on).
    """

    def __init__(self, replication: ReplicaService, name: str, partitions: int,
                 replication_factor: int, config: dict):
        self.replication = replication
        self.name = name
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.config = {key: str(value) for key, value in config.items()}
        self._creating = threading.Event()

    def partition_count(self) -> int | None:
        """Its partitions in this broker's view; None when it does not exist yet (its
        making is then started)."""
        assignment = self.replication.view.topics.get(self.name)
        if assignment is None:
            self.create()
            return None
        return len(assignment.partitions)

    def create(self) -> None:
        """Write the topic to ZooKeeper on a thread of its own, unless that is under
        way or too few brokers are live."""
        if self._creating.is_set():
            return
        view = self.replication.view
        if len(view.brokers) < self.replication_factor:
            log.warning("%s not created: %d live brokers, its replication factor is %d",
                        self.name, len(view.brokers), self.replication_factor)
            return
        racks = {broker_id: broker.registration.rack for broker_id, broker in view.brokers.items()}
        topic = TopicAssignment(self.name, new_topic_id(), {
            partition: tuple(replicas) for partition, replicas in
            assign_replicas(racks, self.partitions, self.replication_factor).items()})
        self._creating.set()
        threading.Thread(target=self._create, args=(topic,), daemon=True,
                         name=f"shmlog-create{self.name}").start()

    def _create(self, topic: TopicAssignment) -> None:
        try:
            self.replication.zookeeper.create_topic(topic, self.config)
            log.info("created %s (%d partitions)", self.name, len(topic.partitions))
        except TopicExistsError:
            pass                                  # another broker made it first
        except Exception as error:                # kazoo's own too: the next request retries
            log.warning("creating %s failed: %r", self.name, error)
        finally:
            self._creating.clear()
