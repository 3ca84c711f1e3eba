"""Compile the Spark bulk reader's jar ahead of any session, saying so.

    python -m shmlog.spark.compile_reader

``make test`` runs it, so the first Spark test does not stall on ``javac``; the jar
is cached (``bulk.bulk_jar``), so later runs take a second. Without a JDK it says
why and exits 0: ``format("shmlog")`` works without the bulk reader.
"""

from __future__ import annotations

import sys
import time

from ..common.errors import BulkReaderUnavailableError
from .bulk import bulk_jar

__all__ = ["main"]


def main() -> int:
    print("shmlog: the Spark bulk reader (javac, the first time)", flush=True)
    started = time.monotonic()
    try:
        jar = bulk_jar()
    except BulkReaderUnavailableError as error:
        print(f"shmlog: no Spark bulk reader, format('shmlog') works without it: {error}",
              flush=True)
        return 0
    print(f"shmlog: Spark bulk reader ready in {time.monotonic() - started:.1f} s: {jar}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
