"""Where a broker is found: its data directory, its control socket, the names of its
shared memory.

Rules
-----
* Every client and the ``shmlog`` command import this module, so it imports only the
  standard library and ``errors``: no numpy, numba or ZeroMQ (a command that only
  asks the broker something starts in a tenth of a second, not a second).
* A data directory is named by its absolute path: the socket and the shared-memory
  prefix of ``./data`` and of ``/abs/path/data`` are the same.
"""

from __future__ import annotations

import hashlib
import os

from .errors import LocalProtocolError

__all__ = ["default_data_dir", "control_path", "control_address", "shared_memory_prefix"]

DATA_DIR_ENVIRONMENT = "SHMLOG_DATA_DIR"
RUN_DIRECTORY = "run"
CONTROL_SOCKET = "control.sock"
# A Unix socket path must fit sun_path (108 bytes on Linux, with the terminator).
SOCKET_PATH_LENGTH_MAX = 107


def default_data_dir() -> str:
    """``$SHMLOG_DATA_DIR``, else ``$XDG_DATA_HOME/shmlog`` (``~/.local/share/shmlog``)."""
    if os.environ.get(DATA_DIR_ENVIRONMENT):
        return os.path.abspath(os.environ[DATA_DIR_ENVIRONMENT])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return os.path.join(base, "shmlog")


def control_path(data_dir: str) -> str:
    """The broker's control socket (a Unix socket file).

    Raises
    ------
    LocalProtocolError
        The path does not fit a Unix socket address.
    """
    path = os.path.join(os.path.abspath(data_dir), RUN_DIRECTORY, CONTROL_SOCKET)
    if len(path) > SOCKET_PATH_LENGTH_MAX:
        raise LocalProtocolError(f"the control socket path {path!r} is longer than "
                                 f"{SOCKET_PATH_LENGTH_MAX} bytes; choose a shorter data directory")
    return path


def control_address(data_dir: str) -> str:
    """The ZeroMQ address of the broker's control socket."""
    return "ipc://" + control_path(data_dir)


def shared_memory_prefix(data_dir: str) -> str:
    """Names in /dev/shm for this data directory's broker (a hash: paths have '/')."""
    return "shmlog-" + hashlib.sha1(os.path.abspath(data_dir).encode()).hexdigest()[:12]
