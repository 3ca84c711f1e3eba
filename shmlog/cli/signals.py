"""Ending a verb that runs until it is told to stop (``status --watch``, ``cluster up``,
``zookeeper``): SIGINT (Ctrl-C) and SIGTERM raise KeyboardInterrupt in the main thread
while it runs, whatever this process inherited.

Why it must be set, not assumed: a shell starts a background command (``cmd &``, and
every command of a script it runs in the background) with SIGINT ignored, and Python
installs its KeyboardInterrupt handler only over the default disposition, so such a
process would never see its Ctrl-C. A verb that promises to end on it sets the handler
itself for as long as it runs, and puts back what was there after.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

__all__ = ["STOP_SIGNALS", "stopped_by_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt; after it, their
    handlers are what they were."""
    previous = {number: signal.signal(number, signal.default_int_handler)
                for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
