"""The admin znodes: what operators and brokers ask of the controller under
``/admin`` (Kafka's ``ReassignPartitionsZNode``, ``PreferredReplicaElectionZNode``,
and our ``/admin/controlled_shutdown/<id>`` for its ControlledShutdownRequest).

Rules
-----
* **One request of a kind at a time**: a reassignment or a preferred election asked
  while one is pending is refused (:class:`ReassignmentInProgressError`,
  :class:`PreferredElectionInProgressError`), as Kafka's tools refuse it; the
  controller deletes the znode when it is done.
* A pending reassignment is changed only at the zkVersion it was read at
  (:meth:`AdminZnodes.replace_reassignment`), as the controller rewrites it too.
* A controlled shutdown request is an ephemeral of the asking broker's session
  carrying its broker epoch: it goes when the broker does, and the controller
  ignores one left by an earlier incarnation.

Theory of operation
-------------------
The requester writes, the controller watches (``watches.watch_reassignment``,
``watches.watch_leader_balance``) and reads back here; the requester learns the
outcome from the znode going and the partition states, not from an answer.
"""

from __future__ import annotations

import logging
from typing import Iterable

from ...common.errors import (
    PreferredElectionInProgressError,
    ReassignmentInProgressError,
    ZnodeExistsError,
    ZnodeFormatError,
    ZnodeMissingError,
)
from . import paths as zk_paths
from .session import ZooKeeperSession

__all__ = ["AdminZnodes"]

log = logging.getLogger(__name__)


class AdminZnodes:
    """Reassignment, preferred election and controlled shutdown requests, read and
    written in ``session``."""

    def __init__(self, session: ZooKeeperSession):
        self._session = session

    # --- partition reassignment --------------------------------------------------------

    def read_reassignment(self) -> tuple[dict[tuple[str, int], tuple[int, ...]], int] | None:
        """(target replicas by (topic, partition), zkVersion) of the reassignment
        request in ``/admin/reassign_partitions``, None when there is none."""
        found = self._session.get(zk_paths.REASSIGN_PARTITIONS_PATH)
        return None if found is None else (zk_paths.decode_reassignment(found[0]),
                                           found[1].version)

    def create_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]]) -> None:
        """Ask the controller to move ``partitions`` to their target replicas (create
        ``/admin/reassign_partitions``).

        Raises
        ------
        ReassignmentInProgressError
            A reassignment request exists already (Kafka's tool refuses then too).
        """
        self._session.ensure_path(zk_paths.ADMIN_PATH)
        try:
            self._session.create(zk_paths.REASSIGN_PARTITIONS_PATH,
                                 zk_paths.encode_reassignment(partitions))
        except ZnodeExistsError:
            raise ReassignmentInProgressError(
                f"{zk_paths.REASSIGN_PARTITIONS_PATH} exists: a reassignment is in progress "
                f"(verify it, or cancel it)") from None

    def replace_reassignment(self, partitions: dict[tuple[str, int], tuple[int, ...]],
                             version: int) -> None:
        """Rewrite the reassignment request if its zkVersion is still ``version``
        (``--cancel`` puts the origin replicas as targets).

        Raises
        ------
        StaleStateVersionError, ZooKeeperConflictError
            The request changed or went since it was read: read it again.
        """
        self._session.set(zk_paths.REASSIGN_PARTITIONS_PATH,
                          zk_paths.encode_reassignment(partitions), version=version)

    # --- controlled shutdown and preferred election (leader_balance) ------------------

    def request_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> None:
        """Ask the controller to move ``broker_id``'s leaderships away: (re)create the
        ephemeral ``/admin/controlled_shutdown/<id>`` in this session. Asking again
        deletes and creates it, so the controller's children watch fires and it
        elects again (Kafka's broker sends its request again)."""
        path = zk_paths.controlled_shutdown_path(broker_id)
        try:
            self._session.delete(path)
        except ZnodeMissingError:
            pass
        self._session.create(path, zk_paths.encode_controlled_shutdown(broker_epoch),
                             ephemeral=True)

    def read_controlled_shutdowns(self) -> dict[int, int]:
        """The brokers that asked for a controlled shutdown: id → the broker epoch
        they asked with (a malformed znode is logged and skipped)."""
        asking = {}
        for name in self._session.children(zk_paths.CONTROLLED_SHUTDOWN_PATH):
            try:
                broker_id = zk_paths.decode_broker_id(name)
                found = self._session.get(zk_paths.controlled_shutdown_path(broker_id))
                if found is not None:
                    asking[broker_id] = zk_paths.decode_controlled_shutdown(broker_id, found[0])
            except ZnodeFormatError as error:
                log.warning("%s", error)
        return dict(sorted(asking.items()))

    def request_preferred_replica_election(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Write ``/admin/preferred_replica_election`` (Kafka's znode and body) for
        ``partitions``; the controller elects them and deletes it.

        Raises
        ------
        PreferredElectionInProgressError
            The znode exists: an election asked for earlier is not done.
        """
        try:
            self._session.create(zk_paths.PREFERRED_REPLICA_ELECTION_PATH,
                                 zk_paths.encode_preferred_replica_election(partitions))
        except ZnodeExistsError:
            raise PreferredElectionInProgressError(
                f"{zk_paths.PREFERRED_REPLICA_ELECTION_PATH} exists: a preferred replica "
                f"election asked for earlier is still in progress") from None

    def read_preferred_replica_election(self) -> tuple[tuple[tuple[str, int], ...], int] | None:
        """(the partitions asked for, zkVersion) of a pending preferred replica
        election, None when none is pending."""
        found = self._session.get(zk_paths.PREFERRED_REPLICA_ELECTION_PATH)
        if found is None:
            return None
        return zk_paths.decode_preferred_replica_election(found[0]), found[1].version
