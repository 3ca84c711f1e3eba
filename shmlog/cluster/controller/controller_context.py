"""What the controller's jobs share (Kafka's ``ControllerContext``, without its cache):
the election won, and the fresh reads each job starts from.

Rules
-----
* **The epoch won fences every write**: a job writes only through
  ``ClusterZooKeeper.checked_multi`` with :attr:`ControllerEpoch.zk_version`, and
  stamps :attr:`ControllerEpoch.epoch` on every partition state it writes.
* **Nothing is cached here**: the live brokers and the brokers shutting down are
  read fresh by each job (Kafka reads states fresh at election time too), so a
  job's decision never rests on what an earlier event left.

Theory of operation
-------------------
:class:`ControllerEpoch` is what ``ClusterZooKeeper.try_become_controller`` returns;
the controller holds one while elected and passes it to each job. A broker's epoch
is its registration's czxid, so a live broker whose epoch changed bounced; a
controlled shutdown asked for in an earlier incarnation (another broker epoch) is
not one now.
"""

from __future__ import annotations

import dataclasses
import logging

from ..zk.client import ClusterZooKeeper

__all__ = ["ControllerEpoch", "read_live_brokers", "read_brokers_shutting_down"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ControllerEpoch:
    """The election this controller won."""
    epoch: int              # the controller epoch, stamped on the states it writes
    zk_version: int         # the zkVersion of /controller_epoch it left: the write fence


def read_live_brokers(zookeeper: ClusterZooKeeper) -> dict[int, int]:
    """The live brokers: id → broker epoch (their registration's czxid)."""
    return {broker_id: epoch for broker_id, (_, epoch) in zookeeper.read_brokers().items()}


def read_brokers_shutting_down(zookeeper: ClusterZooKeeper, live: dict[int, int],
                               controller_id: int) -> frozenset[int]:
    """The live brokers that asked for a controlled shutdown in their current
    incarnation (Kafka checks the request's broker epoch the same way); logged as
    controller ``controller_id``'s finding."""
    asking = zookeeper.read_controlled_shutdowns()
    shutting = frozenset(broker_id for broker_id, epoch in asking.items()
                         if live.get(broker_id) == epoch)
    if shutting:
        log.info("controller %d: brokers shutting down %s", controller_id, sorted(shutting))
    return shutting
