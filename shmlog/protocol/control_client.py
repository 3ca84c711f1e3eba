"""The client's side of the broker's control endpoint: one request, its reply.

Rules
-----
* Light: every client and the ``shmlog`` command import this module, so it imports
  ZeroMQ and the control protocol (``control``) but neither numpy nor numba.
* A request fails at once when no broker can answer: no control socket (none runs,
  or it stopped cleanly) is :class:`BrokerNotRunningError`, a socket this user may
  not connect to is :class:`BrokerAccessDeniedError`. A socket left by a killed
  broker is tried as usual, since a new broker may be starting on it; no answer
  within the timeout is :class:`BrokerNotAvailableError`.
* A refused request raises the broker's typed error (see ``control``).
* A request over the control frame limit is refused here, before anything is sent
  or a broker is looked for (:class:`ControlRequestTooLargeError`, naming the
  limit): sent, the broker would refuse it anyway.
"""

from __future__ import annotations

import os

import zmq

from ..common import access
from ..common.errors import BrokerAccessDeniedError, BrokerNotAvailableError, BrokerNotRunningError
from ..common.paths import control_address, control_path
from ..common.process_limits import open_files_error
from .control import REQUEST_SIZE_MAX, decode_reply, encode_request, request_too_large

__all__ = ["request"]


def _check_control_socket(data_dir: str) -> None:
    """Fail at once when no broker can answer: its socket is missing (none runs, or
    it stopped cleanly), or this user may not connect to it. A socket left by a
    broker that was killed is tried as usual: a new one may be starting."""
    path = control_path(data_dir)
    start = f"start one with: shmlog broker --data-dir {data_dir}"
    try:
        os.stat(path)
    except FileNotFoundError:
        raise BrokerNotRunningError(f"no broker runs on {data_dir} (there is no control "
                                    f"socket {path}); {start}") from None
    except PermissionError:
        raise BrokerAccessDeniedError(_denied(path)) from None
    except OSError as error:
        raise BrokerNotAvailableError(f"cannot reach the control socket {path}: {error}; "
                                      f"{start}") from None
    # connect(2) to a Unix socket needs write permission on it.
    if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        raise BrokerAccessDeniedError(_denied(path))


def _denied(path: str) -> str:
    return (f"permission denied: {access.owner_name(os.geteuid())} may not connect to the "
            f"broker's control socket {path}; the broker keeps its data private to its "
            f"user unless its data_group setting shares it with a group of yours")


def _request_socket() -> zmq.Socket:
    """A REQ socket. ZeroMQ needs a descriptor for each socket (its mailbox): the
    open-files limit refusing one is a ResourceLimitError naming it, as the broker's
    scrapes and housekeeping expect (a ZMQError is no ShmlogError)."""
    try:
        socket = zmq.Context.instance().socket(zmq.REQ)
    except zmq.ZMQError as error:
        typed = open_files_error(OSError(error.errno, str(error)))
        if typed is None:
            raise
        raise typed from error
    socket.setsockopt(zmq.LINGER, 0)
    return socket


def request(data_dir: str, request_type: str, *, timeout_ms: int = 10_000, **fields) -> dict:
    """One control request to the broker of ``data_dir``; its reply's fields.

    Raises
    ------
    BrokerAccessDeniedError
        This user may not connect to the broker's control socket (at once).
    BrokerNotRunningError
        No broker runs: there is no control socket (at once).
    BrokerNotAvailableError
        No broker answered within ``timeout_ms``; the message names the command
        that starts one.
    ControlRequestTooLargeError
        The request is over ``limits.CONTROL_FRAME_SIZE_MAX`` (at once; not sent).
    ResourceLimitError
        The open-files limit left no descriptor for the request's socket.
    ShmlogError
        The broker refused the request (its typed error).
    """
    frame = encode_request(request_type, **fields)
    if len(frame) > REQUEST_SIZE_MAX:
        raise request_too_large(len(frame), f"the {request_type!r} request")
    _check_control_socket(data_dir)
    socket = _request_socket()
    try:
        socket.connect(control_address(data_dir))
        socket.send(frame)
        if not socket.poll(timeout_ms, zmq.POLLIN):
            raise BrokerNotAvailableError(
                f"no broker answered at {control_address(data_dir)} within {timeout_ms} ms "
                f"(one may be busy, or was killed and left its socket); if none runs, start "
                f"one with: shmlog broker --data-dir {data_dir}")
        return decode_reply(socket.recv())
    finally:
        socket.close()
