"""The atomic intrinsics: each does what it says on values at the array's edges,
and a compiled spin loop over ``load_acquire`` sees a store made by another thread
(a plain load may be hoisted out of the loop; an atomic one may not).

Method: numpy int64 arrays in one process; the spin loop runs on a Python thread
(compiled kernels release the GIL) while the main thread stores the flag.
"""

from __future__ import annotations

import threading

import numpy as np

from shmlog.native.atomics import (
    compare_and_swap,
    fence,
    load_acquire,
    py_compare_and_swap,
    py_fetch_add,
    py_load_acquire,
    py_store_release,
    store_release,
)
from shmlog.native.jit import kernel


def test_store_then_load():
    words = np.zeros(4, np.int64)
    py_store_release(words, 3, -(2**63))
    assert py_load_acquire(words, 3) == -(2**63)
    assert words.tolist() == [0, 0, 0, -(2**63)]


def test_compare_and_swap_swaps_only_on_a_match():
    words = np.array([5, 0], np.int64)
    assert py_compare_and_swap(words, 0, 4, 9) == 5 and words[0] == 5
    assert py_compare_and_swap(words, 0, 5, 9) == 5 and words[0] == 9


def test_fetch_add_returns_the_previous_value():
    words = np.array([2**62], np.int64)
    assert py_fetch_add(words, 0, 3) == 2**62
    assert words[0] == 2**62 + 3


@kernel
def _wait_for(words, index, value, spins_max):
    spins = 0
    while load_acquire(words, index) != value:
        spins += 1
        if spins >= spins_max:
            return -1
    fence()
    store_release(words, index + 1, spins)
    return compare_and_swap(words, index + 2, 0, 1)


def test_a_spin_loop_sees_another_threads_store():
    words = np.zeros(3, np.int64)
    results = []
    waiter = threading.Thread(target=lambda: results.append(_wait_for(words, 0, 42, 10**11)),
                              daemon=True)
    waiter.start()
    py_store_release(words, 0, 42)
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the spin loop never saw the store"
    assert results == [0] and words[2] == 1
