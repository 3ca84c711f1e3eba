"""Child processes of the command-line clients (kcat, node for kafkajs), each run
bounded: started in a process group of its own, killed as a group past its
timeout, always reaped.

Rules
-----
* A run past its bound raises :class:`TimeoutError` naming the client and what it
  was doing, after its process group is killed (SIGKILL) and the child reaped: no
  process outlives the call.
* A child that only ends when stopped (a group member) is run with
  ``stop_at_bound``: stopped at the bound (SIGTERM, then SIGKILL), its output
  returned.
* Output is returned whole (bytes); a non-zero exit is the caller's to judge (kcat
  exits 1 when a delivery failed, and says which on stderr).
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import NamedTuple

# How long a killed child gets to be reaped (SIGKILL cannot be caught).
REAP_TIMEOUT_S = 10.0
# How long a child stopped at its bound gets to end by itself (SIGTERM) before SIGKILL.
STOP_TIMEOUT_S = 10.0


class Finished(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes


def run_bounded(what: str, argv: list[str], timeout_s: float, *, stdin: bytes = b"",
                cwd: str | None = None, stop_at_bound: bool = False) -> Finished:
    """Run ``argv`` with ``stdin``; its exit code and output, or TimeoutError
    (``what`` says what it was doing) when it runs past ``timeout_s``. With
    ``stop_at_bound``, a child still running at the bound is stopped (SIGTERM first,
    see :func:`stop`) and what it printed is returned: for a child that only ends
    when stopped."""
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=cwd, start_new_session=True)
    try:
        stdout, stderr = child.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if stop_at_bound:
            return stop(child)
        kill_group(child)
        stdout, stderr = child.communicate(timeout=REAP_TIMEOUT_S)
        raise TimeoutError(f"{what}: still running after {timeout_s} s, killed "
                           f"(stderr: {stderr.decode(errors='replace')[-1000:]!r})") from None
    except BaseException:
        kill_group(child)
        child.communicate(timeout=REAP_TIMEOUT_S)
        raise
    return Finished(child.returncode, stdout, stderr)


def stop(child: subprocess.Popen) -> Finished:
    """SIGTERM first (kcat then flushes what it printed and leaves its group), SIGKILL
    when that is not enough."""
    kill_group(child, signal.SIGTERM)
    try:
        stdout, stderr = child.communicate(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group(child)
        stdout, stderr = child.communicate(timeout=REAP_TIMEOUT_S)
    return Finished(child.returncode, stdout, stderr)


def kill_group(child: subprocess.Popen, sent: int = signal.SIGKILL) -> None:
    try:
        os.killpg(child.pid, sent)
    except ProcessLookupError:
        pass
