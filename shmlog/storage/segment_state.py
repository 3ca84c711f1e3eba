"""The append state of a segment: one int64 array shared by Python and the kernels.

Every :class:`~shmlog.storage.log_segment.Segment` holds its state in ``STATE_WORDS`` int64
words (a numpy array, so compiled code reads and writes it in place). The state
is process-private: it lives in the broker's memory, never in a file or in shared
memory, so it has no version; readers in other processes learn what they need
from the partition state table (``state_layout``). It is laid out as below (word
``NAME`` is at index ``NAME_WORD``)::

    word  name               what it holds                                written by
    ----  -----------------  -------------------------------------------  ----------
      0   POSITION           bytes of valid data in the log file          append, rescan
      1   NEXT_OFFSET        offset after the last batch (log end)        append, rescan
      2   BASE_OFFSET        the segment's base offset (fixed)            creation
      3   CAPACITY           bytes of the log mapped                      mapping, seal
                             (segment.bytes while active)
      4   RESERVED           log bytes reserved on disk from byte 0       reservation, seal,
                                                                          truncation
      5   SINCE_INDEX        log bytes since the last offset-index entry  append, rescan
      6   OFFSET_ENTRIES     entries in the offset index                  append, rescan
      7   OFFSET_CAPACITY    slots of the offset index mapped             mapping
      8   TIME_ENTRIES       entries in the time index                    append, rescan, seal
      9   TIME_CAPACITY      slots of the time index mapped               mapping
     10   MAX_TIMESTAMP      running maximum timestamp                    append, rescan
                             (TIMESTAMP_NONE while empty)
     11   INDEXED_TIMESTAMP  timestamp of the last time-index entry       append, rescan, seal
     12   ROLL_TIMESTAMP     max timestamp of the first batch, what       append, rescan
                             segment.ms measures from
     13   OFFSET_RESERVED    offset-index bytes reserved from byte 0      reservation, seal
     14   TIME_RESERVED      time-index bytes reserved from byte 0        reservation, seal

Rules
-----
* One writer at a time: the partition's writer (the appender's compiled loop
  through :func:`segment_append.append_batches`, or ``PartitionLog.append``) writes the
  append words; the reservation words are written under the segment's
  reservation lock (the prefaulter thread reserves too); the capacity words only
  when the files are mapped, sealed or rebuilt, never while an append runs.
* Nothing is ever stored past what the reservation words say is reserved: the
  append kernel checks ``RESERVED``, ``OFFSET_RESERVED`` and ``TIME_RESERVED``
  before every batch and answers ``NEED_SPACE`` instead (see ``segment_append``).
* ``POSITION`` and ``NEXT_OFFSET`` are what the writer publishes (the active
  segment's size, the log end offset); the writer reads them after an append.

Append outcomes (the first value :func:`segment_append.append_batches` returns)
------------------------------------------------------------------------------
``APPENDED`` every batch is in; ``NEED_ROLL`` the batch at the returned position
needs a new segment; ``NEED_SPACE`` it needs more disk reserved (log bytes or
index slots); ``REJECTED`` it failed validation and nothing of it is in the log.

Timestamp lookup outcomes (``segment_read``'s time-index search)
----------------------------------------------------------------
``LOOKUP_FOUND``, ``LOOKUP_NOT_FOUND``, ``LOOKUP_INFLATE`` (the record is in a
compressed batch: Python inflates it), ``LOOKUP_DAMAGED`` (a batch on the way
fails its check).
"""

from __future__ import annotations

import numpy as np

POSITION_WORD = 0
NEXT_OFFSET_WORD = POSITION_WORD + 1
BASE_OFFSET_WORD = NEXT_OFFSET_WORD + 1
CAPACITY_WORD = BASE_OFFSET_WORD + 1
RESERVED_WORD = CAPACITY_WORD + 1
SINCE_INDEX_WORD = RESERVED_WORD + 1
OFFSET_ENTRIES_WORD = SINCE_INDEX_WORD + 1
OFFSET_CAPACITY_WORD = OFFSET_ENTRIES_WORD + 1
TIME_ENTRIES_WORD = OFFSET_CAPACITY_WORD + 1
TIME_CAPACITY_WORD = TIME_ENTRIES_WORD + 1
MAX_TIMESTAMP_WORD = TIME_CAPACITY_WORD + 1
INDEXED_TIMESTAMP_WORD = MAX_TIMESTAMP_WORD + 1
ROLL_TIMESTAMP_WORD = INDEXED_TIMESTAMP_WORD + 1
OFFSET_RESERVED_WORD = ROLL_TIMESTAMP_WORD + 1
TIME_RESERVED_WORD = OFFSET_RESERVED_WORD + 1
STATE_WORDS = TIME_RESERVED_WORD + 1

# No timestamp yet (an empty segment), and "keep the producer's" as the append
# kernel's broker-time argument: no real timestamp is this small (batch_layout's
# NO_TIMESTAMP, -1, is far above it).
TIMESTAMP_NONE = int(np.iinfo(np.int64).min)

# What segment_append.append_batches returns first.
APPENDED = 0
NEED_ROLL = 1
NEED_SPACE = 2
REJECTED = 3

# What the time-index search returns first.
LOOKUP_FOUND = 0
LOOKUP_NOT_FOUND = 1
LOOKUP_INFLATE = 2
LOOKUP_DAMAGED = 3

assert STATE_WORDS == 15
assert len({APPENDED, NEED_ROLL, NEED_SPACE, REJECTED}) == 4
assert len({LOOKUP_FOUND, LOOKUP_NOT_FOUND, LOOKUP_INFLATE, LOOKUP_DAMAGED}) == 4


def new_segment_state(base_offset: int) -> np.ndarray:
    """The state of an empty segment at ``base_offset``: nothing mapped, reserved
    or indexed, no timestamp yet."""
    state = np.zeros(STATE_WORDS, np.int64)
    state[BASE_OFFSET_WORD] = base_offset
    state[NEXT_OFFSET_WORD] = base_offset
    state[MAX_TIMESTAMP_WORD] = TIMESTAMP_NONE
    state[INDEXED_TIMESTAMP_WORD] = TIMESTAMP_NONE
    state[ROLL_TIMESTAMP_WORD] = TIMESTAMP_NONE
    return state
