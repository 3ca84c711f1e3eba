"""Warnings that a peer or a client can provoke in a loop, logged at most once per
interval: the next one logged says how many were suppressed meanwhile."""

from __future__ import annotations

import logging
import time

__all__ = ["ThrottledWarnings"]


class ThrottledWarnings:
    """At most one warning per ``interval_s`` to ``log``; the next one says how many
    were suppressed."""

    def __init__(self, log: logging.Logger, interval_s: float):
        self.log = log
        self.interval_s = interval_s
        self.last = float("-inf")
        self.suppressed = 0

    def warn(self, message: str, *args) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.suppressed += 1
            return
        if self.suppressed:
            message += f" ({self.suppressed} similar warnings suppressed)"
        self.last, self.suppressed = now, 0
        self.log.warning(message, *args)
