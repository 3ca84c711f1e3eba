"""A broker's ZooKeeper client: :class:`ClusterZooKeeper`, the session and everything
cluster mode asks of it, in one object (Kafka's ``KafkaZkClient``).

It is a :class:`~.session.ZooKeeperSession` (the only code that imports kazoo) that
speaks in ``paths``' terms through its parts, one module each:

=========================  ============================================================
``brokers``                broker registration, the cluster id, the live brokers
``topics``                 topics, partition states (versioned), deletion marks
``controller_election``    ``/controller``, ``/controller_epoch``, the fenced multi-op
``configs``                topic and broker configs
``producer_id_blocks``     the cluster-wide producer-id blocks
``admin``                  reassignment, preferred election, controlled shutdown requests
``watches``                znode changes as events on an :class:`~.events.EventQueue`
=========================  ============================================================

Rules
-----
* **Callers hold a ClusterZooKeeper**, never a part: each method here hands the
  call to the part named in its section, unchanged, and each part's module states
  its own rules (fencing, conditional writes, retries).
* The parts share the one session and nothing else: none calls another.

Theory of operation
-------------------
One session per broker, shared by the broker's loop and its controller; a reader
that must change nothing (``cluster_status``) starts one with ``create_paths``
false. :meth:`ClusterZooKeeper.register_broker` also keeps the registration alive
across lost sessions (``brokers``).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ...common import limits
from ...common.errors import ShmlogError
from . import watches
from .admin import AdminZnodes
from .brokers import BrokerZnodes
from .configs import ConfigZnodes
from .controller_election import ControllerElection
from .events import EventQueue
from .paths import (
    BrokerRegistration,
    ControllerRegistration,
    PartitionState,
    ProducerIdBlock,
    TopicAssignment,
)
from .producer_id_blocks import ProducerIdBlocks
from .session import Op, ZooKeeperSession
from .state_changes import notice_op
from .topics import TopicZnodes
from .watches import ClusterWatch

__all__ = ["ClusterZooKeeper"]


class ClusterZooKeeper(ZooKeeperSession):
    """A broker's ZooKeeper session and what cluster mode asks of it.

    Parameters and the session's attributes (``suspended``, ``sessions_lost``) are
    :class:`ZooKeeperSession`'s.

    Attributes
    ----------
    brokers, topics, controller_election, configs, producer_id_blocks, admin
        The parts (see the module's table).
    """

    def __init__(self, hosts: str, *,
                 session_timeout_ms: int = limits.ZOOKEEPER_SESSION_TIMEOUT_MS_DEFAULT,
                 connect_timeout_s: float = limits.ZOOKEEPER_CONNECT_TIMEOUT_S):
        super().__init__(hosts, session_timeout_ms=session_timeout_ms,
                         connect_timeout_s=connect_timeout_s)
        self.brokers = BrokerZnodes(self)
        self.topics = TopicZnodes(self)
        self.controller_election = ControllerElection(self)
        self.configs = ConfigZnodes(self)
        self.producer_id_blocks = ProducerIdBlocks(self)
        self.admin = AdminZnodes(self)
        self.announce = notice_op                     # every state written is announced

    # --- registration (brokers.BrokerZnodes) -------------------------------------------

    @property
    def broker_epoch(self) -> int:
        """The czxid of this broker's registration (-1 before :meth:`register_broker`)."""
        return self.brokers.broker_epoch

    def register_broker(self, registration: BrokerRegistration, cluster_id: str) -> int:
        """:meth:`BrokerZnodes.register_broker`: join, and the broker epoch."""
        return self.brokers.register_broker(registration, cluster_id)

    def read_brokers(self) -> dict[int, tuple[BrokerRegistration, int]]:
        """:meth:`BrokerZnodes.read_brokers`: id → (registration, broker epoch)."""
        return self.brokers.read_brokers()

    # --- topics and partition states (topics.TopicZnodes) ------------------------------

    def read_topics(self) -> list[str]:
        """:meth:`TopicZnodes.read_topics`."""
        return self.topics.read_topics()

    def read_assignment(self, topic: str) -> TopicAssignment | None:
        """:meth:`TopicZnodes.read_assignment`."""
        return self.topics.read_assignment(topic)

    def read_assignment_versioned(self, topic: str) -> tuple[TopicAssignment, int] | None:
        """:meth:`TopicZnodes.read_assignment_versioned`."""
        return self.topics.read_assignment_versioned(topic)

    def read_assignments(self) -> dict[str, TopicAssignment]:
        """:meth:`TopicZnodes.read_assignments`."""
        return self.topics.read_assignments()

    def read_partition_state(self, topic: str,
                             partition: int) -> tuple[PartitionState, int] | None:
        """:meth:`TopicZnodes.read_partition_state`: (state, zkVersion)."""
        return self.topics.read_partition_state(topic, partition)

    def read_partition_states(self, topic: str) -> dict[int, tuple[PartitionState, int]]:
        """:meth:`TopicZnodes.read_partition_states`: partition → (state, zkVersion)."""
        return self.topics.read_partition_states(topic)

    def read_partition_states_of(self, partitions) -> dict[tuple[str, int],
                                                           tuple[PartitionState, int]]:
        """:meth:`TopicZnodes.read_partition_states_of`: (topic, partition) → (state,
        zkVersion), pipelined."""
        return self.topics.read_partition_states_of(partitions)

    def read_topics_to_delete(self) -> list[str]:
        """:meth:`TopicZnodes.read_topics_to_delete`."""
        return self.topics.read_topics_to_delete()

    def create_topic(self, assignment: TopicAssignment, config: dict[str, str]) -> None:
        """:meth:`TopicZnodes.create_topic`."""
        self.topics.create_topic(assignment, config)

    def mark_topic_deleted(self, topic: str) -> None:
        """:meth:`TopicZnodes.mark_topic_deleted`."""
        self.topics.mark_topic_deleted(topic)

    def update_partition_state(self, topic: str, topic_id: str, partition: int,
                               state: PartitionState, version: int) -> int:
        """:meth:`TopicZnodes.update_partition_state`: the new zkVersion."""
        return self.topics.update_partition_state(topic, topic_id, partition, state, version)

    def update_partition_states_async(
            self, writes: Sequence[tuple[str, str, int, PartitionState, int]],
            done: Callable[[list | ShmlogError], None]) -> None:
        """:meth:`TopicZnodes.update_partition_states_async`."""
        self.topics.update_partition_states_async(writes, done)

    def partition_state_creation_ops(self, topic: str, topic_id: str,
                                     states: dict[int, PartitionState]) -> list[Op]:
        """:meth:`TopicZnodes.partition_state_creation_ops`."""
        return self.topics.partition_state_creation_ops(topic, topic_id, states)

    def topic_deletion_ops(self, topic: str) -> list[Op]:
        """:meth:`TopicZnodes.topic_deletion_ops`."""
        return self.topics.topic_deletion_ops(topic)

    def read_state_change_notices(self) -> list[str]:
        """:meth:`TopicZnodes.read_state_change_notices`."""
        return self.topics.read_state_change_notices()

    def delete_state_change_notices(self, names: Sequence[str]) -> None:
        """:meth:`TopicZnodes.delete_state_change_notices`."""
        self.topics.delete_state_change_notices(names)

    # --- the controller (controller_election.ControllerElection) -----------------------

    def read_controller(self) -> ControllerRegistration | None:
        """:meth:`ControllerElection.read_controller`."""
        return self.controller_election.read_controller()

    def read_controller_epoch(self) -> tuple[int, int]:
        """:meth:`ControllerElection.read_controller_epoch`: (epoch, zkVersion)."""
        return self.controller_election.read_controller_epoch()

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """:meth:`ControllerElection.try_become_controller`: (epoch, zkVersion) or None."""
        return self.controller_election.try_become_controller(broker_id)

    def resign_controller(self, broker_id: int) -> None:
        """:meth:`ControllerElection.resign_controller`."""
        self.controller_election.resign_controller(broker_id)

    def checked_multi(self, ops: Sequence[Op], controller_version: int) -> list:
        """:meth:`ControllerElection.checked_multi`: ``ops`` fenced by the epoch."""
        return self.controller_election.checked_multi(ops, controller_version)

    def checked_multi_chunked(self, ops: Sequence[Op], controller_version: int,
                              pipelined: bool = False) -> list:
        """:meth:`ControllerElection.checked_multi_chunked`: ``ops`` as fenced multis
        that each fit ZooKeeper's request size."""
        return self.controller_election.checked_multi_chunked(ops, controller_version,
                                                              pipelined)

    # --- configs (configs.ConfigZnodes) ------------------------------------------------

    def read_topic_config(self, topic: str) -> dict[str, str]:
        """:meth:`ConfigZnodes.read_topic_config`."""
        return self.configs.read_topic_config(topic)

    def set_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """:meth:`ConfigZnodes.set_topic_config`."""
        self.configs.set_topic_config(topic, config)

    def read_broker_config(self, broker_id: int) -> dict[str, str]:
        """:meth:`ConfigZnodes.read_broker_config`."""
        return self.configs.read_broker_config(broker_id)

    def set_broker_config(self, broker_id: int, config: dict[str, str]) -> None:
        """:meth:`ConfigZnodes.set_broker_config`."""
        self.configs.set_broker_config(broker_id, config)

    # --- producer ids (producer_id_blocks.ProducerIdBlocks) ----------------------------

    def next_producer_id_block(self, broker_id: int) -> ProducerIdBlock:
        """:meth:`ProducerIdBlocks.next_producer_id_block`."""
        return self.producer_id_blocks.next_producer_id_block(broker_id)

    # --- admin requests (admin.AdminZnodes) --------------------------------------------

    def read_reassignment(self) -> tuple[dict[tuple[str, int], tuple[int, ...]], int] | None:
        """:meth:`AdminZnodes.read_reassignment`: (targets, zkVersion)."""
        return self.admin.read_reassignment()

    def create_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]]) -> None:
        """:meth:`AdminZnodes.create_reassignment`."""
        self.admin.create_reassignment(partitions)

    def replace_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]],
                             version: int) -> None:
        """:meth:`AdminZnodes.replace_reassignment`."""
        self.admin.replace_reassignment(partitions, version)

    def request_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> None:
        """:meth:`AdminZnodes.request_controlled_shutdown`."""
        self.admin.request_controlled_shutdown(broker_id, broker_epoch)

    def read_controlled_shutdowns(self) -> dict[int, int]:
        """:meth:`AdminZnodes.read_controlled_shutdowns`: id → broker epoch."""
        return self.admin.read_controlled_shutdowns()

    def request_preferred_replica_election(self, partitions: Iterable[tuple[str, int]]) -> None:
        """:meth:`AdminZnodes.request_preferred_replica_election`."""
        self.admin.request_preferred_replica_election(partitions)

    def read_preferred_replica_election(self) -> tuple[tuple[tuple[str, int], ...], int] | None:
        """:meth:`AdminZnodes.read_preferred_replica_election`: (partitions, zkVersion)."""
        return self.admin.read_preferred_replica_election()

    # --- watches (watches) -------------------------------------------------------------

    def watch_controller(self, events: EventQueue) -> ClusterWatch:
        """:func:`watches.watch_controller`: ``/controller``."""
        return watches.watch_controller(self, events)

    def watch_reassignment(self, events: EventQueue) -> ClusterWatch:
        """:func:`watches.watch_reassignment`: ``/admin/reassign_partitions``."""
        return watches.watch_reassignment(self, events)

    def watch_broker_config(self, broker_id: int, events: EventQueue) -> ClusterWatch:
        """:func:`watches.watch_broker_config`: ``/config/brokers/<broker_id>``."""
        return watches.watch_broker_config(self, broker_id, events)

    def watch_cluster(self, events: EventQueue, also: Sequence[EventQueue] = ()) -> ClusterWatch:
        """:func:`watches.watch_cluster`: brokers, topics, states, deletion marks, on
        ``events`` and each of ``also``."""
        return watches.watch_cluster(self, events, also)

    def watch_leader_balance(self, events: EventQueue) -> ClusterWatch:
        """:func:`watches.watch_leader_balance`: controlled shutdowns, preferred election."""
        return watches.watch_leader_balance(self, events)
