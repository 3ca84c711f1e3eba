"""Fill numba's disk cache with every kernel, in one process, saying so.

    python -m shmlog.devtools.compile_kernels

``make`` runs it before the demo and the tests. A fresh checkout has no compiled
kernel: the first process to call one compiles it (seconds each, a minute or two in
all) and leaves it in ``NUMBA_CACHE_DIR`` for every later process. Done here, that
minute is said out loud and paid once; otherwise it falls on whichever processes
start first, and brokers started together (a local cluster) each compile the same
kernels at once.

It runs the warm-ups the broker and the clients run anyway (``broker.warm_kernels``
with a scratch directory, the follower's append, the producer's, the reader's, the
cleaner's), so what they load is what is compiled here, and prints a line as each
group is ready, so a first run's minute shows where it goes; with a full cache it
loads them and takes a second or two.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Callable

__all__ = ["compile_kernels", "main"]


def _steps(directory: str) -> list[tuple[str, Callable[[], None]]]:
    """The warm-ups, named as ``main`` reports them, in the order they run."""
    from ..client import producer, reader
    from ..segments import warm_follower_kernels
    from ..server.broker import BrokerConfig, warm_kernels
    from ..storage import cleaner
    return [
        ("the broker's (appender, segments, indexes, state table, group commits)",
         lambda: warm_kernels(BrokerConfig(data_dir=directory))),
        ("a follower's append",
         lambda: warm_follower_kernels(os.path.join(directory, "follower"))),
        ("the producer's", producer.warm_kernels),
        ("the reader's", reader.warm_kernels),
        ("the cleaner's", cleaner.warm_kernels),
    ]


def compile_kernels(report: Callable[[int, int, str, float], None] | None = None) -> None:
    """Compile (or load) the kernels of the broker, a follower, the producer, the
    reader and the cleaner; after each group, ``report(number, count, name, seconds)``."""
    directory = tempfile.mkdtemp(prefix="shmlog-kernels-")
    try:
        steps = _steps(directory)
        for number, (name, warm) in enumerate(steps, 1):
            started = time.monotonic()
            warm()
            if report is not None:
                report(number, len(steps), name, time.monotonic() - started)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _print_step(number: int, count: int, name: str, seconds: float) -> None:
    print(f"shmlog: [{number}/{count}] {name} kernels ready ({seconds:.1f} s)", flush=True)


def main() -> int:
    from ..native.jit import cache_directory
    cache = cache_directory()
    print(f"shmlog: compiling its kernels into {cache} (a minute or two the first time, "
          f"a second or two after)", flush=True)
    started = time.monotonic()
    compile_kernels(_print_step)
    print(f"shmlog: kernels ready in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
