"""A broker's membership of a cluster: its ZooKeeper session and registration, the
controller that runs in every member (and acts in the elected one), the replication
endpoint, and the replica service.

Rules
-----
* Joining is all or nothing: a broker that cannot reach ZooKeeper, whose
  ``cluster.id`` is not the cluster's, whose broker id is taken, whose CurveZMQ key
  files cannot be read, or whose replication endpoint cannot be bound does not
  start (a typed error says which).
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

from .cluster_config import ClusterConfig
from .cluster_producer_ids import ClusterProducerIds
from .controller import Controller
from .partition_host import PartitionHost
from .records import now_ms
from .replica_service import ReplicaService
from .zk_client import ClusterZooKeeper
from .zk_paths import BrokerRegistration
from .zmq_replication import CurveSecurity, ReplicationEndpoint

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterNode"]


class ClusterNode:
    """Join the cluster ``config`` names, for the partitions of ``host``.

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

    def __init__(self, config: ClusterConfig, host: PartitionHost):
        self.config = config
        security = CurveSecurity.from_config(config)       # before anything is started
        self.zookeeper = ClusterZooKeeper(
            config.zookeeper_connect, session_timeout_ms=config.zookeeper_session_timeout_ms,
            connect_timeout_s=config.zookeeper_connection_timeout_ms / 1000).start()
        self.endpoint = self.controller = self.replication = self.producer_ids = None
        try:
            self.endpoint = ReplicationEndpoint(config.broker_id, 0, config.replication_endpoint,
                                                wake=host.table.appender_doorbell.ring,
                                                security=security)
            self.broker_epoch = self.zookeeper.register_broker(BrokerRegistration(
                config.broker_id, config.advertised_host, config.replication_endpoint,
                config.rack, now_ms(), os.getpid(), self.endpoint.public_key),
                config.cluster_id)
            self.endpoint.broker_epoch = self.broker_epoch
            self.replication = ReplicaService(host, config, self.zookeeper, self.endpoint)
            self.producer_ids = ClusterProducerIds(self.zookeeper, config.broker_id)
            self.controller = Controller(self.zookeeper, config.broker_id).start()
        except BaseException:
            self.close()
            raise
        log.info("broker %d joined cluster %s (epoch %d), replicating on %s (%s)",
                 config.broker_id, config.cluster_id, self.broker_epoch,
                 config.replication_endpoint, "CurveZMQ" if security else "plain TCP")

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
