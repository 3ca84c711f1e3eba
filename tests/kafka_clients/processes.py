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
* A child that runs alongside the test (a group member: :func:`start_logging`)
  writes its output to files the caller reads while it runs; :func:`end` stops such
  children, all asked at once (SIGTERM or stdin closed, then SIGKILL), and reaps them.
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


def start_logging(argv: list[str], stdout_path: str, stderr_path: str, *,
                  cwd: str | None = None) -> subprocess.Popen:
    """``argv`` started in a process group of its own, its output going to the two
    files, its stdin a pipe left open (closing it is a stop request to a child that
    reads it)."""
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr,
                                cwd=cwd, start_new_session=True)


def end(children: list[subprocess.Popen], *, by_stdin: bool = False) -> None:
    """Stop children of :func:`start_logging`, all asked at once: stdin closed, and
    SIGTERM unless ``by_stdin`` (a child that ends when its stdin does); each killed
    (SIGKILL) when it has not ended STOP_TIMEOUT_S later, and reaped."""
    for child in children:
        child.stdin.close()
        if not by_stdin:
            kill_group(child, signal.SIGTERM)
    for child in children:
        reap(child)


def reap(child: subprocess.Popen) -> int:
    """Wait STOP_TIMEOUT_S for a child asked to end, then kill it; its exit code."""
    try:
        return child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group(child)
        return child.wait(REAP_TIMEOUT_S)


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
