"""Completions back to producers: finishing a ring entry, and the completions parked
until a high watermark (or a partition's leader) decides them (Kafka's
``DelayedProduce`` purgatory, for acks=all).

Rules
-----
* :func:`finish_entry` is the one place an entry is finished, by the compiled loop
  and by Python's slow path alike: its completion is stored now, or parked; then
  its space goes back to the producer.
* Completions are acknowledged in ring order (``ring_layout``: the acknowledged count
  covers every entry below it), so a parked completion holds back every later one of
  its ring, whatever partition they went to. A completion behind a parked one is
  parked too, ready (``PARKED_NO_BATCH``) or not.
* A ring's parked completions are at most ``PARKED_COMPLETIONS_MAX`` (a producer
  never has more entries unacknowledged); the loop does not read a ring whose queue
  is full, so :func:`finish_entry` always has room.
* A parked completion waits for its row's high watermark to pass its batch's last
  offset, or (``PARKED_EXTERNAL``, a forwarded entry) for
  :func:`resolve_forwarded`. One the high watermark will never cover (its partition
  went, its offsets were truncated away) is refused by :func:`refuse_parked_from`:
  it completes with the code given once those before it in its ring have.
* These kernels run on the draining thread only, and touch the per-ring state and
  the parked queues (``layout``: ``RING_*``, ``PARKED_*``) and the rings' control
  pages; the per-row settings they only read.

Theory of operation
-------------------
Each ring has a circular queue of parked completions in the appender's ``parked``
array (its oldest at ``RING_PARKED_FIRST``, ``RING_PARKED_COUNT`` of them). An entry
of a ring that awaits the high watermark (a producer with acks=all) is parked with
its result and the last offset of its batch, unless the high watermark covers it
already and nothing waits before it. Whenever a high watermark moves (or a parked
completion is refused or resolved), :func:`complete_parked` stores, ring by ring,
the completions at the head of each queue that are now decided, and stops at the
first that is not.
"""

from __future__ import annotations

from ...native.atomics import store_release
from ...native.jit import kernel
from ...ring import complete_entry
from ...shm import ring_layout as R
from ...shm.completion import CompletionCode
from .layout import (
    PARKED_COMPLETIONS_MAX,
    PARKED_EXTERNAL,
    PARKED_LAST_OFFSET,
    PARKED_NO_BATCH,
    PARKED_NO_ROW,
    PARKED_NUMBER,
    PARKED_RESULT,
    PARKED_ROW,
    PARKED_TIMESTAMP,
    PER_ENTRY_INLINE,
    RING_ACTIVE,
    RING_AWAITS_HIGH_WATERMARK,
    RING_HEAD,
    RING_PARKED_COUNT,
    RING_PARKED_FIRST,
    RING_WAKE,
    ROW_HIGH_WATERMARK,
    ROW_UNDER_MIN_ISR,
)

__all__ = ["finish_entry", "complete_parked", "refuse_parked_from", "parked_count",
           "park_forwarded", "resolve_forwarded"]


@kernel(inline=PER_ENTRY_INLINE)
def _covered(row_settings, row, last_offset):
    """Whether the row's high watermark covers a batch ending at ``last_offset``
    (PARKED_NO_BATCH: nothing to wait for; PARKED_EXTERNAL: never, until
    :func:`resolve_forwarded` says what became of it)."""
    if last_offset < 0:
        return last_offset != PARKED_EXTERNAL
    return last_offset < row_settings[row, ROW_HIGH_WATERMARK]


@kernel
def _park(rings, parked, ring, number, result, timestamp, row, last_offset):
    """Queue a completion behind the ring's parked ones (the caller checked there is
    room: a full queue stops the ring being read)."""
    slot = (rings[ring, RING_PARKED_FIRST] + rings[ring, RING_PARKED_COUNT]) \
        % PARKED_COMPLETIONS_MAX
    entry = parked[ring, slot]
    entry[PARKED_NUMBER] = number
    entry[PARKED_RESULT] = result
    entry[PARKED_TIMESTAMP] = timestamp
    entry[PARKED_ROW] = row
    entry[PARKED_LAST_OFFSET] = last_offset
    rings[ring, RING_PARKED_COUNT] += 1


@kernel(inline=PER_ENTRY_INLINE)
def finish_entry(words, completions, rings, parked, row_settings, ring, number, result,
                 timestamp, row, last_offset, head):
    """The one place an entry is finished: its completion is stored now, or parked
    (its ring awaits the high watermark, which does not yet cover the batch, or
    completions parked before it must go first); then its space goes back.

    ``result`` is a base offset or ``-CompletionCode``, ``timestamp`` the broker's
    append time (-1: none), ``last_offset`` the last offset of the batch the result
    names (-1: none; ``row`` is then not read)."""
    if rings[ring, RING_PARKED_COUNT] > 0 or (rings[ring, RING_AWAITS_HIGH_WATERMARK]
                                             and not _covered(row_settings, row, last_offset)):
        _park(rings, parked, ring, number, result, timestamp, row, last_offset)
    elif complete_entry(words, completions, number, result, timestamp):
        rings[ring, RING_WAKE] = 1
    rings[ring, RING_HEAD] = head
    # Release: the entry's bytes were copied (or refused) before the producer may reuse
    # them. A parked completion needs none of them: it holds its result.
    store_release(words, R.HEAD_WORD, head)


@kernel
def complete_parked(ring_words, ring_completions, rings, parked, row_settings):
    """Store the parked completions whose batches the high watermark now covers, each
    ring's in order: its oldest first, up to the first still waiting. A batch of an
    acks=all ring whose partition is under min.insync.replicas at that moment
    completes with ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` instead of its offset
    (Kafka's ``Partition.checkEnoughReplicasReachOffset``)."""
    for ring in range(rings.shape[0]):
        while rings[ring, RING_ACTIVE] and rings[ring, RING_PARKED_COUNT] > 0:
            first = rings[ring, RING_PARKED_FIRST]
            entry = parked[ring, first]
            row, last_offset = entry[PARKED_ROW], entry[PARKED_LAST_OFFSET]
            if not _covered(row_settings, row, last_offset):
                break
            result = entry[PARKED_RESULT]
            if last_offset >= 0 and rings[ring, RING_AWAITS_HIGH_WATERMARK] \
                    and row_settings[row, ROW_UNDER_MIN_ISR]:
                result = -CompletionCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND.value
            if complete_entry(ring_words[ring], ring_completions[ring], entry[PARKED_NUMBER],
                              result, entry[PARKED_TIMESTAMP]):
                rings[ring, RING_WAKE] = 1
            rings[ring, RING_PARKED_FIRST] = (first + 1) % PARKED_COMPLETIONS_MAX
            rings[ring, RING_PARKED_COUNT] -= 1


@kernel
def refuse_parked_from(rings, parked, row, first_offset, result):
    """Parked completions waiting for the high watermark of ``row`` whose batches end
    at or above ``first_offset`` (0: all of them), which it will never cover (the
    partition went, or those offsets were truncated away): they complete with
    ``result`` once those before them in their ring have. Those ending below
    ``first_offset`` stay parked: after a truncation to ``first_offset`` the new
    leader's log holds them at the same offsets, so the high watermark will cover
    them (the design's note on parked completions across a leadership change)."""
    first_offset = max(first_offset, 0)          # -1 marks "waits for no batch"
    for ring in range(rings.shape[0]):
        for index in range(rings[ring, RING_PARKED_COUNT]):
            entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
            if entry[PARKED_LAST_OFFSET] >= first_offset and entry[PARKED_ROW] == row:
                entry[PARKED_RESULT] = result
                entry[PARKED_TIMESTAMP] = -1
                entry[PARKED_LAST_OFFSET] = -1


@kernel
def parked_count(rings, parked, row_settings, row):
    """How many parked completions wait for the high watermark of ``row`` to cover
    their batches (not those it covers, parked behind another's)."""
    count = 0
    for ring in range(rings.shape[0]):
        for index in range(rings[ring, RING_PARKED_COUNT]):
            entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
            if entry[PARKED_ROW] == row \
                    and not _covered(row_settings, row, entry[PARKED_LAST_OFFSET]):
                count += 1
    return count


@kernel
def park_forwarded(words, rings, parked, ring, number, head):
    """Finish an entry handed to the forwarder: its completion parked as external
    (behind any parked before it, so ring order holds), its space given back at once
    (the forwarder holds a copy of its batch)."""
    _park(rings, parked, ring, number, 0, -1, PARKED_NO_ROW, PARKED_EXTERNAL)
    rings[ring, RING_HEAD] = head
    # Release: the batch was copied out before the producer may reuse its space.
    store_release(words, R.HEAD_WORD, head)


@kernel
def resolve_forwarded(rings, parked, ring, number, result, timestamp):
    """Give the external completion of entry ``number`` of ``ring`` its result; it
    completes once those before it in its ring have. False when no such completion
    waits (its ring was removed, or it was resolved already)."""
    for index in range(rings[ring, RING_PARKED_COUNT]):
        entry = parked[ring, (rings[ring, RING_PARKED_FIRST] + index) % PARKED_COMPLETIONS_MAX]
        if entry[PARKED_NUMBER] == number and entry[PARKED_LAST_OFFSET] == PARKED_EXTERNAL:
            entry[PARKED_RESULT] = result
            entry[PARKED_TIMESTAMP] = timestamp
            entry[PARKED_LAST_OFFSET] = PARKED_NO_BATCH
            return True
    return False
