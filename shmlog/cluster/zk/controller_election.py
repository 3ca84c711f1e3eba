"""The controller's election and its epoch in ZooKeeper: ``/controller`` (who is
controller, an ephemeral of its session) and ``/controller_epoch`` (how many were
elected), and the writes fenced by that epoch (Kafka's
``registerControllerAndIncrementControllerEpoch``, ``getControllerEpoch`` and
``wrapRequestWithControllerEpochCheck``).

Rules
-----
* **Every controller write is fenced**: :meth:`ControllerElection.checked_multi`
  puts ``check(/controller_epoch, version)`` first, the version its election left.
  A failed check is :class:`ControllerMovedError` (a newer controller was
  elected); another op's refusal is the session's :class:`ZooKeeperConflictError`
  (a stale version: :class:`StaleStateVersionError`). Nothing of a refused multi is
  applied.
* **Every state it writes carries its notice** (``state_changes``): a state op
  without one is refused before anything is sent.
* **An election is one transaction**: the ephemeral ``/controller`` and
  ``/controller_epoch`` set to epoch+1 at the version read; of two brokers running
  at once, one wins.
* A controller that stops cleanly deletes ``/controller``
  (:meth:`ControllerElection.resign_controller`) so the others elect at once instead
  of after its session timeout.

Theory of operation
-------------------
:meth:`ControllerElection.try_become_controller` reads the epoch (creating it as 0
when missing) and commits the election. When the commit fails, or its outcome is
unknown after a connection loss, it reads ``/controller`` back: if that is this
session's and the epoch is epoch+1, a commit retried after the loss had gone
through (Kafka's ``checkControllerAndEpoch``).
"""

from __future__ import annotations

import time
from typing import Sequence

from ...common.errors import (
    ControllerMovedError,
    ShmlogError,
    StaleStateVersionError,
    ZnodeExistsError,
    ZnodeMissingError,
    ZooKeeperConflictError,
    ZooKeeperConnectionError,
)
from . import paths as zk_paths
from .paths import ControllerRegistration
from .session import CheckOp, CreateOp, Op, SetDataOp, ZooKeeperSession
from .state_changes import is_state_path

__all__ = ["ControllerElection"]


class ControllerElection:
    """``/controller`` and ``/controller_epoch``, read and written in ``session``."""

    def __init__(self, session: ZooKeeperSession):
        self._session = session

    def read_controller(self) -> ControllerRegistration | None:
        """Who ``/controller`` names, None if no controller is elected."""
        found = self._session.get(zk_paths.CONTROLLER_PATH)
        return None if found is None else zk_paths.decode_controller(found[0])

    def read_controller_epoch(self) -> tuple[int, int]:
        """(controller epoch, zkVersion of ``/controller_epoch``), creating it as 0 when
        missing (Kafka's ``getControllerEpoch`` + ``createControllerEpochRaw``)."""
        while True:
            found = self._session.get(zk_paths.CONTROLLER_EPOCH_PATH)
            if found is not None:
                return zk_paths.decode_controller_epoch(found[0]), found[1].version
            try:
                self._session.create(zk_paths.CONTROLLER_EPOCH_PATH,
                                     zk_paths.encode_controller_epoch(0))
            except ZnodeExistsError:
                pass                                       # another broker's: read it

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """Run for controller (§1.2 of the design, Kafka's
        ``registerControllerAndIncrementControllerEpoch``).

        Returns
        -------
        tuple[int, int] | None
            (epoch, zkVersion of ``/controller_epoch``) when elected, None when
            another broker is controller.
        """
        epoch, version = self.read_controller_epoch()
        body = zk_paths.encode_controller(ControllerRegistration(broker_id,
                                                                 int(time.time() * 1000)))
        try:
            results = self._session.multi([
                CreateOp(zk_paths.CONTROLLER_PATH, body, ephemeral=True),
                SetDataOp(zk_paths.CONTROLLER_EPOCH_PATH,
                          zk_paths.encode_controller_epoch(epoch + 1), version)])
            return epoch + 1, results[1].version
        except (ZooKeeperConflictError, ZooKeeperConnectionError):
            pass                                    # refused, or unknown: read back below
        found = self._session.get(zk_paths.CONTROLLER_PATH)
        if found is None or found[1].ephemeralOwner != self._session.session_id:
            return None
        current, current_version = self.read_controller_epoch()
        return (current, current_version) if current == epoch + 1 else None

    def resign_controller(self, broker_id: int) -> None:
        """Delete ``/controller`` if this session holds it (a clean stop), so the
        others elect at once instead of after the session timeout."""
        found = self._session.get(zk_paths.CONTROLLER_PATH)
        if found is None or found[1].ephemeralOwner != self._session.session_id:
            return
        try:
            self._session.delete(zk_paths.CONTROLLER_PATH, version=found[1].version)
        except (ZnodeMissingError, StaleStateVersionError):
            pass

    def checked_multi(self, ops: Sequence[Op], controller_version: int) -> list:
        """Apply ``ops`` atomically, only if ``/controller_epoch`` still has zkVersion
        ``controller_version`` (the caller is still the controller).

        Returns
        -------
        list
            One result per op: the created path, True (delete), a stat with
            ``.version`` (set).

        Raises
        ------
        ControllerMovedError
            A newer controller was elected; nothing was applied.
        StaleStateVersionError, ZooKeeperConflictError
            An op found its znode otherwise; nothing was applied.
        ZooKeeperConnectionError
            The outcome is unknown.
        """
        _require_notices(ops)
        fence = CheckOp(zk_paths.CONTROLLER_EPOCH_PATH, controller_version)
        try:
            return self._session.multi([fence, *ops])[1:]
        except ZooKeeperConflictError as error:
            raise _moved_if_fenced(error, fence) from None

    def checked_multi_chunked(self, ops: Sequence[Op], controller_version: int,
                              pipelined: bool = False) -> list:
        """:meth:`checked_multi` for writes of any size: ``ops`` go, in order, as
        multis that each fit ZooKeeper's request size
        (``ZooKeeperSession.multi_chunked``), **each fenced**. Each multi is atomic,
        the whole is not: when one is refused, those before it stay applied (each
        was this controller's, at its epoch) and none after it is tried (when
        ``pipelined``, those after it are tried too: see
        ``ZooKeeperSession.multi_chunked``); the caller reads again and decides
        again, as after any refusal.

        Returns and raises as :meth:`checked_multi`.
        """
        _require_notices(ops)
        fence = CheckOp(zk_paths.CONTROLLER_EPOCH_PATH, controller_version)
        try:
            return self._session.multi_chunked(ops, prefix=[fence], pipelined=pipelined)
        except ZooKeeperConflictError as error:
            raise _moved_if_fenced(error, fence) from None


def _require_notices(ops: Sequence[Op]) -> None:
    """A partition state written without its notice would reach no broker (see
    ``state_changes``): such an op is a bug in its writer."""
    for op in ops:
        if isinstance(op, (CreateOp, SetDataOp)) and op.notice is None and \
                is_state_path(op.path):
            raise AssertionError(f"{op.path} is written without its state-change notice: "
                                 f"build it with state_changes.state_set_op/state_create_op")


def _moved_if_fenced(error: ZooKeeperConflictError, fence: CheckOp) -> ShmlogError:
    """The fence's refusal as :class:`ControllerMovedError`; another op's as itself."""
    # Only the fence names /controller_epoch: no controller op writes it.
    if error.path != fence.path:
        return error
    return ControllerMovedError(
        f"{fence.path} is no longer at version {fence.version} "
        f"({type(error).__name__}): a newer controller was elected")
