"""The topic requests of a cluster member: topics are made and deleted in ZooKeeper,
and metadata says who leads each partition.

Rules
-----
* ``create_topic`` assigns replicas over the live brokers (``cluster_metadata.
  assign_replicas``: Kafka's round-robin, rack-aware when brokers have racks) and
  writes the assignment and config in one ZooKeeper transaction, with a new
  cluster-wide topic id. It answers once this broker hosts the topic and every
  partition has a state (a leader elected by the controller), so a client can
  produce at once; or with an error after ``limits.CLUSTER_TOPIC_WAIT_MS``.
* ``delete_topic`` marks the topic in ``/admin/delete_topics`` (the controller
  deletes it); it answers once marked, as Kafka does.
* ``alter_topic_config`` writes the topic's config znode; every broker takes it
  from its watch. An internal topic's change that could drop commits is refused
  first (``topic_service.refuse_internal_config``), nothing written.
* ZooKeeper is never called on the loop thread: each write runs on the service's
  worker thread, and its outcome comes back through the loop.
* **While the ZooKeeper session is suspended** (ZooKeeper out of reach) a metadata
  request (create, delete, alter config) is refused at once with
  :class:`MetadataUnavailableError`, nothing written: kazoo would queue the write
  and send it when ZooKeeper is back, so a request refused on a timeout would
  take effect later. The worker looks again just before it writes. If the
  connection goes while a write is queued or sent (that narrow window), the
  request is answered within ``limits.CLUSTER_TOPIC_WRITE_WAIT_MS`` with
  :class:`ZooKeeperConnectionError`, which says the outcome is unknown (it may
  still take effect: describe the topic before retrying); the requests queued
  behind it that were answered meanwhile are dropped unwritten.
* ``delete_records`` is carried out by each partition's leader
  (``cluster_delete_records``).
* Metadata gives each partition its leader (-1: none), leader epoch, replicas,
  ISR and this broker's role, and the live brokers.

Theory of operation
-------------------
The handlers check what the client sent, then hand the ZooKeeper write to a worker
thread and hold the reply (the ticket of :class:`~shmlog.broker.service.RequestContext`).
:meth:`ClusterTopicService.tick` collects the writes' outcomes and answers each
held request when what it waits for is true.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable

from ..broker.service import RequestContext
from ..broker.topic_service import (
    TopicService,
    delete_records_entries,
    refuse_internal,
    refuse_internal_config,
)
from ..common import limits
from ..common.errors import (
    BrokerNotAvailableError,
    InvalidPartitionsError,
    MetadataUnavailableError,
    ShmlogError,
    ZooKeeperConnectionError,
)
from ..common.topic_names import validate_topic_name
from ..protocol.control import require
from ..record.records import now_ms
from ..storage.topic_config import TopicConfig
from .delete_records import ClusterDeleteRecords
from .metadata import assign_replicas
from .replication.replica_service import ReplicaService
from .zk.paths import TopicAssignment, new_topic_id

__all__ = ["ClusterTopicService"]


@dataclasses.dataclass
class _Held:
    """A request answered later: when ``ready()`` is true (after its write)."""
    ticket: Any
    deadline: int
    ready: Callable[[], dict | None]
    # When its write must have been answered by ZooKeeper (see the module's rules).
    write_deadline: int = 0
    written: bool = False
    # Answered before its write was made (the worker then skips it); set on the
    # loop thread, read on the worker's.
    answered: bool = False


class ClusterTopicService(TopicService):
    """Topic requests in a cluster (see the module's rules).

    Parameters
    ----------
    replication : ReplicaService
        This broker's view of the cluster and its ZooKeeper session.
    context : RequestContext
        Who sent the request being handled.
    """

    def __init__(self, host, prefix: str, replication: ReplicaService, context: RequestContext):
        super().__init__(host, prefix)
        self.replication = replication
        self.context = context
        self._held: dict[Any, _Held] = {}
        self._next_look = 0
        self._replies: list = []
        self.deletes = ClusterDeleteRecords(replication)
        self._outcomes: queue.SimpleQueue = queue.SimpleQueue()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name="shmlog-topic-admin", daemon=True)
        self._worker.start()

    def handlers(self) -> dict:
        """A single broker's requests but ``create_topics``: here every topic is
        created through ZooKeeper and answered when its replicas are up
        (:meth:`create_topic`); a client asking for several gets
        ``UnsupportedRequestError`` and asks per topic."""
        handlers = super().handlers()
        del handlers["create_topics"]
        return handlers

    # -- requests -----------------------------------------------------------------------
    def create_topic(self, name, partitions: int = 1, config: dict | None = None,
                     replication_factor: int | None = None) -> dict | None:
        refuse_internal(name, "created")
        validate_topic_name(require(name, str, "name"))
        config = {key: str(value) for key, value in require(config or {}, dict, "config").items()}
        TopicConfig.from_overrides(config)                     # refused now, not by every broker
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise InvalidPartitionsError(
                f"a topic needs at least one partition, got {partitions!r}")
        factor = self.replication.config.default_replication_factor \
            if replication_factor is None else require(replication_factor, int,
                                                       "replication_factor")
        racks = {broker_id: broker.registration.rack
                 for broker_id, broker in self.replication.view.brokers.items()}
        assignment = assign_replicas(racks, partitions, factor)
        topic = TopicAssignment(name, new_topic_id(),
                                {partition: tuple(replicas)
                                 for partition, replicas in assignment.items()})
        zookeeper = self.replication.zookeeper
        return self._hold(lambda: zookeeper.create_topic(topic, config),
                          lambda: self._created(name, topic.topic_id))

    def _created(self, name: str, topic_id: str) -> dict | None:
        replicas = [replica for (topic, _), replica in self.replication.replicas.items()
                    if topic == name]
        if not replicas or self.host.logs.describe_topic(name).topic_id != topic_id or \
                any(replica.state is None for replica in replicas):
            return None
        return self._topic(name)

    def delete_topic(self, name) -> dict | None:
        refuse_internal(name, "deleted")
        require(name, str, "name")
        self.host.logs.describe_topic(name)                   # UnknownTopicOrPartitionError
        zookeeper = self.replication.zookeeper
        return self._hold(lambda: zookeeper.mark_topic_deleted(name), lambda: {})

    def add_partitions(self, name, total) -> dict:
        raise InvalidPartitionsError("adding partitions to a replicated topic is not "
                                     "supported yet: create a topic with more partitions")

    def alter_topic_config(self, name, set: dict | None = None,
                           delete: list | None = None) -> dict | None:
        metadata = self.host.logs.describe_topic(require(name, str, "name"))
        config = dict(self.replication.view.configs.get(name, {}))
        config.update({key: str(value) for key, value in require(set or {}, dict, "set").items()})
        for key in require(delete or [], list, "delete"):
            config.pop(key, None)
        TopicConfig.from_overrides(config)
        refuse_internal_config(metadata.name, config, set or {})
        zookeeper = self.replication.zookeeper
        return self._hold(lambda: zookeeper.set_topic_config(metadata.name, config),
                          lambda: self._configured(metadata.name, config))

    def topic_overrides(self, name: str) -> list[str]:
        """The topic's config znode's settings: every override as set, a value equal
        to Kafka's default too (it wins over the broker's setting)."""
        return list(self.replication.view.configs.get(name, {}))

    def broker_topic_defaults(self) -> dict:
        """``min.insync.replicas`` from the broker's cluster settings when they set
        one other than Kafka's default, for topics without an override
        (``replica_service`` applies it so)."""
        value = self.replication.config.min_insync_replicas
        return {} if value == TopicConfig().min_insync_replicas else \
            {"min.insync.replicas": value}

    def delete_records(self, partitions) -> dict | None:
        """Kafka's DeleteRecords: each partition's leader deletes
        (``cluster_delete_records``); held while leaders elsewhere answer."""
        return self.deletes.handle(self.context.ticket, delete_records_entries(partitions))

    def _configured(self, name: str, config: dict) -> dict | None:
        return self._topic(name) if self.replication.view.configs.get(name) == config else None

    def _topic(self, name: str) -> dict:
        described = super()._topic(name)
        view = self.replication.view
        for entry in described["partitions"]:
            replica = self.replication.replicas.get((name, entry["partition"]))
            state = view.state(name, entry["partition"])
            entry.update({
                "leader": -1 if state is None else state[0].leader,
                "leader_epoch": -1 if state is None else state[0].leader_epoch,
                "replicas": list(view.replicas(name, entry["partition"])),
                "isr": [] if state is None else list(state[0].isr),
                "role": "none" if replica is None else replica.role.value})
        described["overrides"] = dict(view.configs.get(name, {}))
        described["live_brokers"] = sorted(view.brokers)
        return described

    def metadata(self, topics: list | None = None) -> dict:
        reply = super().metadata(topics)
        brokers = self.replication.view.brokers.items()
        reply["brokers"] = {
            str(broker_id): {"host": broker.registration.host,
                             "replication": broker.registration.replication_endpoint,
                             "rack": broker.registration.rack}
            for broker_id, broker in brokers}
        reply["broker_id"] = self.replication.broker_id
        return reply

    # -- held replies ---------------------------------------------------------------------
    def _hold(self, write: Callable[[], Any], ready: Callable[[], dict | None]) -> None:
        self._refuse_if_suspended()
        ticket = self.context.ticket
        now = now_ms()
        held = _Held(ticket, now + limits.CLUSTER_TOPIC_WAIT_MS, ready,
                     write_deadline=now + limits.CLUSTER_TOPIC_WRITE_WAIT_MS)
        self._held[ticket] = held
        self._next_look = 0
        self._work.put((held, write))
        return None

    def _refuse_if_suspended(self) -> None:
        if self.replication.zookeeper.suspended.is_set():
            raise MetadataUnavailableError(
                f"broker {self.replication.broker_id} cannot reach ZooKeeper "
                f"({self.replication.zookeeper.hosts}) now, so metadata cannot change: "
                f"nothing was written; retry once ZooKeeper answers (producing and "
                f"fetching go on meanwhile)")

    def _run(self) -> None:
        """The worker: one ZooKeeper write at a time, its outcome queued back."""
        while True:
            held, write = self._work.get()
            if held is None:
                return
            ticket = held.ticket
            if held.answered:
                continue                       # answered "outcome unknown": never written
            try:
                self._refuse_if_suspended()
                write()
                outcome = None
            except ShmlogError as error:
                outcome = error
            except Exception as error:                 # kazoo's own, say: never lose a reply
                outcome = BrokerNotAvailableError(f"ZooKeeper write failed: {error!r}")
            self._outcomes.put((ticket, outcome))
            self.host.table.appender_doorbell.ring()

    def next_deadline(self) -> int | None:
        """While replies are held: now when a write's outcome is queued, else the next
        look (what a held reply waits for comes from ZooKeeper's watches, which the
        replica service applies every turn)."""
        if not self._held:
            return None
        return 0 if not self._outcomes.empty() else self._next_look

    def tick(self, now: int) -> None:
        self._next_look = now + limits.HELD_REPLY_LOOK_MS
        while not self._outcomes.empty():
            ticket, outcome = self._outcomes.get_nowait()
            held = self._held.get(ticket)
            if held is None:
                continue
            if outcome is not None:
                del self._held[ticket]
                self._replies.append((ticket, outcome))
            else:
                held.written = True
        for ticket, held in list(self._held.items()):
            if not held.written:
                if now >= held.write_deadline:     # queued in kazoo until ZooKeeper is back
                    held.answered = True
                    del self._held[ticket]
                    self._replies.append((ticket, ZooKeeperConnectionError(
                        f"ZooKeeper did not answer this request's write within "
                        f"{limits.CLUSTER_TOPIC_WRITE_WAIT_MS} ms (it stopped answering, or the "
                        f"connection was lost): "
                        f"its outcome is unknown, it may still take effect when ZooKeeper "
                        f"is back; describe the topic before retrying")))
                continue
            result = held.ready()
            if result is not None:
                del self._held[ticket]
                self._replies.append((ticket, result))
            elif now >= held.deadline:
                del self._held[ticket]
                self._replies.append((ticket, BrokerNotAvailableError(
                    "written to ZooKeeper, but this broker did not see it take effect within "
                    f"{limits.CLUSTER_TOPIC_WAIT_MS} ms")))

    def take_replies(self) -> list:
        replies, self._replies = self._replies, []
        return replies + self.deletes.take_replies()

    def pending_tickets(self) -> list:
        return list(self._held) + self.deletes.pending_tickets()

    def close(self) -> None:
        self._work.put((None, None))
        self._worker.join(timeout=limits.CLUSTER_TOPIC_WAIT_MS / 1000)
