"""The appender's tables and the codes its compiled loop answers with: layout only.

The compiled loop (``drain``) and the Python around it (``appender``, ``rings``,
``partition_rows``) share three int64 tables; each column has one name here, so no
call site holds a bare number:

* the per-ring state (``RING_*``): one row per ring slot, written by ``rings`` when a
  ring is added or removed and by the loop as it reads entries (``RING_HEAD``);
* the parked completions (``PARKED_*``): per ring a circular queue of
  ``PARKED_COMPLETIONS_MAX`` completions (ring x slot x column), written only by the
  kernels of ``completions``;
* the per-row settings (``ROW_*``): one row per partition, its row in the state
  table, written by ``partition_rows`` (registration, refresh, replication's
  marks) and by the loop (``ROW_HIGH_WATERMARK`` as it publishes).

Rules
-----
* A column is read and written through its name only; a new column goes last,
  before its table's ``*_COLUMNS`` count, which sizes the arrays.
* The drain codes (``DRAIN_*``) and the report's slots (``REPORT_*``) are the loop's
  whole answer to Python; the loop never raises.
"""

from __future__ import annotations

import enum

from ...shm import ring_layout as R


class HighWatermarkPolicy(enum.IntEnum):
    """Who moves a partition's high watermark."""
    LOG_END = 0                # it follows the log end (no replicas: every partition today)
    EXTERNAL = 1               # Appender.advance_high_watermark moves it (replication)


# drain results
DRAIN_IDLE = 0                 # every ring is empty
DRAIN_BUDGET = 1               # entries_max entries handled; call again
DRAIN_SLOW = 2                 # report = (ring, position, length): Python's turn
DRAIN_POISON = 3               # report = (ring, position, length): garbage in a ring
REPORT_FINISHED = 4            # report[4]: entries the call finished (appended or refused)
REPORT_LENGTH = 5

# columns of the per-ring state array
RING_CAPACITY = 0
RING_HEAD = 1                  # private head: never read back from shared memory
RING_ACTIVE = 2
RING_AWAITS_HIGH_WATERMARK = 3  # completions wait until the high watermark covers the batch
RING_PARKED_FIRST = 4          # the ring's queue of parked completions: its oldest ...
RING_PARKED_COUNT = 5          # ... and how many
RING_WAKE = 6                  # its producer sleeps on completions stored this pass
RING_COLUMNS = 7

# columns of a parked completion (the per-ring queues: ring x slot x column)
PARKED_NUMBER = 0              # the entry's number
PARKED_RESULT = 1
PARKED_TIMESTAMP = 2
PARKED_ROW = 3                 # the partition whose high watermark it waits for ...
PARKED_LAST_OFFSET = 4         # ... to pass this offset (or one of the two marks below)
PARKED_COLUMNS = 5
# PARKED_LAST_OFFSET marks: the entry waits only for those before it in its ring; or
# it was forwarded to the partition's leader and waits for resolve_forwarded (its
# row is then PARKED_NO_ROW: no high watermark of this broker decides it).
PARKED_NO_BATCH = -1
PARKED_EXTERNAL = -2
PARKED_NO_ROW = -1
# A producer never has more than COMPLETION_SLOTS entries unacknowledged, and a
# parked entry is unacknowledged (see the appender's rules).
PARKED_COMPLETIONS_MAX = R.COMPLETION_SLOTS

# columns of the per-row settings array (one row per partition: its row in the table)
ROW_REGISTERED = 0
ROW_FAST = 1                   # uncompressed batches may be appended in compiled code
ROW_SEGMENT_BYTES = 2
ROW_SEGMENT_MS = 3
ROW_INDEX_INTERVAL = 4
ROW_BATCH_SIZE_MAX = 5
ROW_LOG_START_OFFSET = 6
ROW_GENERATION = 7
ROW_TOPIC_KEY = 8              # the identity entries for this row must carry
ROW_PARTITION = 9
ROW_INTERNAL = 10              # producers' entries are refused (the broker appends itself)
ROW_LEADER_EPOCH = 11          # stamped on every batch appended
ROW_HIGH_WATERMARK_POLICY = 12  # a HighWatermarkPolicy
ROW_HIGH_WATERMARK = 13        # the high watermark published (LOG_END: the log end)
ROW_UNDER_MIN_ISR = 14         # fewer in-sync replicas than min.insync.replicas (acks=all)
ROW_NOT_LEADER = 15            # another broker leads it: producers' entries go to Python
ROW_FENCED = 16                # its leadership may be lost (set_fenced): acks=all refused
ROW_FIRST_UNSTABLE_OFFSET = 17  # the first offset of its oldest open transaction, or -1
ROW_ABORTED_GENERATION = 18    # changes with its aborted transactions (.txnindex)
ROW_COLUMNS = 19

# Entries handled per call before Python looks up again (signals, shutdown, timers).
DRAIN_ENTRIES_MAX = 4096
LEADER_EPOCH_MAX = (1 << 31) - 1   # the batch header's leader_epoch is an i32


# The kernels every entry passes through are inlined into the loop (numba's IR
# inlining): called as functions, the arrays they take (up to ten) cost reference
# counting on every entry, which measured 15-25 % more CPU per entry of one small
# batch than the loop written out in one piece (inlined: within ~10 %).
PER_ENTRY_INLINE = "always"
