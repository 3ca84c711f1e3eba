"""A broker's membership of a cluster: its ZooKeeper session and registration, the
controller that runs in every member (and acts in the elected one), the replication
endpoint, and the replica service.

Rules
-----
* Joining is all or nothing: a broker that cannot reach ZooKeeper, whose
  ``cluster.id`` is not the cluster's, whose broker id is taken, whose CurveZMQ key
  files cannot be read, or whose replication endpoint cannot be bound does not
  start (a typed error says which).
* **Controlled shutdown** (``controlled.shutdown.enable``; Kafka's
  ``KafkaServer.controlledShutdown``): before leaving, the broker asks the controller
  to move its leaderships away (:meth:`ClusterNode.start_controlled_shutdown`: the
  ephemeral ``/admin/controlled_shutdown/<id>``) and keeps serving until its applied
  states name it leader of nothing, or its attempts run out
  (:meth:`ClusterNode.controlled_shutdown_done`, rules in ``leader_balance``); the
  broker's loop drives both. Its own controller, if it is the controller, does
  the moving, then resigns when it leaves.
* The replication endpoint serves with the configured CurveZMQ keys (unless the
  config says plaintext), and the registration publishes its public key.
* Leaving closes in the order that lets the others act soonest: the controller
  resigns (another member is elected at once), the replication endpoint closes,
  and the ZooKeeper session is closed, not left to expire, so the broker's
  registration goes at once and its partitions are led elsewhere within
  milliseconds, not a session timeout.
"""

from __future__ import annotations

import logging
import os

from ..broker.partition_host import PartitionHost
from ..common.errors import ShmlogError
from ..config.cluster import ClusterConfig
from ..record.records import now_ms
from ..zmq_replication import CurveSecurity, ReplicationEndpoint
from .controller.controller import Controller
from .controller.leader_balance import ControlledShutdown, RebalancePolicy, ShutdownStep
from .producer_ids import ClusterProducerIds
from .replication.replica_service import ReplicaService
from .zk.client import ClusterZooKeeper
from .zk.paths import BrokerRegistration

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterNode"]


class ClusterNode:
    """Join the cluster ``config`` names, for the partitions of ``host``; its
    registration names ``kafka_endpoints``, the advertised Kafka listeners
    (``PROTOCOL://host:port``), for the other brokers' Metadata answers.

    Attributes
    ----------
    zookeeper : ClusterZooKeeper
    controller : Controller
    endpoint : ReplicationEndpoint
    replication : ReplicaService
    producer_ids : ClusterProducerIds
        The producer ids this broker hands out (cluster-wide).
    broker_epoch : int
        This incarnation's epoch (its registration's czxid).

    Raises
    ------
    InvalidConfigError
        A CurveZMQ key file cannot be read or is not valid.
    ZooKeeperUnavailableError, InconsistentClusterIdError, BrokerIdInUseError
        ZooKeeper cannot be reached, belongs to another cluster, or another live
        broker has this id.
    zmq.ZMQError
        The replication endpoint cannot be bound.
    """

    def __init__(self, config: ClusterConfig, host: PartitionHost,
                 kafka_endpoints: tuple[str, ...] = ()):
        self.config = config
        security = CurveSecurity.from_config(config)       # before anything is started
        self.zookeeper = ClusterZooKeeper(
            config.zookeeper_connect, session_timeout_ms=config.zookeeper_session_timeout_ms,
            connect_timeout_s=config.zookeeper_connection_timeout_ms / 1000).start()
        self.endpoint = self.controller = self.replication = self.producer_ids = None
        self.shutdown: ControlledShutdown | None = None
        try:
            self.endpoint = ReplicationEndpoint(config.broker_id, 0, config.replication_endpoint,
                                                security=security)
            self.broker_epoch = self.zookeeper.register_broker(BrokerRegistration(
                config.broker_id, config.advertised_host, config.replication_endpoint,
                config.rack, now_ms(), os.getpid(), self.endpoint.public_key,
                tuple(kafka_endpoints)),
                config.cluster_id)
            self.endpoint.broker_epoch = self.broker_epoch
            # One cluster watch for the replica service and the controller: a second
            # would read every partition state a failover changes once more.
            controller = Controller(self.zookeeper, config.broker_id, RebalancePolicy(
                config.auto_leader_rebalance_enable, config.leader_imbalance_per_broker_percentage,
                config.leader_imbalance_check_interval_seconds), watched_elsewhere=True)
            self.replication = ReplicaService(host, config, self.zookeeper, self.endpoint,
                                              also_watching=(controller.events,))
            self.producer_ids = ClusterProducerIds(self.zookeeper, config.broker_id)
            self.controller = controller.start()
        except BaseException:
            self.close()
            raise
        log.info("broker %d joined cluster %s (epoch %d), replicating on %s (%s)",
                 config.broker_id, config.cluster_id, self.broker_epoch,
                 config.replication_endpoint, "CurveZMQ" if security else "plain TCP")

    def start_controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away (on SIGTERM); the
        broker's loop then serves on until :meth:`controlled_shutdown_done`."""
        now = now_ms()
        self.shutdown = ControlledShutdown(self.config.controlled_shutdown_max_retries,
                                           self.config.controlled_shutdown_retry_backoff_ms, now)
        self.replication.stop_following()
        log.info("broker %d: controlled shutdown: asking the controller to move %d "
                 "leaderships", self.config.broker_id, len(self.replication.partitions_led()))
        self._ask_for_shutdown()

    def _ask_for_shutdown(self) -> None:
        try:
            self.zookeeper.request_controlled_shutdown(self.config.broker_id,
                                                       self.zookeeper.broker_epoch)
        except ShmlogError as error:          # the next attempt asks again
            log.warning("broker %d: controlled shutdown request failed: %s",
                        self.config.broker_id, error)

    def controlled_shutdown_done(self, now: int) -> bool:
        """Whether the broker may leave: it leads nothing now, or its attempts ran
        out (Kafka then shuts down anyway: those partitions fail over as usual)."""
        assert self.shutdown is not None, "start_controlled_shutdown() first"
        led = self.replication.partitions_led()
        step = self.shutdown.step(now, len(led), len(self.replication.partitions_movable(led)))
        if step is ShutdownStep.RETRY:
            log.info("broker %d: controlled shutdown attempt %d: still leading %s",
                     self.config.broker_id, self.shutdown.attempts, led[:10])
            self._ask_for_shutdown()
        elif step is ShutdownStep.DONE:
            log.info("broker %d: controlled shutdown done in %d ms: it leads no partition",
                     self.config.broker_id, now - self.shutdown.started_ms)
        elif step is ShutdownStep.GIVE_UP:
            log.warning("broker %d: controlled shutdown gave up after %d attempts, still "
                        "leading %s (%d with another live replica): leaving anyway",
                        self.config.broker_id, self.shutdown.attempts, led[:10],
                        len(self.replication.partitions_movable(led)))
        return step in (ShutdownStep.DONE, ShutdownStep.GIVE_UP)

    def close(self) -> None:
        """Leave: the controller resigns, the endpoint closes, the session ends."""
        if self.controller is not None:
            self.controller.stop()
        if self.replication is not None:
            self.replication.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self.zookeeper.close()
        if self.producer_ids is not None:       # after: a draw under way fails at once
            self.producer_ids.close()
