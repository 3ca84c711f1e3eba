"""What a cluster member tells Kafka clients: every live broker at its advertised
listener, and each partition's leader, leader epoch, replicas and in-sync replicas
as the member's view of ZooKeeper has them.

Rules
-----
* A broker is listed with the endpoint it registered for the listener name this
  broker's clients connect to (Kafka's rule: a client is told each broker's same
  listener; ``SASL_SSL://`` when clients log in over TLS here); a broker without
  such a listener is not listed, and a partition it leads is
  answered LEADER_NOT_AVAILABLE (no client could reach its leader), as is a
  partition with no leader.
* The controller a client is told of is this broker: any member takes the admin
  requests (it writes them to ZooKeeper), as KRaft's brokers forward them.
* Only a partition this broker leads, as its replica service applied the state,
  takes produces and fetches (:meth:`ClusterMetadata.leader_epoch`).
* Auto-creation asks the cluster's topic service, which writes the topic to
  ZooKeeper and answers later; the Metadata answer says LEADER_NOT_AVAILABLE until
  the leaders are elected and the client asks again.
"""

from __future__ import annotations

import logging

from ..cluster.replication.forwarding import append_as_leader, transactional_producer
from ..cluster.replication.partition import Role
from ..common.errors import ShmlogError, TopicExistsError
from ..common.internal_topics import INTERNAL_TOPICS, TRANSACTION_STATE_TOPIC
from ..groups import OFFSETS_TOPIC, offsets_partition
from .error_codes import LEADER_NOT_AVAILABLE, NONE
from .tickets import ask_service

__all__ = ["ClusterMetadata"]

log = logging.getLogger("shmlog.broker.kafka")

def kafka_address(endpoints: tuple[str, ...], listener_name: str = "PLAINTEXT") \
        -> tuple[str, int] | None:
    """(host, port) of the endpoint of listener ``listener_name`` in a broker's
    registration (``NAME://host:port``), None when it has none."""
    prefix = f"{listener_name.upper()}://"
    for endpoint in endpoints:
        if endpoint.upper().startswith(prefix):
            host, _, port = endpoint[len(prefix):].rpartition(":")
            if port.isdigit():
                return host.strip("[]"), int(port)
    return None


class ClusterMetadata:
    """The metadata a member (``core``, a BrokerCore in a cluster) answers with, to
    clients of its listener ``listener_name``."""

    def __init__(self, core, advertised: tuple[str, int],
                 listener_name: str = "PLAINTEXT") -> None:
        self.core = core
        self.advertised = advertised
        self.listener_name = listener_name
        self.broker_id = core.config.cluster.broker_id
        self.cluster_id = core.config.cluster.cluster_id
        self.auto_create = core.config.auto_create_topics_enable
        self.replication = core.cluster.replication
        self._creating: set[str] = set()             # asked for, not answered yet

    # -- brokers -----------------------------------------------------------------------
    def _addresses(self, listener: str | None = None) -> dict[int, tuple[str, int]]:
        """{broker id: (host, port)} of the live brokers with an endpoint of
        ``listener`` (by default the one this broker's clients are told of)."""
        return {broker_id: address for broker_id, live in self.replication.view.brokers.items()
                if (address := kafka_address(live.registration.kafka_endpoints,
                                             listener or self.listener_name)) is not None}

    def brokers(self, listener: str | None = None) -> list[tuple[int, str, int, str | None]]:
        """(node id, host, port, rack) of every live broker, at its endpoint of
        ``listener`` (by default the one this broker's clients are told of)."""
        racks = {broker_id: live.registration.rack
                 for broker_id, live in self.replication.view.brokers.items()}
        return [(broker_id, host, port, racks[broker_id]) for broker_id, (host, port)
                in sorted(self._addresses(listener).items())]

    def controller_id(self) -> int:
        return self.broker_id

    def coordinator(self, group_id: str, listener: str | None = None) \
            -> tuple[int, str, int] | None:
        """(node id, host, port) of the broker coordinating ``group_id``: the leader
        of its ``__consumer_offsets`` partition, at its endpoint of ``listener``; None
        while there is none reachable (the topic is then made if it does not exist
        yet)."""
        if not self.core.groups.ensure_offsets_topic():
            return None
        return self._leader_for(OFFSETS_TOPIC, group_id, listener)

    def transaction_coordinator(self, transactional_id: str, listener: str | None = None) \
            -> tuple[int, str, int] | None:
        """(node id, host, port) of the transactional id's coordinator: the leader of
        its ``__transaction_state`` partition, at its endpoint of ``listener``; None
        while there is none reachable (the topic is then made if it does not exist
        yet)."""
        if self.core.transactions.state_topic.partition_count() is None:
            return None
        return self._leader_for(TRANSACTION_STATE_TOPIC, transactional_id, listener)

    def _leader_for(self, topic: str, key: str, listener: str | None) \
            -> tuple[int, str, int] | None:
        """The leader of ``key``'s partition of the internal ``topic``, at its endpoint
        of ``listener``, or None."""
        answer = self.topic(topic)
        if answer is None:
            return None
        partitions = answer[2]
        _, code, leader, *_ = partitions[offsets_partition(key, len(partitions))]
        address = self._addresses(listener).get(leader) if code == NONE else None
        return (leader, *address) if address is not None else None

    # -- topics ------------------------------------------------------------------------
    def topic_names(self) -> list[str]:
        return sorted(self.replication.view.topics)

    def topic_name_of(self, topic_id: str) -> str | None:
        return next((name for name, assignment in self.replication.view.topics.items()
                     if assignment.topic_id == topic_id), None)

    def topic(self, name: str):
        """(topic id, internal, [(partition, error code, leader, leader epoch, replicas,
        in-sync replicas)]), or None when the view has no such topic."""
        view = self.replication.view
        assignment = view.topics.get(name)
        if assignment is None:
            return None
        reachable = self._addresses()
        partitions = []
        for partition, replicas in sorted(assignment.partitions.items()):
            seen = view.state(name, partition)
            state = seen[0] if seen is not None else None
            if state is None or not state.has_leader or state.leader not in reachable:
                partitions.append((partition, LEADER_NOT_AVAILABLE, -1,
                                   state.leader_epoch if state else -1, list(replicas),
                                   list(state.isr) if state else []))
            else:
                partitions.append((partition, NONE, state.leader, state.leader_epoch,
                                   list(replicas), list(state.isr)))
        return assignment.topic_id, name in INTERNAL_TOPICS, partitions

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The partition's leader epoch if this broker leads it now, else None."""
        replica = self.replication.hosted.replicas.get((topic, partition))
        if replica is None or replica.role is not Role.LEADER or replica.state is None:
            return None
        return replica.state.leader_epoch

    def append(self, topic: str, partition: int, batch, acks: int, deadline: int,
               answer, transactional_id: str | None = None) -> None:
        """Append a client's converted batch as leader, as a forwarded produce is
        (``forwarding.append_as_leader``): ``answer(error code, base offset, append
        time)`` at once, or for acks=all once the high watermark covers it. A
        transactional batch's producer id is known by its ``transactional_id`` from
        now on (the coordinator a verification asks), and the batch may be held."""
        forwarding = self.replication.forwarding
        producer = transactional_producer(batch) if transactional_id else None
        if producer is not None:
            forwarding.transactional_ids.learn(producer[0], transactional_id)
        replica = self.replication.hosted.replicas.get((topic, partition))
        append_as_leader(self.core.host.appender, forwarding.purgatory,
                         replica, batch, acks, deadline,
                         lambda error, base_offset, append_time:
                         answer(int(error), base_offset, append_time), split=True,
                         hold=forwarding.hold)

    def create_topic(self, name: str) -> None:
        """Ask the cluster to create ``name`` with ``num_partitions`` partitions (its
        default replication factor); the outcome is logged when it comes."""
        if name in self._creating:
            return                      # a client asking again while it is being made

        def created(result) -> None:
            self._creating.discard(name)
            if isinstance(result, ShmlogError) and not isinstance(result, TopicExistsError):
                log.warning("Kafka listener: creating topic %r on first use failed: %s",
                            name, result)

        self._creating.add(name)
        try:
            if ask_service(self.core, self.core.topics.create_topic, created, name=name,
                           partitions=self.core.config.num_partitions) is not None:
                self._creating.discard(name)                 # answered at once
        except TopicExistsError:            # another broker made it: not in the view yet
            self._creating.discard(name)
        except ShmlogError:
            self._creating.discard(name)
            raise
