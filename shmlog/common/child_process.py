"""Stopping a process this one started (a broker, a ZooKeeper): SIGTERM first, so it
shuts down gracefully, and SIGKILL only when it does not within the time it is
given; no process is left either way; and whether a process named by a pid another
process wrote is alive. Standard library and ``limits`` only, so light modules can
use it."""

from __future__ import annotations

import os
import signal
import subprocess

from . import limits

__all__ = ["stop", "process_alive"]


def stop(process: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM ``process`` (unless it has exited), wait up to ``timeout_s``, then
    SIGKILL it and wait again as long; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
    return process.returncode


def process_alive(pid: int) -> bool:
    """Does process ``pid`` exist (another user's too)? A pid no process can have
    (0, negative, above ``limits.PID_MAX``: a pid read from memory another process
    writes) is not alive; it is never passed to kill(2), where 0 and negative
    pids name process groups and a large one overflows."""
    if not 0 < pid <= limits.PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
