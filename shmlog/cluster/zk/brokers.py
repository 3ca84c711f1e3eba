"""Broker registration: a broker joins its cluster in ZooKeeper, and anyone lists the
live brokers (Kafka's ``KafkaZkClient.registerBroker``, ``createOrGetClusterId`` and
``getAllBrokersInCluster``).

Rules
-----
* **One cluster per chroot.** ``/cluster/id`` is claimed by the first broker; a broker
  of another cluster is refused (:class:`InconsistentClusterIdError`) rather than
  join it.
* **One live session per broker id.** The registration is the ephemeral
  ``/brokers/ids/<id>``; a broker that finds another session's waits for it to go
  (a restarted broker's previous session expires within its timeout), at most
  ``BROKER_REGISTRATION_WAIT_SESSIONS`` session timeouts, then
  :class:`BrokerIdInUseError`.
* **The broker epoch is the registration's czxid** (KIP-380): each registration gets
  a new one, so the controller sees a broker that bounced under the same id.

Theory of operation
-------------------
After a LOST session the broker's registration went with it: on the next
CONNECTED, :class:`BrokerZnodes` registers again (from a thread of kazoo's handler,
as the session listener must not call ZooKeeper) and broadcasts a ``REGISTERED``
event with the new broker epoch (Kafka's ``processRegisterBrokerAndReelect``). A
registration that fails then is tried again at the next reconnection.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

from ...common import limits
from ...common.errors import (
    BrokerIdInUseError,
    InconsistentClusterIdError,
    ShmlogError,
    ZnodeExistsError,
)
from . import paths as zk_paths
from .events import EventKind, SessionState, WatchEvent
from .paths import BrokerRegistration
from .session import ZooKeeperSession

__all__ = ["BrokerZnodes"]

log = logging.getLogger(__name__)


class BrokerZnodes:
    """This broker's registration in ``session``, and the live brokers.

    Attributes
    ----------
    broker_epoch : int
        The czxid of this broker's registration (-1 before :meth:`register_broker`,
        and while a registration again after a lost session failed).
    """

    def __init__(self, session: ZooKeeperSession):
        self._session = session
        self.broker_epoch = -1
        self._registration: BrokerRegistration | None = None
        self._register_again = False
        session.add_state_listener(self._session_changed)

    def register_broker(self, registration: BrokerRegistration, cluster_id: str) -> int:
        """Join cluster ``cluster_id`` as ``registration``: claim or check
        ``/cluster/id``, then create the ephemeral ``/brokers/ids/<id>`` (stamped with
        the time, and this process's pid unless the registration names one). After
        a LOST session it is created again by itself (a ``REGISTERED`` event says so).

        Returns
        -------
        int
            The broker epoch: the registration's czxid (KIP-380).

        Raises
        ------
        InconsistentClusterIdError
            ``/cluster/id`` names another cluster.
        BrokerIdInUseError
            Another session holds this broker id past the session timeout (a
            restarted broker waits that long for its previous session's to go).
        """
        self._claim_cluster_id(cluster_id)
        self._registration = registration
        self.broker_epoch = self._register(registration)
        return self.broker_epoch

    def read_brokers(self) -> dict[int, tuple[BrokerRegistration, int]]:
        """The live brokers: id → (registration, broker epoch = czxid)."""
        brokers = {}
        for name in self._session.children(zk_paths.BROKER_IDS_PATH):
            broker_id = zk_paths.decode_broker_id(name)
            found = self._session.get(zk_paths.broker_path(broker_id))
            if found is not None:                         # else it went meanwhile
                brokers[broker_id] = (zk_paths.decode_broker_registration(broker_id, found[0]),
                                      found[1].czxid)
        return dict(sorted(brokers.items()))

    def _claim_cluster_id(self, cluster_id: str) -> None:
        try:
            self._session.create(zk_paths.CLUSTER_ID_PATH, zk_paths.encode_cluster_id(cluster_id))
        except ZnodeExistsError:
            existing = zk_paths.decode_cluster_id(self._session.get(zk_paths.CLUSTER_ID_PATH)[0])
            if existing != cluster_id:
                raise InconsistentClusterIdError(
                    f"{self._session.hosts} holds cluster {existing!r}, and this broker's "
                    f"cluster.id is {cluster_id!r}: point zookeeper.connect at this cluster's "
                    f"chroot, or fix cluster.id") from None

    def _register(self, registration: BrokerRegistration) -> int:
        path = zk_paths.broker_path(registration.broker_id)
        # Stamped at each registration, as Kafka's timestamp is.
        body = zk_paths.encode_broker_registration(dataclasses.replace(
            registration, timestamp_ms=int(time.time() * 1000),
            pid=registration.pid or os.getpid()))
        deadline = time.monotonic() + self._session.session_timeout_s * \
            limits.BROKER_REGISTRATION_WAIT_SESSIONS
        while True:
            try:
                self._session.create(path, body, ephemeral=True)
            except ZnodeExistsError:
                found = self._session.get(path)
                if found is None:
                    continue                          # it went between our two calls
                if found[1].ephemeralOwner != self._session.session_id:
                    self._wait_for_deletion(path, deadline, registration.broker_id)
                    continue
            found = self._session.get(path)
            if found is not None and found[1].ephemeralOwner == self._session.session_id:
                return found[1].czxid
            # Ours was gone already (the session was lost meanwhile): try again.

    def _wait_for_deletion(self, path: str, deadline: float, broker_id: int) -> None:
        gone = threading.Event()
        if self._session.exists(path, watch=gone.set) is None:
            return
        if not gone.wait(max(0.0, deadline - time.monotonic())):
            raise BrokerIdInUseError(
                f"broker id {broker_id} is registered by another ZooKeeper session at "
                f"{path}, and it did not go within "
                f"{limits.BROKER_REGISTRATION_WAIT_SESSIONS} session timeouts: is another "
                f"broker running with broker.id {broker_id}?")

    def _session_changed(self, state: SessionState) -> None:
        """The session's state listener, on kazoo's connection thread: flags and
        spawns only."""
        if state is SessionState.CONNECTED:
            if self._register_again and self._registration is not None:
                self._register_again = False
                self._session.spawn(self._reregister)
        elif state is SessionState.LOST:
            self._register_again = True

    def _reregister(self) -> None:
        """After a LOST session, on a thread of kazoo's handler."""
        registration = self._registration
        try:
            self.broker_epoch = self._register(registration)
        except ShmlogError as error:
            log.error("broker %d could not register again after its ZooKeeper session was "
                      "lost (tried again at the next reconnection): %s",
                      registration.broker_id, error)
            self.broker_epoch = -1
            self._register_again = True
        self._session.broadcast(WatchEvent(EventKind.REGISTERED, registration.broker_id, None,
                                           self.broker_epoch))
