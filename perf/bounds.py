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


FIRST_TOUCH_BYTES = 1 << 30


def first_touch_rate(size: int = FIRST_TOUCH_BYTES) -> float:
    """How fast this host hands out memory never touched (bytes/s): ones written over
    ``size`` bytes of anonymous memory just allocated, then freed. On bare metal,
    the kernel's page zeroing at close to memory speed. In a virtual machine whose
    host backs guest pages only when first touched, and takes back what the guest
    frees or leaves idle (virtio-balloon free page reporting, DAMON's pageout
    scheme), a host fault per page: 0.4-0.5 GB/s on the development VM, against
    14 GB/s for the same pages touched again at once. A log's page cache comes from
    the same free memory, so the first write of a log's bytes is bounded by it."""
    started = time.perf_counter()
    np.ones(size, np.uint8)
    return size / (time.perf_counter() - started)
