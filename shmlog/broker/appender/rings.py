"""The rings an appender drains, by slot: their views for the compiled loop, their
per-ring state (``layout``: ``RING_*``) and their queues of parked completions.

Rules
-----
* A ring's slot (its index) is what the compiled loop, the slow path, the forwarder
  (``ForwardedEntry.ring``) and :meth:`RingTable.resolve_forwarded` name it by. A
  slot freed by :meth:`RingTable.remove` is reused by the next ring added, so the
  tables are as long as the most rings ever drained at once; whoever keeps a slot
  checks :meth:`RingTable.ring_at` is still its ring.
* The ring's head is private (``RING_HEAD``): drained from where its consumer left
  off, never read back from shared memory, which the producer can write.
* The views live in typed lists changed only through ``typed_containers``; a removed
  ring's views are dropped before it is unmapped (a view keeps a mapping alive).
* Parked completions are stored through the ``completions`` kernels only, in ring
  order; a removed ring's go with it (its producer is gone, or its ring poisoned).
* Everything runs on the draining thread.
"""

from __future__ import annotations

import numpy as np

from ...common.errors import LocalProtocolError
from ...native import typed_containers as typed
from ...ring import Ring
from ...shm.completion import CompletionCode
from . import completions
from .layout import (
    PARKED_COLUMNS,
    PARKED_COMPLETIONS_MAX,
    RING_ACTIVE,
    RING_AWAITS_HIGH_WATERMARK,
    RING_CAPACITY,
    RING_COLUMNS,
    RING_HEAD,
    RING_PARKED_COUNT,
    RING_PARKED_FIRST,
    RING_WAKE,
)

__all__ = ["RingTable"]

# What a free ring slot's entries in the compiled loop's lists hold: never read (the
# slot is inactive), they only let go of the removed ring's views.
_EMPTY_WORDS = np.zeros(0, np.int64)
_EMPTY_BYTES = np.zeros(0, np.uint8)


class RingTable:
    """The rings drained, by slot (see the module's rules)."""

    def __init__(self):
        self._rings: list[Ring | None] = []
        # The compiled loop's views, by slot: typed lists, changed only through
        # typed_containers' kernels (see there why).
        self.words = typed.word_arrays(0, 0)
        self.completions = typed.word_arrays(0, 0)
        self.data = typed.byte_arrays(0)
        self.state = np.zeros((0, RING_COLUMNS), np.int64)
        # Parked completions: per ring a circular queue (see RING_PARKED_FIRST).
        self.parked = np.zeros((0, PARKED_COMPLETIONS_MAX, PARKED_COLUMNS), np.int64)

    def add(self, ring: Ring, awaits_high_watermark: bool) -> int:
        """Start draining ``ring`` (from where its consumer left off); its slot."""
        if None in self._rings:
            index = self._rings.index(None)
            self._rings[index] = ring
            typed.set_item(self.words, index, ring.words)
            typed.set_item(self.completions, index, ring.completions)
            typed.set_item(self.data, index, ring.data)
        else:
            index = len(self._rings)
            self._rings.append(ring)
            typed.append_item(self.words, ring.words)
            typed.append_item(self.completions, ring.completions)
            typed.append_item(self.data, ring.data)
            self.state = np.concatenate([self.state, np.zeros((1, RING_COLUMNS), np.int64)])
            self.parked = np.concatenate(
                [self.parked, np.zeros((1,) + self.parked.shape[1:], np.int64)])
        self.state[index, RING_CAPACITY] = ring.capacity
        self.state[index, RING_HEAD] = ring.consumer_head
        self.state[index, RING_ACTIVE] = 1
        self.state[index, RING_AWAITS_HIGH_WATERMARK] = int(awaits_high_watermark)
        self.state[index, RING_PARKED_FIRST] = self.state[index, RING_PARKED_COUNT] = 0
        self.state[index, RING_WAKE] = 0
        return index

    def remove(self, index: int) -> None:
        """Stop draining the ring at ``index`` and unmap it, its parked completions
        with it; a free slot does nothing."""
        ring = self._rings[index]
        if ring is None:
            return
        self.state[index, RING_ACTIVE] = 0
        self.state[index, RING_PARKED_COUNT] = 0
        self._rings[index] = None
        typed.set_item(self.words, index, _EMPTY_WORDS)
        typed.set_item(self.completions, index, _EMPTY_WORDS)
        typed.set_item(self.data, index, _EMPTY_BYTES)
        ring.close()

    def _drained(self, index: int) -> int:
        if not 0 <= index < len(self._rings) or self._rings[index] is None:
            raise LocalProtocolError(f"ring index {index!r} is not being drained")
        return index

    def set_awaits_high_watermark(self, index: int, awaits_high_watermark: bool) -> None:
        """Whether the ring's entries from its next on complete once the high watermark
        covers their batches.

        Raises
        ------
        LocalProtocolError
            No ring is drained at ``index``.
        """
        self._drained(index)
        self.state[index, RING_AWAITS_HIGH_WATERMARK] = int(bool(awaits_high_watermark))

    def awaits_high_watermark(self, index: int) -> bool:
        """Whether the ring's entries wait for the high watermark.

        Raises
        ------
        LocalProtocolError
            No ring is drained at ``index``.
        """
        return bool(self.state[self._drained(index), RING_AWAITS_HIGH_WATERMARK])

    def index_of(self, ring: Ring) -> int | None:
        """The index of a ring being drained, or None (removed, or never added)."""
        for index, candidate in enumerate(self._rings):
            if candidate is ring:
                return index
        return None

    @property
    def ring_list(self) -> list:
        """The rings by index (None where a slot is free)."""
        return list(self._rings)

    def ring_at(self, index: int) -> Ring | None:
        """The ring drained at ``index``, or None (a free slot, or no such index)."""
        return self._rings[index] if 0 <= index < len(self._rings) else None

    # -- completions -------------------------------------------------------------------
    def finish(self, index: int, number: int, result: int, append_time: int, row: int,
               last_offset: int, head: int, row_settings: np.ndarray) -> None:
        """Finish the ring's entry ``number`` as the compiled loop does
        (``completions.finish_entry``): complete or park it, release up to ``head``."""
        ring = self._rings[index]
        completions.finish_entry(ring.words, ring.completions, self.state, self.parked,
                                 row_settings, index, number, result, append_time, row,
                                 last_offset, head)

    def park_forwarded(self, index: int, number: int, head: int) -> None:
        """Park the completion of the ring's entry ``number``, handed to the forwarder,
        until :meth:`resolve_forwarded`; release up to ``head``."""
        completions.park_forwarded(self._rings[index].words, self.state, self.parked, index,
                                   number, head)

    def resolve_forwarded(self, index: int, number: int, result: int, append_time: int) -> bool:
        """Give the forwarded entry ``number`` of the ring at ``index`` its result (it
        completes in ring order: :meth:`complete_parked`); False when no such entry
        waits (its ring was removed, or it was resolved already)."""
        if self.ring_at(index) is None:
            return False
        return bool(completions.resolve_forwarded(self.state, self.parked, index, int(number),
                                                  int(result), int(append_time)))

    def complete_parked(self, row_settings: np.ndarray) -> None:
        """Store the parked completions now decided, each ring's in order; wake the
        producers that sleep on them."""
        completions.complete_parked(self.words, self.completions, self.state, self.parked,
                                    row_settings)
        self.wake_sleepers()

    def wake_sleepers(self) -> None:
        """Wake the producers that slept on completions stored since the last call
        (the kernels mark their rings: ``RING_WAKE``)."""
        marked = self.state[:, RING_WAKE]
        if not marked.any():
            return
        for index in np.flatnonzero(marked):
            marked[index] = 0
            ring = self._rings[index]
            if ring is not None:
                ring.completion_bell.wake()

    def refuse_parked_from(self, row: int, first_offset: int, code: CompletionCode,
                           row_settings: np.ndarray) -> None:
        """Complete with ``-code`` the parked entries waiting for the high watermark of
        ``row`` whose batches end at or above ``first_offset``, in ring order.

        Raises
        ------
        LocalProtocolError
            ``code`` is not a :class:`CompletionCode`.
        """
        if not isinstance(code, CompletionCode):
            raise LocalProtocolError(f"a refusal's code must be a CompletionCode, got {code!r}")
        completions.refuse_parked_from(self.state, self.parked, row, first_offset, -code.value)
        self.complete_parked(row_settings)

    def parked_count(self, row: int, row_settings: np.ndarray) -> int:
        """How many parked entries wait for the high watermark of ``row`` to cover
        their batches."""
        return int(completions.parked_count(self.state, self.parked, row_settings, row))
