"""Fill numba's disk cache with every kernel, in one process, saying so.

    python -m shmlog.compile_kernels

``make`` runs it before the demo and the tests. A fresh checkout has no compiled
kernel: the first process to call one compiles it (seconds each, a minute or two in
all) and leaves it in ``NUMBA_CACHE_DIR`` for every later process. Done here, that
minute is said out loud and paid once; otherwise it falls on whichever processes
start first, and brokers started together (a local cluster) each compile the same
kernels at once.

It runs the warm-ups the broker and the clients run anyway (``broker.warm_kernels``
with a scratch directory, the follower's append, the producer's, the reader's, the
cleaner's), so what they load is what is compiled here; with a full cache it loads
them and takes a second or two.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

__all__ = ["compile_kernels", "main"]


def compile_kernels() -> None:
    """Compile (or load) the kernels of the broker, a follower, the producer, the
    reader and the cleaner."""
    from . import cleaner, producer, reader
    from .broker import BrokerConfig, warm_kernels
    from .segments import warm_follower_kernels

    directory = tempfile.mkdtemp(prefix="shmlog-kernels-")
    try:
        warm_kernels(BrokerConfig(data_dir=directory))
        warm_follower_kernels(os.path.join(directory, "follower"))
        producer.warm_kernels()
        reader.warm_kernels()
        cleaner.warm_kernels()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    cache = os.environ.get("NUMBA_CACHE_DIR", "numba's default cache directory")
    print(f"shmlog: compiling its kernels into {cache} (a minute or two the first time, "
          f"a second or two after)", flush=True)
    started = time.monotonic()
    compile_kernels()
    print(f"shmlog: kernels ready in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
