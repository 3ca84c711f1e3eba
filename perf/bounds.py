"""Bounds the benchmarks print their figures against, measured in the same run."""

from __future__ import annotations

import time

import numpy as np

MEMCPY_BYTES = 256 << 20


def memcpy_rate(repeats: int = 5) -> float:
    """numpy memcpy bandwidth (bytes/s): the best of ``repeats`` copies of 256 MiB
    between pages already touched."""
    source = np.ones(MEMCPY_BYTES, np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return source.size / best
