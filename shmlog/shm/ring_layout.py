"""Shared-memory ring layout, version 3: one producer, one consumer (the appender).

The ring is one POSIX shared-memory object: a 4 KiB control page, then the data
region of ``capacity`` bytes (a power of two). Counters are monotonically
increasing 64-bit byte counts; a position in the data region is ``count % capacity``.
Each hot counter has a cache line of its own, so the producer's stores never
invalidate the line the consumer polls, and the other way round::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                         magic (u32)                           |
    +-------------------------------+-------------------------------+
  4 |         version (u16)         |        reserved (u16)         |
    +-------------------------------+-------------------------------+
  8 |                        capacity (u64)                         |
    +---------------------------------------------------------------+
 16 |                      producer_pid (i64)                       |
    +---------------------------------------------------------------+
 24 |                   (padding to the cache line)                 |
    +===============================================================+
 64 |                 tail (u64, bytes published)                   |  producer's line
 72 |              published (u64, entries published)               |
 80 |                   producer_closed (u64)                       |
 88 |                   (padding to the cache line)                 |
    +===============================================================+
128 |                 head (u64, bytes released)                    |  consumer's line
136 |            acknowledged (u64, entries completed)              |
144 |                   consumer_error (i64)                        |
152 |                   (padding to the cache line)                 |
    +===============================================================+
192 |              completion_sleepers (i64, producers)             |  the sleepers' line
200 |                   (rest of the control page)                  |
    +===============================================================+
4096| completion slots: COMPLETION_SLOTS x (result i64, timestamp i64)|
    +===============================================================+
8192| data: entries back to back, each 8-byte aligned               |
    +---------------------------------------------------------------+

Entry (8-byte aligned in the data region)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                     entry_length (u32)                        |
    +---------------------------------------------------------------+
  4 |                          row (u32)                            |
    +---------------------------------------------------------------+
  8 |                     entry_number (u64)                        |
    +                                                               +
    +---------------------------------------------------------------+
 16 |                       topic_key (i64)                         |
    +                                                               +
    +---------------------------------------------------------------+
 24 |                       partition (u32)                         |
    +---------------------------------------------------------------+
 28 |                        reserved (u32)                         |
    +===============================================================+
 32 | payload ...                                                   |
    +---------------------------------------------------------------+

* ``entry_length`` counts the 32-byte entry header and the payload, not the padding
  to the next multiple of 8. The payload is whatever the producer sends (a record
  batch in the log's format). ``entry_number`` is the entry's place in the
  producer's sequence of puts: the consumer completes an entry under its own
  number, so a consumer that restarts after a crash and reads an entry again (its
  space was not yet released) completes the same slot again instead of shifting
  every later result.
* Where the payload goes: ``row`` is the partition's row in the broker's state
  table (where the appender finds it at once), ``topic_key`` (the topic id as the
  state table keeps it) and ``partition`` name the partition itself. Rows are
  reused once a topic is deleted, and a broker that lost its row map after a crash
  hands out new ones, so a row alone could name another partition than the
  producer meant: the consumer appends an entry only to the partition its
  ``topic_key`` and ``partition`` name, and refuses it when none of them is hosted.
* An entry never wraps. When it does not fit before the end of the data region,
  the producer writes ``PADDING_MARKER`` as the length at the current position and
  the entry starts at position 0; the consumer skips to the end on a marker.
* Publication: the producer writes the entry (and any marker), then stores the new
  ``tail`` with release ordering; "a tail that covers an entry commits it". The
  consumer loads ``tail`` with acquire ordering, so every byte below it is complete.
  It frees space by storing ``head`` with release ordering after it has finished
  with the entries below it; the producer loads ``head`` with acquire ordering
  before reusing the space.
* Completion: entries are numbered from 0 in the order they are put. When the
  consumer has finished entry ``k`` (appended it, or rejected it) it writes slot
  ``k % COMPLETION_SLOTS`` (a result: a base offset >= 0 or a negative error code,
  and a timestamp), then stores ``acknowledged = k + 1`` with release ordering
  (never lowering it): the count acknowledges every entry below it, so entries
  are completed in order. An entry's space is released once the consumer is done
  with its bytes: after its completion, or before it when the completion waits for
  something else (an acks=all entry waits for its partition's high watermark; the
  consumer then keeps the result itself). The producer loads ``acknowledged`` with
  acquire ordering and copies the results out; it never has more than
  ``COMPLETION_SLOTS`` entries whose results it has not yet copied, so no slot is
  overwritten before it is read, and a consumer holding results back never holds
  more than that many.
* Waiting for completions: a producer that waits for one sleeps on the low 32 bits
  of ``acknowledged`` (a futex: every store to it is a new value), counted in
  ``completion_sleepers`` while it does, with ``wakeup.Doorbell``'s handshake (the
  count raised, a fence, the count of acknowledged entries loaded, the futex
  refusing a stale one). The consumer, after each store to ``acknowledged``, fences
  and loads ``completion_sleepers``; non-zero, it makes the futex wake-up call once
  it has finished its pass over the rings. A layout-3 ring whose producer never
  waits this way keeps the word 0, so a consumer makes no calls for it.
* ``producer_closed`` (producer) says no entry will follow; ``consumer_error``
  (consumer, non-zero) says the consumer has stopped reading this ring and why.
* The consumer trusts nothing in the data region: a length that is too short, runs
  past the tail or past the end of the region marks the ring corrupt; the entries
  before it stand, nothing after it is read.

Shared memory is input. The producer (and any member of the data group, with a
group) can write every word of its ring at any time; the broker (the consumer)
checks each word it reads before it uses it, and a bad word costs the ring, never
the broker nor another producer's entries or another user's reads. The producer
checks the one word it reads back that decides where it writes (``acknowledged``)::

  word              writer     broker reads it       check, and what a bad value costs
  ----              ------     ---------------       ---------------------------------
  magic, version    producer   at attach             this layout's: CorruptRingError, the
                                                     ring is not registered (or left alone)
  capacity          producer   at attach             the object's data size, and a power of
                                                     two in [CAPACITY_MIN, CAPACITY_MAX]:
                                                     CorruptRingError, not registered
  producer_pid      producer   liveness check        0 < pid <= limits.PID_MAX and alive
                                                     (process_alive): else the producer is
                                                     gone, its ring drained and reclaimed
  tail              producer   every drain (acq.)    0 <= tail - head <= capacity: else the
                                                     ring is poisoned (consumer_error) and
                                                     unmapped
  published         producer   stats only            none needed: reported as read, never
                                                     used (Python ints: no overflow)
  producer_closed   producer   never                 -
  head              broker     at attach; stats      >= 0 and ENTRY_ALIGNMENT-aligned (the
                                                     consumer's own copy is used from then
                                                     on): CorruptRingError, not registered
  acknowledged      broker     before its own store  only compared (never lowered): a bad
                                                     value only withholds this producer's
                                                     acknowledgements; the producer takes it
                                                     only between what it harvested and what
                                                     it put (``harvest_completions``), else
                                                     it takes nothing (its sends time out)
  consumer_error    broker     never                 -
  completion_       producer   after each store to   only decides whether the broker makes
  sleepers                     acknowledged          a futex wake-up call after its pass: a
                                                     bad value costs a call too many, or a
                                                     sleeper left to its timeout
  completion slots  broker     never                 -
  entry_length      producer   every entry           >= ENTRY_HEADER_LENGTH, within the
                                                     region and below the tail: else poison
  entry_number      producer   every entry           >= 0: else poison; its slot is taken
                                                     modulo COMPLETION_SLOTS (this ring's)
  row               producer   every entry           below the appender's rows, and the
                                                     partition its identity names: else the
                                                     slow path finds it by the identity
  topic_key,        producer   every entry           compared with hosted partitions: none
  partition                                          is the entry refused (UNKNOWN_PARTITION)
  payload           producer   every entry           the batch checks (``validation``), and
                                                     its CRC on the copy in the log
"""

from __future__ import annotations

from ..common.errors import LocalProtocolError

MAGIC = 0x474E5253                    # "SRNG" read as little-endian bytes
VERSION = 3
CACHE_LINE_SIZE = 64
WORD_SIZE = 8

MAGIC_OFFSET = 0
MAGIC_SIZE = 4
VERSION_OFFSET = MAGIC_OFFSET + MAGIC_SIZE
VERSION_SIZE = 2
RESERVED_OFFSET = VERSION_OFFSET + VERSION_SIZE
RESERVED_SIZE = 2
CAPACITY_OFFSET = RESERVED_OFFSET + RESERVED_SIZE
CAPACITY_SIZE = 8
PRODUCER_PID_OFFSET = CAPACITY_OFFSET + CAPACITY_SIZE
PRODUCER_PID_SIZE = 8
HEADER_END = PRODUCER_PID_OFFSET + PRODUCER_PID_SIZE

TAIL_OFFSET = CACHE_LINE_SIZE                          # padding row: producer's line
PUBLISHED_OFFSET = TAIL_OFFSET + WORD_SIZE
PRODUCER_CLOSED_OFFSET = PUBLISHED_OFFSET + WORD_SIZE
HEAD_OFFSET = TAIL_OFFSET + CACHE_LINE_SIZE            # padding row: consumer's line
ACKNOWLEDGED_OFFSET = HEAD_OFFSET + WORD_SIZE
CONSUMER_ERROR_OFFSET = ACKNOWLEDGED_OFFSET + WORD_SIZE
COMPLETION_SLEEPERS_OFFSET = HEAD_OFFSET + CACHE_LINE_SIZE   # padding row: the sleepers'
CONTROL_SIZE = 4096

# 256 results in flight per producer: far more batches than a producer keeps
# unacknowledged (Kafka's max.in.flight is 5 requests), in one page.
COMPLETION_SLOTS = 256
COMPLETION_RESULT_OFFSET = 0
COMPLETION_TIMESTAMP_OFFSET = COMPLETION_RESULT_OFFSET + WORD_SIZE
COMPLETION_SIZE = COMPLETION_TIMESTAMP_OFFSET + WORD_SIZE
COMPLETIONS_OFFSET = CONTROL_SIZE
DATA_OFFSET = COMPLETIONS_OFFSET + COMPLETION_SLOTS * COMPLETION_SIZE  # page-aligned

# Word indexes into the control page viewed as int64 (what the atomics take).
CAPACITY_WORD = CAPACITY_OFFSET // WORD_SIZE
PRODUCER_PID_WORD = PRODUCER_PID_OFFSET // WORD_SIZE
TAIL_WORD = TAIL_OFFSET // WORD_SIZE
PUBLISHED_WORD = PUBLISHED_OFFSET // WORD_SIZE
PRODUCER_CLOSED_WORD = PRODUCER_CLOSED_OFFSET // WORD_SIZE
HEAD_WORD = HEAD_OFFSET // WORD_SIZE
ACKNOWLEDGED_WORD = ACKNOWLEDGED_OFFSET // WORD_SIZE
CONSUMER_ERROR_WORD = CONSUMER_ERROR_OFFSET // WORD_SIZE
COMPLETION_SLEEPERS_WORD = COMPLETION_SLEEPERS_OFFSET // WORD_SIZE
COMPLETION_WORDS = COMPLETION_SIZE // WORD_SIZE
COMPLETION_RESULT_WORD = COMPLETION_RESULT_OFFSET // WORD_SIZE
COMPLETION_TIMESTAMP_WORD = COMPLETION_TIMESTAMP_OFFSET // WORD_SIZE

ENTRY_LENGTH_OFFSET = 0
ENTRY_LENGTH_SIZE = 4
ENTRY_ROW_OFFSET = ENTRY_LENGTH_OFFSET + ENTRY_LENGTH_SIZE
ENTRY_ROW_SIZE = 4
ENTRY_NUMBER_OFFSET = ENTRY_ROW_OFFSET + ENTRY_ROW_SIZE
ENTRY_NUMBER_SIZE = 8
ENTRY_TOPIC_KEY_OFFSET = ENTRY_NUMBER_OFFSET + ENTRY_NUMBER_SIZE
ENTRY_TOPIC_KEY_SIZE = 8
ENTRY_PARTITION_OFFSET = ENTRY_TOPIC_KEY_OFFSET + ENTRY_TOPIC_KEY_SIZE
ENTRY_PARTITION_SIZE = 4
ENTRY_RESERVED_OFFSET = ENTRY_PARTITION_OFFSET + ENTRY_PARTITION_SIZE
ENTRY_RESERVED_SIZE = 4
ENTRY_HEADER_LENGTH = ENTRY_RESERVED_OFFSET + ENTRY_RESERVED_SIZE
ENTRY_ALIGNMENT = 8
PADDING_MARKER = 0xFFFFFFFF

CAPACITY_MIN = 4096
CAPACITY_MAX = 1 << 31                # entry lengths are u32 and below the marker

assert HEADER_END <= TAIL_OFFSET, "the header fits its cache line"
assert TAIL_OFFSET % CACHE_LINE_SIZE == 0 and HEAD_OFFSET % CACHE_LINE_SIZE == 0
assert HEAD_OFFSET + CACHE_LINE_SIZE <= CONTROL_SIZE
assert PRODUCER_CLOSED_OFFSET < HEAD_OFFSET
assert CONSUMER_ERROR_OFFSET < HEAD_OFFSET + CACHE_LINE_SIZE
assert DATA_OFFSET % 4096 == 0
assert CAPACITY_OFFSET % WORD_SIZE == 0 and PRODUCER_PID_OFFSET % WORD_SIZE == 0
assert ENTRY_HEADER_LENGTH % ENTRY_ALIGNMENT == 0
assert ENTRY_NUMBER_OFFSET % WORD_SIZE == 0 and ENTRY_TOPIC_KEY_OFFSET % WORD_SIZE == 0
assert CAPACITY_MAX < PADDING_MARKER


def aligned_entry_size(payload_length: int) -> int:
    """Bytes an entry with this payload takes in the ring, padding included."""
    size = ENTRY_HEADER_LENGTH + payload_length
    return (size + ENTRY_ALIGNMENT - 1) // ENTRY_ALIGNMENT * ENTRY_ALIGNMENT


def check_capacity(capacity: int) -> int:
    """A valid data-region size: a power of two in [CAPACITY_MIN, CAPACITY_MAX]."""
    if not (isinstance(capacity, int) and CAPACITY_MIN <= capacity <= CAPACITY_MAX
            and capacity & (capacity - 1) == 0):
        raise LocalProtocolError(f"ring capacity must be a power of two in [{CAPACITY_MIN}, "
                         f"{CAPACITY_MAX}], got {capacity!r}")
    return capacity
