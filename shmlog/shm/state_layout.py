"""Partition state table layout, version 5: what the broker publishes about every
partition it hosts, for consumers on the same host to read without a syscall.

Two POSIX shared-memory objects. The *table* (``<prefix>-state``) is the broker's
alone: only its user may write it (0600, or 0640 with a ``data_group``, so the
group maps it read-only). It holds a 4 KiB control page, the journal of changed
rows (``limits.STATE_JOURNAL_CAPACITY`` slots of 8 bytes), then one 128-byte row
(two cache lines of its own, so publishing one partition never disturbs readers of
another) per partition slot. The *doorbells* (``<table name>-bells``, :data:`BELLS_SUFFIX`)
hold the only words clients write: producers ring the appender's doorbell and
consumers count themselves among the sleepers on theirs, so that object is 0660
with a group (``access``). All fields are little-endian int64 words::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
  0 |                         magic (u32)                           |
    +-------------------------------+-------------------------------+
  4 |         version (u16)         |        reserved (u16)         |
    +-------------------------------+-------------------------------+
  8 |                      row_capacity (i64)                       |
    +---------------------------------------------------------------+
 16 |                       broker_pid (i64)                        |
    +---------------------------------------------------------------+
 24 |               broker_epoch (i64, start time in ns)            |
    +---------------------------------------------------------------+
 32 |                   (padding to the cache line)                 |
    +===============================================================+
 64 |   (four lines, reserved: the doorbells of version 3, whose    |
    |    words moved to the doorbell object below)                  |
320 |           journal_sequence (i64): slots published             |
384 |   journal_written (i64)   |   journal_pending (i64)           |  the broker's
    +===============================================================+
4096| journal slot 0: a row number (i64)                            |
4104| journal slot 1 ...                      (JOURNAL_CAPACITY)    |
    +===============================================================+
ROWS| row 0: one cache line, see below          (ROWS_OFFSET)       |
    +---------------------------------------------------------------+
    | row 1 ...                                                     |

Doorbell object (``BELLS_SIZE`` bytes; the words keep their version-3 offsets)::

  0 | magic "SLDB" (u32) | version (u16) | reserved (u16)            |
 64 | appender_sequence (i64): producers' doorbell                   |  one line each
128 | appender_sleepers (i64)                                        |
192 | consumer_sequence (i64): the broker's doorbell                 |
256 | consumer_sleepers (i64)                                        |

Row (its first line what every reader reads, its second what a read_committed one
adds)::

   0 | log_start_offset | 8 | log_end_offset | 16 | high_watermark |
  24 | active_segment_base_offset | 32 | segment_generation |
  40 | topic_key | 48 | partition | 56 | active_segment_size |
  64 | last_stable_offset | 72 | aborted_generation | 80-127 reserved |

* The broker is the only writer of the table, and the permissions say so: a
  client maps it read-only, and a member of the data group cannot open it for
  writing (EACCES). It writes a row's other fields first and the high
  watermark last, with a release store: "a high watermark covers bytes already in
  the segment files". A reader loads the high watermark with acquire ordering and
  may then read every record below it from the mapped segments.
* ``active_segment_size`` is where the published data of the active segment ends:
  every byte below it belongs to complete batches with final offsets. A reader
  never looks past it (what lies beyond may be a batch still being copied).
* ``segment_generation`` changes whenever the set of segment files changes (roll,
  retention, truncation, a compaction swap); a reader lists the partition
  directory only then. It is a seqlock, whose rules ``segment_generation`` holds.
* Two doorbells (``wakeup.Doorbell``) let idle processes sleep: producers ring
  the appender's after every ring entry they publish, so an idle broker sleeps until
  one does; the broker rings the consumers' after every drain that published
  records. A sequence counts rings, a sleepers word counts who sleeps on it.
* ``last_stable_offset`` (Kafka's LSO) is the first offset of the oldest
  transaction still open in the partition, or the high watermark when none is
  (never above it): a ``read_committed`` reader reads below it alone. It is stored
  (release) before the high watermark, after the transaction index entries it
  covers. ``aborted_generation`` changes whenever the partition's aborted
  transactions (its ``.txnindex`` files) change: a reader reads them again only
  then.
* ``topic_key`` and ``partition`` name the row's owner (``topic_key`` is derived
  from the topic id), so a reader can check it holds the row it asked for;
  ``topic_key`` 0 marks a free row.
* The journal says which rows changed, in order, so a consumer holding thousands of
  partitions reads only those: every publish of a row (its high watermark, log
  start, segments, or its freeing) names the row in slot ``journal_written mod
  JOURNAL_CAPACITY`` after the row's own stores, unless it is named already among
  the slots written since ``journal_sequence`` was last stored; ``journal_sequence``
  (the count of slots covered) is stored with release after the slots it covers,
  every ``JOURNAL_UNFLUSHED_MAX`` publishes and at the end of each drain pass. A
  reader that saw sequence ``s`` loads it again (acquire), reads the slots from
  ``s`` on, fences and loads it once more: slots the broker may have written over
  meanwhile (more than ``JOURNAL_CAPACITY - JOURNAL_UNFLUSHED_MAX`` new) or a
  sequence that went backwards mean a full look at every row instead. The rows a
  reader learns of this way are hints: it checks each against its own (the row
  still names its partition) as on every read. ``journal_written`` and
  ``journal_pending`` (publishes since the sequence was stored) are the broker's
  cursor; readers never look at them.

Who writes each word, who reads it, and the check (a member of the data group can
write only the doorbell object; the broker's own user and root can write anything)::

  word                      writer        reader                check on read
  ----                      ------        ------                -------------
  magic, version            broker        clients (attach)      equal to this layout's
  row_capacity              broker        clients (attach)      equal to the rows mapped
  broker_pid                broker        consumers (liveness)  process_alive: 0 < pid <= PID_MAX
  broker_epoch              broker        nobody on a hot path  -
  journal_sequence          broker        consumers             moved back or too far: lapped,
                                                                every row is read instead
  journal_written, _pending broker        broker                window checked (state.journal_note)
  journal slots             broker        consumers             hints: rows outside the table
                                                                or not the reader's are skipped
  row: topic_key, partition broker        consumers             must name the reader's partition,
                                                                else UnknownTopicOrPartitionError
  row: offsets, generation, broker        consumers             ranges (state.check_row): else
       active segment base,                                     StateTableInconsistentError
       active segment size,
       last stable offset
  row: aborted_generation   broker        read_committed        none needed: any change only
                                          consumers             makes a reader read the
                                                                .txnindex files again
  appender_sequence         producers,    broker (futex value)  none needed: any value only
                            broker                              wakes, or lets sleep until the
  appender_sleepers         broker        producers             timeout, a bounded wait
  consumer_sequence         broker        consumers (futex)     same
  consumer_sleepers         consumers     broker                same: a wrong count costs a
                                                                wake-up or a futex call
"""

from __future__ import annotations

from ..common import limits

MAGIC = 0x54534C53                    # "SLST" read as little-endian bytes
VERSION = 5
BELLS_MAGIC = 0x42444C53              # "SLDB" read as little-endian bytes
BELLS_VERSION = 1
BELLS_SUFFIX = "-bells"
CACHE_LINE_SIZE = 64
WORD_SIZE = 8

MAGIC_OFFSET = 0
MAGIC_SIZE = 4
VERSION_OFFSET = MAGIC_OFFSET + MAGIC_SIZE
VERSION_SIZE = 2
RESERVED_OFFSET = VERSION_OFFSET + VERSION_SIZE
RESERVED_SIZE = 2
ROW_CAPACITY_OFFSET = RESERVED_OFFSET + RESERVED_SIZE
ROW_CAPACITY_SIZE = 8
BROKER_PID_OFFSET = ROW_CAPACITY_OFFSET + ROW_CAPACITY_SIZE
BROKER_PID_SIZE = 8
BROKER_EPOCH_OFFSET = BROKER_PID_OFFSET + BROKER_PID_SIZE
BROKER_EPOCH_SIZE = 8
HEADER_END = BROKER_EPOCH_OFFSET + BROKER_EPOCH_SIZE
# The doorbell object's words (one line each), and the table's lines they used to
# hold in version 3, reserved there now so the journal keeps its place.
APPENDER_SEQUENCE_OFFSET = CACHE_LINE_SIZE
APPENDER_SLEEPERS_OFFSET = APPENDER_SEQUENCE_OFFSET + CACHE_LINE_SIZE
CONSUMER_SEQUENCE_OFFSET = APPENDER_SLEEPERS_OFFSET + CACHE_LINE_SIZE
CONSUMER_SLEEPERS_OFFSET = CONSUMER_SEQUENCE_OFFSET + CACHE_LINE_SIZE
BELLS_SIZE = CONSUMER_SLEEPERS_OFFSET + CACHE_LINE_SIZE
JOURNAL_SEQUENCE_OFFSET = CONSUMER_SLEEPERS_OFFSET + CACHE_LINE_SIZE
JOURNAL_WRITTEN_OFFSET = JOURNAL_SEQUENCE_OFFSET + CACHE_LINE_SIZE     # the broker's line
JOURNAL_PENDING_OFFSET = JOURNAL_WRITTEN_OFFSET + WORD_SIZE
CONTROL_PAGE_SIZE = 4096
JOURNAL_CAPACITY = limits.STATE_JOURNAL_CAPACITY
JOURNAL_UNFLUSHED_MAX = limits.STATE_JOURNAL_UNFLUSHED_MAX
JOURNAL_SLOT_MASK = JOURNAL_CAPACITY - 1
JOURNAL_SLOTS_OFFSET = CONTROL_PAGE_SIZE
JOURNAL_SLOT_SIZE = WORD_SIZE
CONTROL_SIZE = JOURNAL_SLOTS_OFFSET + JOURNAL_CAPACITY * JOURNAL_SLOT_SIZE
ROWS_OFFSET = CONTROL_SIZE

LOG_START_OFFSET_OFFSET = 0
LOG_END_OFFSET_OFFSET = LOG_START_OFFSET_OFFSET + WORD_SIZE
HIGH_WATERMARK_OFFSET = LOG_END_OFFSET_OFFSET + WORD_SIZE
ACTIVE_SEGMENT_BASE_OFFSET_OFFSET = HIGH_WATERMARK_OFFSET + WORD_SIZE
SEGMENT_GENERATION_OFFSET = ACTIVE_SEGMENT_BASE_OFFSET_OFFSET + WORD_SIZE
TOPIC_KEY_OFFSET = SEGMENT_GENERATION_OFFSET + WORD_SIZE
PARTITION_OFFSET = TOPIC_KEY_OFFSET + WORD_SIZE
ACTIVE_SEGMENT_SIZE_OFFSET = PARTITION_OFFSET + WORD_SIZE
LAST_STABLE_OFFSET_OFFSET = CACHE_LINE_SIZE               # the second line: transactions
ABORTED_GENERATION_OFFSET = LAST_STABLE_OFFSET_OFFSET + WORD_SIZE
ROW_FIELDS_END = ABORTED_GENERATION_OFFSET + WORD_SIZE
ROW_SIZE = 2 * CACHE_LINE_SIZE                            # padded: two lines each

# Word indexes: the control page and each row viewed as int64 (what atomics take).
ROW_CAPACITY_WORD = ROW_CAPACITY_OFFSET // WORD_SIZE
BROKER_PID_WORD = BROKER_PID_OFFSET // WORD_SIZE
BROKER_EPOCH_WORD = BROKER_EPOCH_OFFSET // WORD_SIZE
APPENDER_SEQUENCE_WORD = APPENDER_SEQUENCE_OFFSET // WORD_SIZE
APPENDER_SLEEPERS_WORD = APPENDER_SLEEPERS_OFFSET // WORD_SIZE
CONSUMER_SEQUENCE_WORD = CONSUMER_SEQUENCE_OFFSET // WORD_SIZE
CONSUMER_SLEEPERS_WORD = CONSUMER_SLEEPERS_OFFSET // WORD_SIZE
JOURNAL_SEQUENCE_WORD = JOURNAL_SEQUENCE_OFFSET // WORD_SIZE
JOURNAL_WRITTEN_WORD = JOURNAL_WRITTEN_OFFSET // WORD_SIZE
JOURNAL_PENDING_WORD = JOURNAL_PENDING_OFFSET // WORD_SIZE
JOURNAL_SLOTS_WORD = JOURNAL_SLOTS_OFFSET // WORD_SIZE
BELLS_WORDS = BELLS_SIZE // WORD_SIZE
ROW_WORDS = ROW_SIZE // WORD_SIZE
LOG_START_OFFSET_WORD = LOG_START_OFFSET_OFFSET // WORD_SIZE
LOG_END_OFFSET_WORD = LOG_END_OFFSET_OFFSET // WORD_SIZE
HIGH_WATERMARK_WORD = HIGH_WATERMARK_OFFSET // WORD_SIZE
ACTIVE_SEGMENT_BASE_OFFSET_WORD = ACTIVE_SEGMENT_BASE_OFFSET_OFFSET // WORD_SIZE
SEGMENT_GENERATION_WORD = SEGMENT_GENERATION_OFFSET // WORD_SIZE
TOPIC_KEY_WORD = TOPIC_KEY_OFFSET // WORD_SIZE
PARTITION_WORD = PARTITION_OFFSET // WORD_SIZE
ACTIVE_SEGMENT_SIZE_WORD = ACTIVE_SEGMENT_SIZE_OFFSET // WORD_SIZE
LAST_STABLE_OFFSET_WORD = LAST_STABLE_OFFSET_OFFSET // WORD_SIZE
ABORTED_GENERATION_WORD = ABORTED_GENERATION_OFFSET // WORD_SIZE

FREE_TOPIC_KEY = 0

assert HEADER_END <= CACHE_LINE_SIZE
assert ROW_FIELDS_END <= ROW_SIZE
assert JOURNAL_PENDING_OFFSET + WORD_SIZE <= CONTROL_PAGE_SIZE
assert JOURNAL_CAPACITY & JOURNAL_SLOT_MASK == 0, "a power of two: slots by mask"
assert 0 < JOURNAL_UNFLUSHED_MAX < JOURNAL_CAPACITY // 2, "readers need room to not be lapped"
assert ROWS_OFFSET % CACHE_LINE_SIZE == 0
assert ROW_CAPACITY_OFFSET % WORD_SIZE == 0 and BROKER_PID_OFFSET % WORD_SIZE == 0


def row_word(row: int, field_word: int) -> int:
    """Index of a row's field in the table viewed as int64 words from ROWS_OFFSET."""
    return row * ROW_WORDS + field_word


def journal_slot_word(position: int) -> int:
    """Index of the journal slot that holds ``position`` (a count of slots written
    since the table was made) in the control area viewed as int64 words."""
    return JOURNAL_SLOTS_WORD + (position & JOURNAL_SLOT_MASK)
