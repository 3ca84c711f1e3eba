"""Named limits, each with the reason for its number.

Every queue, batch, buffer, retry and wait in shmlog takes its bound from here.
"""

from __future__ import annotations

# --- names --------------------------------------------------------------------------------
# Kafka's rule: a topic name is 1..249 characters of [a-zA-Z0-9._-]; 249 leaves room
# for "-<partition>" and a deletion suffix inside a 255-byte file name.
TOPIC_NAME_LENGTH_MAX = 249

# --- control requests ---------------------------------------------------------------------
# A control request names topics and configs, never records: 1 MiB is generous, and
# bounds what a broken or hostile client makes the broker receive and parse. A client
# refuses to send a larger one (ControlRequestTooLargeError); the broker refuses one
# sent anyway with the same typed reply, unparsed.
CONTROL_FRAME_SIZE_MAX = 1 << 20
# ZeroMQ's ZMQ_MAXMSGSIZE on the control socket: a frame over it disconnects its sender
# from its length prefix, before any of it is buffered, and so gets no reply. Between
# CONTROL_FRAME_SIZE_MAX and this a frame is received and answered with the typed error
# (a client that skipped the check learns why, at once, instead of waiting out its
# timeout); beyond it, buffering a frame to answer it costs more memory than the
# answer is worth to a client that sends 4 MiB where 1 MiB is the limit.
CONTROL_FRAME_RECEIVED_SIZE_MAX = 4 * CONTROL_FRAME_SIZE_MAX
# Messages ZeroMQ queues from one client connection (ZMQ_RCVHWM) before it stops reading
# that connection (the client's sends then block): with the frame bound above, at most
# 16 MiB of one client's pipelined requests is buffered below the broker's own queue.
CONTROL_PEER_RECEIVE_HWM = 4
# The broker's own bound per client: requests received and not yet answered, and bytes
# of requests waiting for the loop. Every shmlog client has one request in flight (a
# REQ socket); 8 leaves room for other clients' pipelining (Kafka's producer keeps 5 per
# connection) and 4 frames' bytes. Past either, a request is refused at once with
# TooManyRequestsInFlightError, not queued: 3,000 pipelined 1 MiB requests grew a
# broker from 211 MB to 2.7 GB and held another client's ping 3.7 s (issue 27).
CONTROL_PEER_REQUESTS_MAX = 8
CONTROL_PEER_BYTES_MAX = 4 * CONTROL_FRAME_SIZE_MAX
# Admin.create_topics puts at most this many bytes of topics in one create_topics
# request, half a frame: the rest of the frame is the request's envelope, with room
# to spare (1,000 topics of 10 partitions with no config take ~70 KB: one request).
CREATE_TOPICS_REQUEST_BYTES_MAX = CONTROL_FRAME_SIZE_MAX // 2
# ... and topics of at most this many partitions in all (a topic larger alone), so a
# request's work stays well inside the Admin's default 10 s timeout on a busy disk:
# a partition is a mkdir and ~0.1 ms of the broker's time, 4,096 took 1-2 s on the
# development VM (bench_scale, topics of 10) while others loaded its disk.
CREATE_TOPICS_REQUEST_PARTITIONS_MAX = 4096
# The deepest request (a commit: {"offsets": [[topic, partition, offset, metadata]]})
# nests three levels; 32 leaves room for configs while keeping a frame of nested
# brackets from exhausting the parser's recursion (it would reach Python's limit at
# ~1000 and raise RecursionError).
CONTROL_NESTING_DEPTH_MAX = 32

# --- partitions ---------------------------------------------------------------------------
# Each partition holds three open mmaps per segment and a row of the shared partition
# state table; 10 000 per topic is far beyond what one host serves well (Kafka's
# guidance is a few thousand per broker) while still bounding a typo like 10**9.
PARTITIONS_PER_TOPIC_MAX = 10_000

# --- offsets ------------------------------------------------------------------------------
# Offsets are signed 64-bit, as in Kafka.
OFFSET_MAX = 2**63 - 1

# --- batches and records ------------------------------------------------------------------
# batch_length is a u32 but max.message.bytes (a Kafka int) bounds it far lower.
BATCH_SIZE_MAX = 2**31 - 1
# record_count is an i32 and relative offsets inside a segment are u32.
BATCH_RECORD_COUNT_MAX = 2**31 - 1
# A record's header count is a u32; a million headers is already absurd, and the
# bound keeps a corrupt count from driving a decoder into a huge allocation.
RECORD_HEADER_COUNT_MAX = 1 << 20
# How far ahead of the record it checks decoding asks for the bytes (a prefetch,
# decoding.py): a consumer's read was just CRC-checked, which left its lines in the
# last-level cache, not the core's; walking records one after another from there
# stalls on each (perf/bench_clients.py poll_batch). 2 KiB is ~16 records of 100 B,
# far enough to hide the wait. Timed on the 2-vCPU VM, decoding 1 MiB reads of a mapped
# segment right after their CRC: 14.3 ns a record without, 9.7 with 1-2 KiB ahead, 10.8
# with 256 B; 8 ns when the bytes are in the core's cache anyway.
DECODE_PREFETCH_BYTES = 2048
# A zstd frame may declare any decompressed size; refuse frames that would inflate
# beyond this, so a "zip bomb" batch cannot exhaust memory (64 x Kafka's 1 MiB default
# max.message.bytes, enough for any sane compression ratio on that budget).
DECOMPRESSED_RECORDS_SIZE_MAX = 64 << 20
# A zstd frame that does not declare its size (Java's producer streams its frames) is
# fed to the decompressor this many bytes at a time and its output counted after each
# step, so a bomb stops within one step of the bound above: a step yields at most 64
# blocks of 128 KiB (a block takes 4 bytes at best, its header and one RLE byte), 8 MiB.
# A frame that declares its size is checked against the bound first and fed whole
# (libzstd holds a frame to its declared size).
ZSTD_UNSIZED_FRAME_STEP_SIZE = 256

# --- segments -----------------------------------------------------------------------------
# (The limits that follow from the layouts are at the end of the module.)
# A partition's active segment keeps blocks reserved (fallocate) and pages populated
# (MADV_POPULATE_WRITE) some way past its write position, so the appender never takes a
# page fault per 4 KiB page nor a SIGBUS on a full disk. How far follows the partition's
# write rate (storage/reservation.py): from this much for a partition that takes a
# record now and then (8 pages; with a page of each index, the 40 KiB an idle partition
# holds beyond its data) ...
SEGMENT_RESERVE_AHEAD_MIN = 32 << 10
# ... doubling whenever an append found the room used up (the partition fills faster
# than it is populated), up to this: ~5 ms of appending at memory speed, and the most
# page cache and disk a partition holds beyond its data.
SEGMENT_RESERVE_AHEAD_MAX = 32 << 20
# ... and at least what the partition writes in this long at the rate measured
# between two background reservations: one is queued when half the distance is
# left, so a steady stream wakes the prefaulter thread ~8 times a second, not once
# every few pages (each wake-up takes the broker's GIL from the appender).
SEGMENT_RESERVE_HORIZON_S = 0.25
# ... and halving after this long without an append finding the room used up, so a
# partition that was busy once and is quiet now holds little ahead again.
SEGMENT_RESERVE_DECAY_S = 10.0
# The buffer of zeros a reservation writes new pages from (mapped_file), a write of it
# at a time: 1 MiB writes made page cache fastest here (0.04 s for 512 MiB; 8 MiB
# writes of a 64 KiB buffer named 128 times, 1.1 s).
ZEROS_BUFFER_BYTES = 1 << 20
# A flush that failed (a full disk cannot take the checkpoint) is tried again no
# sooner than this: once a second per partition keeps a full disk from costing a
# failed file write (and a log line) per append, and the recovery point is back
# within a second of the disk having room.
FLUSH_RETRY_INTERVAL_MS = 1000
# Appends refused by the log (a full disk: every batch of every producer, thousands a
# second) are logged one line at the first, then one line with their count no more
# often than this: a full disk once logged a traceback per batch (22,262 lines in
# 30 s). Half a minute keeps a day-long outage to ~3,000 lines; the count is exact in
# the stats (appends_refused_storage) whatever the interval.
APPEND_REFUSAL_LOG_INTERVAL_S = 30.0
# The map's first size: 64 Ki slots (1.5 MiB), doubled as keys come.
CLEANER_SLOTS_MIN = 1 << 16
# Attempts to map a file that shrinks under us (a roll trims it) before giving up.
SHRINK_ATTEMPTS_MAX = 3

# --- client settings ----------------------------------------------------------------------
# Kafka types its clients' millisecond settings that bound a wait (request.timeout.ms,
# session.timeout.ms, max.poll.interval.ms, auto.commit.interval.ms) as a 32-bit int:
# ~24.8 days is the longest wait a setting may ask for. It also keeps every wait in
# range of ZeroMQ's poll (an int of ms) and of threading's timeouts.
CLIENT_WAIT_MS_MAX = 2**31 - 1
# Kafka's max.poll.records and fetch.max.bytes are ints too.
POLL_RECORDS_MAX = 2**31 - 1
FETCH_SIZE_MAX = 2**31 - 1
# Timestamps are signed 64-bit milliseconds, stored in a batch as the first one plus
# a signed 64-bit delta per record: with the smallest timestamp -1 ("none"), the
# largest whose delta still fits is 2**63 - 2.
TIMESTAMP_MS_MAX = 2**63 - 2
# A producer keeps the murmur2 hashes of recently sent keys, as a compiled hash costs
# ~0.5 us per call to dispatch while a cached one ~0.1 us: applications send many
# records per key (a user, a device). Only keys up to 64 bytes (ids, UUIDs as text) are
# kept, and at most 4096 of them (least recently used go first): well under 1 MiB,
# and a workload of ever-new keys costs one miss per send, no more memory.
PARTITIONER_CACHE_KEYS_MAX = 4096
PARTITIONER_CACHE_KEY_SIZE_MAX = 64
# Kafka's defaults: batch.size 16 KiB, linger.ms 5 (since Kafka 4.0), max.block.ms 60 s.
BATCH_SIZE_DEFAULT = 16384
LINGER_MS_DEFAULT = 5
MAX_BLOCK_MS_DEFAULT = 60_000
# The ring holds batches until the appender drains them, and /dev/shm holds the whole
# ring from the producer's start (kafka-python's buffer_memory is 32 MiB, but of heap,
# touched only as used): 2 MiB admits the largest batch a topic takes by default
# (max.message.bytes, 1 MiB) with room for another, and 200 producers on one host
# (issue 26) take 400 MiB of /dev/shm, not 3.2 GB. bench_clients' send_batch
# (--ring-size; batches of 1000 records of 100 B, 16 to a 2 MiB ring), 6 runs each,
# interleaved, on the 2-vCPU VM (a busy one): best 3.57 M records/s with either
# size, median 2.8 M/s with 2 MiB and 2.5 M/s with 16 MiB: not slower.
RING_SIZE_DEFAULT = 2 << 20
# Kafka's num.partitions default: a NewTopic with num_partitions=-1 gets it.
NUM_PARTITIONS_DEFAULT = 1
# The logging handler (client/log_handler.py): records formatted and waiting for its
# shipping thread. 10,000 lines of ~200 bytes are ~4 MB of Python objects, and ride
# through a broker's restart (~2 s, test_broker's SIGKILL restarts) at 5,000 lines/s
# without a drop; past it a record is dropped and counted (overflow="drop", the
# default) or its logging call waits (overflow="block"). The setting's bound keeps a
# typo from asking for gigabytes of buffered lines.
LOG_HANDLER_BUFFER_RECORDS_DEFAULT = 10_000
LOG_HANDLER_BUFFER_RECORDS_MAX = 10_000_000
# The shipping thread hands at most this many records to the producer between two
# looks at the handler's waits (a flush, a logging call blocked for room): ~0.5 ms of
# sends at ~2 us each, so a blocked call waits no longer than that for room.
LOG_HANDLER_SHIP_CHUNK_RECORDS = 256
# How long a flush() or close() of the handler waits for its records to be acknowledged
# (logging.shutdown at exit calls both): a live broker acknowledges a full buffer in
# milliseconds and a restarted one within seconds, while an exiting program should
# not wait the producer's own CLOSE_BROKER_WAIT_S (30 s) for a broker that is gone.
LOG_HANDLER_CLOSE_TIMEOUT_S_DEFAULT = 10.0
# Kafka's max.poll.records and max.partition.fetch.bytes defaults.
MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BYTES_DEFAULT = 1 << 20

# --- tools --------------------------------------------------------------------------------
# Kafka's kafka-consumer-perf-test --timeout: the longest wait between records before
# ``shmlog perf consume`` decides the topic has no more.
PERF_IDLE_TIMEOUT_MS = 10_000
# A SIGKILLed process is gone within milliseconds; this bounds the wait for it.
LOCAL_CLUSTER_KILLED_WAIT_S = 10.0
# How often a starting LocalCluster asks its brokers whether they see each other.
LOCAL_CLUSTER_VIEW_POLL_S = 0.05
# shmlog perf's progress line: once a second, as Kafka's perf tools report.
PERF_PROGRESS_EVERY_S = 1.0
# One poll's wait: short, so the idle timeout is checked often.
PERF_POLL_TIMEOUT_MS = 100
# shmlog cluster up's brokers: three, the fewest that keep acks=all writable
# (min.insync.replicas=2) through the loss of one.
CLUSTER_UP_BROKERS_DEFAULT = 3
# The loopback network is 127.0.0.0/8: broker ids 1..254 get addresses of their own.
CLUSTER_UP_BROKERS_MAX = 254

# --- a local ZooKeeper (development and tests; production points at an ensemble) ----------
# Its JVM serves ~1.5-2.5 s after start on this 2-core host (C1 only); a minute covers
# a machine loaded by a test run, and still ends a start that will never serve.
ZOOKEEPER_START_TIMEOUT_S = 60.0
# How often a starting server's port is tried: a twentieth of its start time.
ZOOKEEPER_PROBE_INTERVAL_S = 0.05
# The session timeout the start's probe asks for, which kazoo also waits for the
# answer to its handshake: a serving ZooKeeper answers in milliseconds, a process
# that took the port never does, and stopping the probe waits that long.
ZOOKEEPER_PROBE_SESSION_TIMEOUT_S = 1.0
# SIGTERM runs the JVM's shutdown hooks (ZooKeeper closes its log and sessions in
# well under a second); a JVM still there after this is killed.
ZOOKEEPER_STOP_TIMEOUT_S = 10.0
# The JVM's heap (-Xmx). A cluster's metadata is a few thousand small znodes (a few
# MiB); ZooKeeper's own scripts give 1000 MB, sized for a production ensemble, which
# a development server on a shared host should not take.
ZOOKEEPER_HEAP_SIZE_MAX = 256 << 20
# ZooKeeper's log rolls over at this size, one old file kept: at INFO it writes a few
# lines per session, so 16 MiB holds days of a development cluster's history.
ZOOKEEPER_LOG_SIZE_MAX = 16 << 20
# A free port is picked by binding port 0 and closing it; another process may take
# it before the JVM binds (the server then exits at once): a new port is tried this
# many times in all.
ZOOKEEPER_PORT_ATTEMPTS_MAX = 3
# ZooKeeper's defaults: a tick of 2 s (sessions last 2 to 20 ticks) and port 2181.
ZOOKEEPER_TICK_TIME_MS_DEFAULT = 2000
# The purge of old snapshots and logs runs hourly, ZooKeeper's smallest interval.
ZOOKEEPER_PURGE_INTERVAL_HOURS = 1
# Transaction logs grow in steps of this many KiB (ZooKeeper's default is 64 MiB).
ZOOKEEPER_LOG_PREALLOCATE_STEP_KIB = 4096

# --- reading ------------------------------------------------------------------------------
# Default byte budget of one read (Kafka's max.partition.fetch.bytes default).
READ_SIZE_DEFAULT = 1 << 20
# Listings of a partition directory one read makes while the segment generation keeps
# moving under it. A listing takes well under a millisecond and the generation moves
# a few times a second at most (rolls, retention, compaction swaps), so a third
# torn listing in a row means the broker is in the middle of a change: the read
# returns nothing and the caller's next poll lists again.
READER_RESCAN_ATTEMPTS_MAX = 3
# Compiled struct formats kept for cutting record fields out of a poll's bytes
# (records._slices). One covers a poll's run of fixed-size fields, ~32 bytes a field
# (~0.3 MB for 10 000); iteration's chunks repeat a few layouts, so a handful is
# enough, and struct's own cache (100 formats, ~30 MB of them) is not used.
FIELD_FORMATS_CACHED_MAX = 4
# How often an idle consumer checks that the broker it reads from is alive (and,
# when it is not, looks for a new one).
BROKER_CHECK_INTERVAL_S = 0.5
# The state table's journal of changed rows (state_layout): slots of one row number
# each, a ring that readers follow from the sequence they saw. A reader lapped by
# more than this (less STATE_JOURNAL_UNFLUSHED_MAX, the slots the broker may write
# ahead of the sequence) scans every partition it holds instead, which is correct,
# only slower. The broker names a row once per STATE_JOURNAL_UNFLUSHED_MAX publishes
# of it at most, so one busy partition at a million batches a second takes ~30 000
# slots a second: 16 Ki slots (128 KiB of /dev/shm per broker, read only as far as
# they are new) let a consumer take half a second between fetches before it scans.
STATE_JOURNAL_CAPACITY = 1 << 14
# Publishes the broker journals before it publishes the journal's sequence (and
# always at the end of a drain pass): a row published again within them takes no new
# slot, and a consumer following the journal learns of a batch at most this many
# batches (~30 us of appending) after the state table shows it.
STATE_JOURNAL_UNFLUSHED_MAX = 32
# A consumer following the journal still reads every partition it holds this often:
# another process of the data group may write the table, and a journal it scribbled
# on could hide a row's change; this bounds that to a delay, never a lost record.
# One scan of 10 000 partitions takes ~20 ms of Python: 2% of a busy consumer.
FETCH_FULL_SCAN_INTERVAL_S = 1.0
# How often a waiting poll looks whether a join under way (on the member's join
# thread) has finished, so its assignment is taken on at once: a rebalance is paced
# by heartbeats (hundreds of ms), and an idle check costs a few microseconds.
JOIN_CHECK_INTERVAL_S = 0.005
# The default idle strategy of a loop that found nothing to do (see ``pause``): keep
# looking for IDLE_SPIN_S, then look and yield the CPU until IDLE_YIELD_S, then sleep on a
# doorbell. Waking a process whose CPU went idle takes tens of microseconds on a
# virtual machine, so a loop that has just had work stays awake a millisecond:
# under a steady flow it never sleeps, and once idle it costs nothing.
IDLE_SPIN_S = 50e-6
IDLE_YIELD_S = 1e-3
# Without a futex: how long a waiter sleeps between looks.
IDLE_NAP_S = 200e-6
# A DoorbellRelay's thread sleeps on the doorbell at most this long before it looks
# whether it is still armed (a ring wakes it at once; this only bounds a lost wake-up
# call from a ringer killed between its two steps, as a sleeper's own timeout does).
DOORBELL_RELAY_NAP_S = 0.1
# How long stopping a relay waits for its thread (it wakes within a nap).
DOORBELL_RELAY_STOP_S = 5.0

# --- consumer groups ----------------------------------------------------------------------
# Bytes of metadata (UTF-8) a committed offset may carry: Kafka's
# offset.metadata.max.bytes default. The coordinator keeps every commit in memory
# and in __consumer_offsets, so an application cannot grow either without bound.
OFFSET_METADATA_SIZE_MAX = 4096
# Refusals a join recovers from by joining again (a superseded join, a generation
# that moved on, a coordinator that forgot us, no answer) before it gives up.
JOIN_ATTEMPTS_MAX = 30
# The pause before a join tries again when no broker runs: 30 attempts then span a
# minute, time enough for a broker to restart (it compiles its kernels from a cache).
GROUP_BROKER_RETRY_BACKOFF_S = 2.0
# How long one join request waits before it is sent again (Kafka's clients wait the
# rebalance timeout; asking again every 10 s also finds a restarted broker).
JOIN_REQUEST_TIMEOUT_MS = 10_000
# A member's client id goes into its member id; keep ids short.
CLIENT_ID_LENGTH_MAX = 255
# How long expiring committed offsets waits after a failed append before it tries
# again (a full disk is not fixed in a moment; Kafka checks every 10 minutes).
OFFSETS_EXPIRY_RETRY_MS = 60_000

# --- transactions ------------------------------------------------------------------------
# How long a transaction may stay open unless the producer says (Kafka's
# transaction.timeout.ms default).
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
# How soon a transaction marker that could not be written is tried again.
TRANSACTION_MARKER_RETRY_MS = 1_000
# How long a transactional id with no transaction under way is kept (Kafka's
# transactional.id.expiration.ms: 7 days).
TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT = 7 * 24 * 3600 * 1000
# The longest transactional id (characters): it travels with a cluster's forwarded
# batches and requests. Kafka's wire allows 32767; ids are names, far shorter.
TRANSACTIONAL_ID_LENGTH_MAX = 1024
# A cluster member's transactional ids of producer ids it learned (from the
# init_transactions replies it passed on, and the batches forwarded to it), kept to
# find the coordinator a held batch's verification asks: the oldest go beyond this.
TRANSACTIONAL_IDS_REMEMBERED_MAX = 100_000
# How old a cluster member's view of what every transaction coordinator holds may get
# before ``stats`` asks them again (its hanging transactions lag at most this).
TRANSACTION_HOLDERS_MAX_AGE_MS = 5_000
# How soon a held batch's verification asks again when the coordinator cannot
# answer yet (its previous transaction's markers are out, it is loading or moving).
TRANSACTION_VERIFY_RETRY_MS = 10
# Transactional batches refused at their verification are logged at most this often
# (the next warning counts those suppressed): a producer retrying cannot flood the log.
TRANSACTION_REFUSAL_WARNING_INTERVAL_S = 1.0

# --- process limits ---------------------------------------------------------------------
# Mappings kept free below vm.max_map_count for the process's own use (malloc's arenas
# and large blocks, thread stacks, shared libraries: a broker uses ~600 before its
# first partition): a segment is refused a mapping before the process is that close.
MAPPINGS_HEADROOM = 2048
# The process's mappings are counted again (a read of /proc/self/maps, ~1 ms per 10,000)
# after half the room left below the limit at the last count, or after this many new
# ones if that is fewer: well inside the headroom, near the limit too.
MAPPINGS_RECOUNT_EVERY = 512
# What vm.max_map_count is taken to be when /proc/sys does not say (the kernel's default).
MAX_MAP_COUNT_ASSUMED = 65530

# --- limits that follow from a binary layout ----------------------------------------------
# Stated as numbers, so that this module imports nothing (the layouts import numpy, which
# the commands that only ask the broker something would pay 0.2 s of start-up for), and
# checked by the layout each one follows from when it is imported (batch_layout,
# index_layout): a layout change that moves one fails at import, naming it.
#
# The smallest batch: one record without key, value or headers (batch_layout's
# HEADER_LENGTH + RECORD_HEADER_LENGTH). A topic whose max.message.bytes is below it could
# take no record at all (Kafka accepts 0 and then refuses every produce; we refuse the
# setting instead).
BATCH_SIZE_MIN = 64 + 28
# Positions in the offset index are u32 (index_layout's POSITION_MAX), as in Kafka.
SEGMENT_SIZE_MAX = 2**31 - 1
# A segment must at least hold one header-only batch.
SEGMENT_SIZE_MIN = BATCH_SIZE_MIN
# An index must hold at least a few entries (four of index_layout's TIME_ENTRY_LENGTH)
# or every append would roll the segment.
INDEX_SIZE_MIN = 4 * 12

# Partition logs closed at once when a broker stops: each close is a few fsyncs, which
# a disk overlaps (measured on the development VM's virtio disk, 300 logs: 6.5 s one at
# a time, 0.5 s on 16 threads); more threads would only queue at the disk.
LOG_CLOSE_THREADS_MAX = 16

# --- cluster mode: ZooKeeper client and controller ----------------------------------------
# How long a broker waits for its first ZooKeeper session before giving up
# (kazoo's start() default; Kafka's zookeeper.connection.timeout.ms defaults to the
# session timeout, 18 s).
ZOOKEEPER_CONNECT_TIMEOUT_S = 15.0
# Kafka's zookeeper.session.timeout.ms default. ZooKeeper clamps what a client asks
# for to 2..20 ticks of its tickTime.
ZOOKEEPER_SESSION_TIMEOUT_MS_DEFAULT = 18000
# Reads (idempotent) are retried this many times across a connection loss before
# ZooKeeperConnectionError: a few reconnects, each bounded by the session timeout.
ZOOKEEPER_READ_ATTEMPTS_MAX = 5
# Conditional read-modify-write loops (a producer-id block, a controller's writes
# racing a leader's ISR changes) retry on a version conflict this many times: each
# loss means another writer made progress, so running out means a writer storm.
ZOOKEEPER_CONFLICT_ATTEMPTS_MAX = 20
# One multi-op's size, counted as its ops' paths and bodies plus 64 bytes each (an
# op's header, version, flags and the open ACL of a create take under 64): ZooKeeper
# drops the connection of a request above jute.maxbuffer (1 MiB by default, in the
# server and its Java clients), and half of that leaves room for any miscount. A
# controller's writes larger than this go as several multis, each fenced.
ZOOKEEPER_MULTI_SIZE_MAX = 512 << 10
ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE = 64
# Reads sent at once before their answers are awaited (many znodes read in one
# pipeline, not one round trip each): ZooKeeper's globalOutstandingLimit (1,000)
# stops reading a connection with more outstanding, so more would only wait there.
ZOOKEEPER_READS_IN_FLIGHT_MAX = 1000
# A controller pass logs one line per topic, naming this many of its changed partition
# states (the rest at DEBUG): a line each, thousands at a broker's failure, cost a
# loaded controller seconds before its write; ten show what happened.
LOGGED_CHANGES_MAX = 10
# A restarted broker finds its previous session's registration until ZooKeeper
# expires that session: it waits this many session timeouts for it to go.
BROKER_REGISTRATION_WAIT_SESSIONS = 1.5
# The controller's thread wakes at least this often with no event, to notice stop().
CONTROLLER_IDLE_WAIT_S = 0.5
# A state-change notice (cluster.zk.state_changes) is deleted this long after the
# controller first listed it. A broker reads each notice within moments of its
# creation while connected (its children watch fires), and reads every state again
# after any reconnection, so a minute is ten session timeouts of slack; the notices
# kept cost each broker's listing of them, a few hundred bytes a write.
STATE_CHANGE_RETENTION_S = 60.0
# How often the controller lists the notices to delete the old ones.
STATE_CHANGE_COLLECT_INTERVAL_S = 10.0
# stop() waits this long for the controller's thread (a ZooKeeper call in flight is
# bounded by the session timeout; the client is closed after the join).
CONTROLLER_STOP_TIMEOUT_S = 30.0

# --- replication (cluster/replication/, zmq_replication.py) -------------------------------
# A replication message's JSON body names partitions and offsets, never records (those
# travel in frames of their own): ~140 bytes a partition, so a follower's fetch of every
# partition one leader leads in issue 26's cluster (10,000 partitions, RF 3, three
# brokers: ~3,333 a leader, ~470 KB) fits, as would one of 10,000 from a single leader
# (~1.4 MB). 64 KiB (~460 partitions) refused the fetches of a 1,000-partition topic.
# It bounds what a broken or hostile peer makes a broker parse.
REPLICATION_BODY_SIZE_MAX = 4 << 20
# The longest run of record batches one partition entry carries (a fetch's
# partition_max_bytes, or a forwarded batch). Kafka's replica.fetch.response.max.bytes
# is 10 MiB and a fetch returns at least one whole batch, whose size max.message.bytes
# bounds: 64 MiB covers both with room. It is also every replication socket's
# ZMQ_MAXMSGSIZE (checked per frame), so a longer frame is refused from its length
# prefix (the peer is disconnected) before any of it is buffered.
REPLICATION_RECORDS_SIZE_MAX = 64 << 20
# The longest long poll a fetch may ask for: Kafka's replica.fetch.wait.max.ms is 500
# and must stay below replica.lag.time.max.ms (30 000 by default), or a follower on a
# quiet partition would drop out of the ISR while it waits.
REPLICATION_FETCH_WAIT_MS_MAX = 30_000
# An ERROR's message (characters): a sentence naming the field and its value.
REPLICATION_ERROR_MESSAGE_LENGTH_MAX = 1024
# A DEALER reconnects after 100 ms, backing off to 1 s while its peer stays down:
# failover is about a ZooKeeper session timeout (seconds), so 1 s adds little.
REPLICATION_RECONNECT_INTERVAL_MS = 100
REPLICATION_RECONNECT_INTERVAL_MS_MAX = 1000
# Messages libzmq queues per connection and direction (ZMQ_SNDHWM/RCVHWM). A follower
# keeps one fetch in flight per leader, so a few suffice; with records frames up to
# REPLICATION_RECORDS_SIZE_MAX, libzmq's default of 1000 could hold gigabytes.
REPLICATION_SOCKET_QUEUED_MAX = 64
# Messages a request may wait in the endpoint for its peer's connection (IMMEDIATE
# keeps libzmq from queueing to a peer not connected); past it, or past its
# timeout, the request fails at once.
REPLICATION_PEER_BACKLOG_MAX = 64
# Received messages queued for the owner: past it a pump stops reading the
# sockets, so libzmq's queues (and then TCP) push back on the peers instead of
# this process buffering without bound.
REPLICATION_INBOUND_QUEUED_MAX = 1024
# Warnings about malformed messages from peers are logged at most this often (the
# next one counts those suppressed): a peer looping on garbage cannot flood the log.
REPLICATION_WARNING_INTERVAL_S = 1.0
# A request's timeout when its caller names none: Kafka's replica.socket.timeout.ms
# default (a fetch adds its max_wait_ms to it).
REPLICATION_REQUEST_TIMEOUT_MS_DEFAULT = 30_000
# After a refusal the leader may take back (RETRIED_ERRORS), or a failed request, a
# follower waits this long before asking again (Kafka's replica.fetch.backoff.ms is
# 1000; failover is what we wait for, and the controller elects within milliseconds
# of a session's end).
FETCH_BACKOFF_MS = 100
# Incremental fetch sessions (KIP-227) a leader keeps: Kafka's
# max.incremental.fetch.session.cache.slots default; a follower holds one per leader,
# so this bounds the peers, far above a cluster's brokers. The least recently used
# session is evicted to make room (its follower falls back to a full fetch).
FETCH_SESSION_CACHE_SLOTS_MAX = 1000
# A session no fetch used for this long is evicted (Kafka's
# min.incremental.fetch.session.eviction.ms default): its follower is gone or restarted.
FETCH_SESSION_IDLE_EVICTION_MS = 120_000
# A follower whose fetch session is quiet (its last answer empty, nothing backed off,
# throttled or truncating) sends its next fetch without looking through its partitions;
# it still looks through them this often, which bounds how late a change no answer
# brings (its own retention moving a log start) reaches the leader. 3,333 partitions
# a leader take ~15 ms of Python to look through: 0.3% of a core at this interval.
FETCH_SESSION_RESCAN_MS = 5_000

# --- cluster configuration (config/cluster.py, cluster/metadata.py) -----------------------
# A cluster id and a rack are names written into ZooKeeper's znodes and shown by
# describe; Kafka's generated cluster id is a 22-character base64 UUID, and a
# UUID's text is 36: 255 leaves room for any naming scheme and bounds a typo.
CLUSTER_ID_LENGTH_MAX = 255

# --- cluster wiring (cluster/replication/, cluster/topic_service.py, cluster/node.py) -----
# How long a topic request waits, after its ZooKeeper write, for this broker to see it
# take effect (the controller elects leaders within milliseconds; a ZooKeeper session
# timeout is the worst case a healthy cluster shows).
CLUSTER_TOPIC_WAIT_MS = 30_000
# How long Admin waits for the answer to a topic change (create, delete, partitions,
# config) unless given a timeout: past the broker's own wait above, so on a loaded
# cluster the broker's answer comes first, never a false "no broker answered".
ADMIN_TOPIC_CHANGE_WAIT_MS = CLUSTER_TOPIC_WAIT_MS + 10_000
# How long a topic request waits for ZooKeeper to answer its write before it is
# answered "outcome unknown" (the connection went while the write was queued: kazoo
# sends it when ZooKeeper is back). Below the admin client's 10 s default timeout,
# so the caller hears that, not "no broker answered"; ZooKeeper answers a write in
# milliseconds when it is up.
CLUSTER_TOPIC_WRITE_WAIT_MS = 5_000
# How often a held reply looks whether what it waits for has happened.
HELD_REPLY_LOOK_MS = 20

# --- replication storage (leader epochs, producer-state snapshots) ------------------------
# Epoch changes a header walk reports per kernel call before Python takes them and
# calls again: epochs change once per election, so one call almost always suffices.
LEADER_EPOCH_SCAN_CHUNK = 64
# Entries a leader-epoch checkpoint may hold before it is taken as corrupt (and
# rebuilt from the log): one per election that appended to the partition, so a
# million is far past any real history, and bounds what a damaged file can make us read.
LEADER_EPOCH_ENTRIES_MAX = 1_000_000
# Producers a header walk keeps in a local array before it falls back to the typed
# dict: a probe of a few int64s costs a few nanoseconds a batch, a dict store ~30.
WALK_PRODUCERS_MAX = 64
# Batches remembered per idempotent producer and partition, whose re-send is acknowledged
# with its original offset (storage/producer_window.py): Kafka's NUM_BATCHES_TO_RETAIN
# (ProducerStateEntry), since its producers keep up to 5 requests in flight per connection
# (max.in.flight.requests.per.connection <= 5 with idempotence), any of which may be re-sent.
PRODUCER_BATCHES_MAX = 5

# --- forwarding (cluster/replication/forwarding.py: a partition another broker leads) -----
# After a forwarded batch's request failed or was answered with a retriable error, it
# is sent again after this long: Kafka's producer retry.backoff.ms default (a new
# leader is tried at once).
FORWARD_RETRY_BACKOFF_MS = 100

# --- cluster operations (HW checkpoint, producer ids) -------------------------------------
# A cluster member draws its next block of producer ids from ZooKeeper (on a thread of
# its own) once this many ids of its current block are left: half a block
# (zk_paths.PRODUCER_ID_BLOCK_SIZE = 1000), so ZooKeeper may be unreachable for 500
# registrations before a producer is refused.
PRODUCER_ID_PREFETCH_REMAINING = 500

# --- partition reassignment and replication throttling ------------------------------------
# A replication token bucket holds at most this long a run of its rate: Kafka's quota
# is a rate over 11 one-second windows (replication.quota.window.num/.size.seconds);
# one second of burst keeps a fetch of a throttled replica near its share without
# starving it between windows.
REPLICATION_THROTTLE_BURST_MS = 1000

# --- leader balance (controlled shutdown, preferred election) -----------------------------
# How long `shmlog cluster elect-leaders` waits for the controller to carry out the
# election it asked for (the controller acts within milliseconds; a controller
# failover takes up to a ZooKeeper session timeout, Kafka's default 18 s).
ELECT_LEADERS_TIMEOUT_MS_DEFAULT = 30_000
# How often it looks whether the controller has done so.
ELECT_LEADERS_POLL_S = 0.05

# --- consumer groups across hosts (cluster/groups.py) -------------------------------------
# A forwarded join waits for its rebalance: the coordinator's broker is given the
# member's rebalance timeout plus this much (Kafka's consumer adds 5 s to the join's
# request timeout, AbstractCoordinator.JOIN_GROUP_TIMEOUT_LAPSE).
GROUP_JOIN_FORWARD_MARGIN_MS = 5_000
# After a coordinator error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
# COORDINATOR_LOAD_IN_PROGRESS, a timed-out forward) a member asks again after this
# long: Kafka's consumer retry.backoff.ms default.
COORDINATOR_RETRY_BACKOFF_MS = 100
# How often a cluster member looks whether it gained or lost the leadership of an
# offsets partition (and so a coordinator to load or unload), and whether a forwarded
# group request's coordinator moved: between two looks a request is answered by the
# leadership it found (a lost one fences the commit by its leader epoch).
COORDINATOR_CHECK_INTERVAL_MS = 50
# A group request forwarded to the coordinator's broker travels as the control frame's
# text inside the replication body (at most REPLICATION_BODY_SIZE_MAX bytes): JSON
# escapes at most double a text (quotes and backslashes), so this leaves the body room.
# A request or reply longer than this is refused before it is sent.
GROUP_FORWARD_TEXT_LENGTH_MAX = 24 << 10

# --- CurveZMQ between brokers (config/curve_keys.py) --------------------------------------
# A key's name becomes a file name (NAME.key, NAME.key_secret): 100 characters hold
# any host or broker naming scheme and stay far below NAME_MAX (255 bytes).
CURVE_KEY_NAME_LENGTH_MAX = 100
# A ZeroMQ certificate file is ~350 bytes (a banner, metadata and two 40-character
# keys); 64 KiB bounds what a wrong path (a log, a device) makes the broker read.
CURVE_KEY_FILE_SIZE_MAX = 64 << 10
# A peer key this broker does not know makes it read curve.allowed.public.keys.dir again
# (a new broker's key copied in while it runs), at most this often: a stranger that
# reconnects in a loop costs one directory read a second, and a key added is taken
# within a second (libzmq retries a refused connection every
# REPLICATION_RECONNECT_INTERVAL_MS_MAX at most).
CURVE_KEYS_RELOAD_INTERVAL_S = 1.0

# --- Kafka clients' SASL (wire/sasl.py, wire/credentials.py) ------------------------------
# SCRAM's PBKDF2 iterations: Kafka's bounds (its ScramMechanism's minIterations, 4096,
# the least RFC 7677 allows, and maxIterations, 16384). A credential outside them is
# refused when the credentials file is read.
SCRAM_ITERATIONS_MIN = 4096
SCRAM_ITERATIONS_MAX = 16384
# What a new credential gets: twice the minimum. A login costs the client this many
# HMACs; PLAIN, checked against the SCRAM credential, costs the broker as many (5.5 ms
# of SHA-512, 2.3 ms of SHA-256 on the development VM; a SCRAM login costs it 60-80 us).
SCRAM_ITERATIONS_DEFAULT = 8192
# A new credential's salt, and the broker's part of a SCRAM nonce, in bytes of the
# secrets module: RFC 5802 asks for unpredictable ones, and these are 256 and 192 bits
# (Kafka's ScramFormatter makes each of 130 random bits).
SCRAM_SALT_SIZE = 32
SCRAM_NONCE_SIZE = 24
# One SASL message from a client (SaslAuthenticate's auth_bytes): RFC 4616 makes a
# server accept 255-byte names and passwords, and a SCRAM message holds a name, a
# nonce and a proof of a few dozen bytes; 8 KiB leaves room to spare and bounds what
# an unauthenticated client makes the broker parse (Kafka's own bound, before login,
# is sasl.server.max.receive.size, 512 KiB, for every mechanism including GSSAPI).
SASL_MESSAGE_SIZE_MAX = 8 << 10
# A user name in the credentials file: RFC 4616's 255 octets of a PLAIN authcid.
SASL_USERNAME_SIZE_MAX = 255
# The credentials file: a SCRAM-SHA-512 user is ~400 bytes of TOML, so 16 MiB holds
# tens of thousands of users and bounds what a wrong path (a log, a device) makes the
# broker read.
SASL_CREDENTIALS_FILE_SIZE_MAX = 16 << 20

# --- Kafka clients' TLS (wire/tls.py) -------------------------------------------------------
# A PEM certificate chain, key or CA bundle: a chain of a few certificates is a few
# KiB and the system CA bundle ~200 KiB; 4 MiB bounds what a wrong path makes the
# broker read.
TLS_PEM_FILE_SIZE_MAX = 4 << 20
# Plaintext bytes the listener hands one SSLSocket.send(): small response buffers
# (a Fetch response is many) are joined up to this size so each becomes part of a full
# TLS record (16 KiB of plaintext, RFC 8446 section 5.1) rather than a record each;
# four records per call keeps a large response to few calls.
KAFKA_TLS_WRITE_CHUNK_SIZE = 64 << 10
# How long a connection to a TLS or SASL listener has to finish its TLS handshake and
# its SASL login (the listener closes it then): librdkafka's own bound for the same
# setup is socket.connection.setup.timeout.ms, 30 s; a handshake is two round trips
# and a login two more, milliseconds even across continents, so 10 s bounds what a
# stalled or hostile client holds (a descriptor, a handshake's state) and leaves a
# slow link time to spare. The broker setting connection_setup_timeout_ms changes it.
KAFKA_CONNECTION_SETUP_MS_DEFAULT = 10_000

# --- Kafka clients' SASL logins, served (wire/authenticator.py) -------------------------
# What a client may send before it is logged in: Kafka's sasl.server.max.receive.size
# default (512 KiB). A larger request frame closes the connection before it is read.
KAFKA_UNAUTHENTICATED_REQUEST_SIZE_MAX = 512 << 10
# After a failed login's answer is written, its connection is closed this much later
# (Kafka's connection.failed.authentication.delay.ms default): a client reads the
# answer before it sees the connection end (kafka-python otherwise reports a bare
# disconnection, at random), and a password guesser waits between tries.
KAFKA_FAILED_LOGIN_CLOSE_DELAY_S = 0.1
# Threads that check SASL messages (PLAIN's PBKDF2 costs the broker 2-6 ms: see
# SCRAM_ITERATIONS_DEFAULT), off the broker's loop (which serves the listener's sockets): two keep
# logins going on a 2-core host without taking both cores from the appender.
SASL_WORKER_THREADS_COUNT = 2
# Logins waiting for those threads: each connection has at most one waiting (one
# request in flight), so this bounds a flood of connections logging in at once; at
# 5 ms a PLAIN login, 256 waiting is 0.6 s of the two threads' work. A login over it
# is answered SASL_AUTHENTICATION_FAILED, saying the broker is busy (the client
# connects again: librdkafka and kafka-python retry with backoff).
SASL_LOGINS_WAITING_MAX = 256

# --- Spark (shmlog.spark) -----------------------------------------------------------------
# How long a Spark task waits for its broker's copy of a partition to cover its range:
# a follower's high watermark trails the leader's (which the plan used) by one fetch
# round trip; an observer or an out-of-sync follower may be catching up from further
# behind. Half a minute covers a loaded machine; longer means the copy is not fetching.
SPARK_REPLICA_WAIT_MS = 30_000
# How often it looks at that high watermark meanwhile (one shared-memory load).
SPARK_REPLICA_POLL_MS = 10
# A read's offset ranges are cut at this many records, so a backlog becomes several
# Spark tasks (and Arrow batches of bounded size), not one task per whole partition.
SPARK_MAX_RECORDS_PER_PARTITION_DEFAULT = 4_000_000
# How much one task fetches per Arrow batch, and how long it waits for records its
# plan says are there (they are below the high watermark, so at once).
SPARK_FETCH_BYTES = 4 << 20
SPARK_STALL_TIMEOUT_MS = 60_000
# The transactional sink's transaction timeout (kafka.transaction.timeout.ms): a task's
# transaction stays open from its first row until the driver commits the micro-batch, and a
# decided one must outlive a driver that died before completing it, until the query is
# restarted. Kafka's broker maximum (transaction.max.timeout.ms), 15 minutes.
SPARK_SINK_TRANSACTION_TIMEOUT_MS = 900_000

# --- network namespaces (devtools/netns.py: partition tests, the three-host demo) ---------
# ip and nft answer in milliseconds; a command that takes this long is stuck.
NETNS_COMMAND_TIMEOUT_S = 30.0
# How long the processes in a namespace get to exit on SIGTERM at teardown (then on
# SIGKILL): a broker flushes and leaves its cluster, a JVM runs its shutdown hooks.
NETNS_PROCESS_STOP_TIMEOUT_S = 10.0
# How often teardown lists a namespace's processes again while they exit.
NETNS_PROCESS_POLL_S = 0.1

# --- replication sockets: dead-peer detection ---------------------------------------------
# The kernel's TCP keepalive and retransmission timeout, not ZMTP heartbeats (libzmq
# 4.3.5 aborts on a heartbeat due on a connection that failed while its receive queue
# was full: zmq_replication's rules). An idle connection is probed after 1 s, every
# second, and dropped after 3 probes unanswered; data unacknowledged for 3 s drops it
# too: a half-open connection (a peer's host gone, a dropped route) is noticed in
# seconds, not at the kernel's TCP timeout (minutes), as the heartbeats did.
REPLICATION_KEEPALIVE_IDLE_S = 1
REPLICATION_KEEPALIVE_INTERVAL_S = 1
REPLICATION_KEEPALIVE_PROBES = 3
REPLICATION_RETRANSMIT_TIMEOUT_MS = 3000

# --- console tools (cli/console.py) -------------------------------------------------------
# Records `shmlog produce` leaves unacknowledged before it waits for the oldest: a few
# hundred default batches (16 KiB) of short lines, so the wait is for a batch the
# broker appended long ago (the ring, drained as it fills, holds a fraction of them:
# a full one blocks the send until there is room) and throughput is unchanged, while
# memory stays a few MB however long the input (a future per line kept to the end
# held 286 MB for a million lines).
CONSOLE_PRODUCE_UNACKNOWLEDGED_RECORDS_MAX = 1 << 16
# tqdm shows a bar only above a terminal's last row: the rows it is told the terminal
# has, at least (its own default when it cannot tell).
CONSOLE_TERMINAL_ROWS_MIN = 20
# How long one poll of consume waits: how soon Ctrl-C or --timeout-ms is noticed.
CONSOLE_CONSUME_POLL_MS = 200
# How long `shmlog produce`, stopped by Ctrl-C, waits for the broker to acknowledge what
# it sent (then closes, counting what was acknowledged): a broker drains a full 2 MiB ring
# in milliseconds, so this bounds only a stalled one, and Ctrl-C must end the command
# in a time a person waits.
CONSOLE_PRODUCE_STOP_FLUSH_S = 10.0
# How long `dump --verify` waits for the broker of a segment's data directory to say
# where its partition's row is (a request the broker answers in milliseconds): past it,
# no broker is taken to serve the segment and the whole file is verified.
DUMP_METADATA_TIMEOUT_MS = 2_000

# --- kafka-python API fit (producer callbacks, commit_async) ------------------------------
# How often a producer's callback thread looks for completed batches while futures
# have callbacks waiting: a completion is a few loads once the lock is free, and a
# millisecond is far below Kafka's own sender wake-ups (linger.ms, requests in flight).
PRODUCER_CALLBACK_POLL_MS = 1
# How many async commits a consumer may have in flight before commit_async waits for
# the oldest (Kafka's client has no such bound; ours keeps callbacks bounded).
ASYNC_COMMITS_IN_FLIGHT_MAX = 64

# --- the Kafka tools (delete-records, offsets, log-dirs) ----------------------------------
# How often Admin.delete_records asks again while a low watermark is below its offset:
# a follower learns the new log start from its next fetch response (at most
# replica.fetch.wait.max.ms away) and reports it in the fetch after that.
DELETE_RECORDS_POLL_MS = 20

# --- observability (server/stats.py, server/prometheus.py, common/metrics.py, cli/status.py) ---
# Rates (records/s, bytes/s) are over the last 10 s: long enough to smooth a producer's
# bursts, short enough that `shmlog status --watch` shows a change within seconds (top's
# feel; Kafka's own sampled rates span 30-60 s, Prometheus computes its own from the
# _total counters anyway). One bucket per second: a window holds 10 numbers.
METRICS_RATE_WINDOW_S = 10
METRICS_RATE_BUCKET_S = 1
# The broker samples its partitions' offsets and its groups' commits this often (a
# vectorised read of the state table, plus one look at each group's committed offsets).
METRICS_SAMPLE_INTERVAL_MS = 1_000
# The appender drain time histogram's upper bounds (seconds): a pass takes tens of
# microseconds idle-to-busy, up to milliseconds when DRAIN_ENTRIES_MAX large batches
# are copied, more when a roll or a slow-path entry (zstd) is among them.
DRAIN_SECONDS_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                         0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# A Prometheus scrape asks the broker's loop for its stats over the control socket; a
# loop busy with a long request (a topic of many partitions created) answers in
# seconds. Prometheus' default scrape timeout is 10 s: answer (or fail) before it.
METRICS_STATS_TIMEOUT_MS = 8_000
# `shmlog status --watch`: the default refresh (watch(1)'s 2 s), and the shortest one
# allowed (each refresh is a request the broker's loop answers).
STATUS_WATCH_INTERVAL_S = 2.0
STATUS_WATCH_INTERVAL_S_MIN = 0.1
# A Prometheus endpoint on a port above this does not exist (TCP ports are 16-bit).
METRICS_PORT_MAX = 65_535
# The endpoint's HTTP server (server/metrics_http.py), one thread for every connection.
# Connections open at once: a Prometheus holds one per scrape (an HA pair two), an
# operator's curl one more; 64 is far above that and far below what the broker needs
# its descriptors for (a 1,024 soft RLIMIT_NOFILE is common). Past it, closed at once.
METRICS_CONNECTIONS_MAX = 64
# A scraper sends its request line and headers (a few hundred bytes, one packet) as it
# connects: a connection that has not within 5 s is idle or a slowloris, and closed.
METRICS_REQUEST_TIMEOUT_S = 5.0
# Prometheus' default scrape_timeout is 10 s: a client that took none of its reply for
# that long has given up on it.
METRICS_WRITE_TIMEOUT_S = 10.0
# A request's head: a scrape's is a few hundred bytes; 8 KiB is what common web servers
# allow for a header line (Apache's LimitRequestFieldSize 8190, nginx's 8k buffers).
METRICS_REQUEST_SIZE_MAX = 8192
# listen(2)'s backlog, and the connections accepted per turn of the loop (the kernel
# caps it at net.core.somaxconn, 4096 on current kernels).
METRICS_LISTEN_BACKLOG = 64
# An accept refused by the open-files limit is tried again after this long: the
# listening socket stays readable meanwhile, and trying at every turn would spin.
METRICS_ACCEPT_RETRY_S = 0.1
# How often the server's thread looks up from its sockets: to close connections past
# their deadline (a tenth of the shortest) and to see the broker stopping.
METRICS_POLL_S = 0.1
# A rendered scrape is served again for this long: the broker samples its offsets once
# a second (METRICS_SAMPLE_INTERVAL_MS), so a newer render shows nearly the same
# numbers, while each render is a stats request the broker's loop answers between
# drains: eight scrapers in a loop raised produce p99 from 0.3 to 3.7 ms (issue 27).
METRICS_SCRAPE_CACHE_S = 1.0
# Renders kept at once, one per distinct (Accept, Accept-Encoding, name[] filter);
# Prometheus sends the same headers at every scrape, so one or two are used.
METRICS_SCRAPE_CACHE_ENTRIES_MAX = 4

# --- the producer (client/, ring.py) ------------------------------------------------------
# Back-off of a blocked put: spin this many checks, then yield the CPU this many
# times, then sleep, doubling from the first sleep to the longest (a full ring means
# the appender is behind by at least a ring's worth of bytes, so sleeping briefly
# costs nothing, while spinning would steal the core it needs).
RING_PUT_SPIN_COUNT = 100
RING_PUT_YIELD_COUNT = 100
RING_PUT_SLEEP_FIRST_S = 20e-6
RING_PUT_SLEEP_LONGEST_S = 1e-3

# A shared-memory object's name: /dev/shm's NAME_MAX is 255 bytes; 200 leaves room for
# the prefix a name is made with.
SHARED_MEMORY_NAME_LENGTH_MAX = 200
# Kafka's metadata.max.age.ms default: a topic's cached metadata (its rows, its
# max.message.bytes) is read again at the first batch after this long.
METADATA_MAX_AGE_S = 300.0
# A future's get(), and a linger.ms=0 producer's linger thread waiting for the batch
# ahead of those it gathers, sleep on the ring's completions (the broker wakes them:
# ring_layout) this long at most before they look again: what a wake lost to a broker
# that stopped costs. Polling instead, 200 producers waiting at once starved the broker
# of CPU on 2 cores (bench_scale: 88 records/s each at a fixed 50 us).
RESULT_WAIT_S = 10e-3
# After this long without an acknowledgement, ask the broker to take the ring again
# (it may have restarted); a request waits at most RESUME_REQUEST_MS for an answer.
RESUME_AFTER_S = 0.5
RESUME_REQUEST_MS = 200
# A producer's close() without a timeout waits this long for a broker that is gone
# (none answers the resume requests) to come back and complete what it put, then
# fails the rest with BrokerNotAvailableError and returns: a restarted broker
# answers within seconds (test_broker's SIGKILL restarts take about 2 s), and
# Kafka's delivery.timeout.ms (120 s) bounds a batch's wait there.
CLOSE_BROKER_WAIT_S = 30.0

# --- the broker (server/broker.py, broker/) -----------------------------------------------
# The longest sleep: bounds how late a timer fires (they are due every second).
BROKER_IDLE_SLEEP_LONGEST_S = 0.1
# Broker.start: how long one ping waits, and the pause between pings (a ping fails at
# once until the socket exists; a starting broker compiles for seconds).
BROKER_STARTUP_PING_MS = 200
BROKER_STARTUP_POLL_S = 0.02
# The warm-up's scratch broker: rows of its state table, its ring's capacity, the size of
# the records it produces (a few of them fill its 4 KiB segments, so they roll), and how
# long it waits for its cleaning (a few ms; a cold numba cache compiles for seconds).
WARM_UP_ROWS = 8
WARM_UP_RING_CAPACITY = 1 << 16
WARM_UP_SEGMENT_BYTES = 4096
WARM_UP_VALUE_SIZE = 1000
WARM_UP_CLEANING_WAIT_S = 120.0
WARM_UP_POLL_S = 0.001
# How often the control thread looks up from the socket to see the broker stopping.
CONTROL_POLL_MS = 100
# A service whose tick failed (a full disk, the open-files limit) is ticked again after
# this long, not at every turn of the loop (its deadline did not move): the interval of
# the liveness and flush checks, the broker's other housekeeping retried at the limit.
PERIODIC_RETRY_MS = 1_000
# A ring under our prefix whose header has no producer pid yet is being made (Ring.create
# writes it microseconds after creating the object); one left so for this long lost its
# maker in between and is reclaimed.
RING_CREATION_GRACE_S = 60.0
# No process has a pid above Linux's PID_MAX_LIMIT (4,194,304 = 2^22 on 64-bit systems; the
# pid_max sysctl can only be lowered from it). A ring's pid word is its producer's to
# write: anything outside 1..this is treated as a producer that is gone (issue 27).
PID_MAX = 1 << 22
# The producers one broker drains at once (its producers_max setting's default). Each
# registered ring is one mapping of the broker's (of vm.max_map_count's 65530), ~10 KiB
# of its parked-completion table, a row the compiled drain visits every round, and its
# ring_size of /dev/shm: 1024 producers of the default ring are 1 GiB of /dev/shm, and
# issue 26 asks for 200 on one broker. Past it a producer gets TooManyProducersError.
PRODUCERS_MAX_DEFAULT = 1024

# -- the Kafka listener (shmlog/wire) ---------------------------------------------------
# Kafka's socket.request.max.bytes default (100 MiB): a request's 4-byte size is checked
# against it before a byte of its body is read; one over it closes the connection.
KAFKA_REQUEST_SIZE_MAX_DEFAULT = 100 * 1024 * 1024
# Kafka's connections.max.idle.ms default (10 minutes): a connection with nothing in
# flight and nothing received for this long is closed.
KAFKA_CONNECTIONS_IDLE_MS_DEFAULT = 600_000
# Connections one client address may hold at once (Kafka's max.connections.per.ip; its
# default is unbounded). Each is a descriptor of the broker's, a receive buffer of at most
# one request, and a selector entry: 1,000 per address keeps one runaway client on one
# host from taking the broker's descriptors, and a connection over it is closed at once.
KAFKA_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT = 1_000
# One recv of the listener (a socket buffer's worth): requests larger than this
# are read in several, into a buffer of the request's own size.
KAFKA_RECEIVE_CHUNK_SIZE = 64 * 1024
# How often the listener looks for connections idle past connections.max.idle.ms (a
# look walks every connection; idleness is counted in minutes).
KAFKA_LISTENER_POLL_S = 0.5
# After accept() fails for want of descriptors (EMFILE, ENFILE), the listener stops
# accepting for this long (the waiting connections stay queued in the kernel's backlog)
# rather than spin on a socket that stays readable.
KAFKA_ACCEPT_BACKOFF_S = 0.5
# The listener's backlog of connections not yet accepted (socket.listen).
KAFKA_LISTEN_BACKLOG = 128
# A connection's next request, already received, goes to the handlers as the one before
# is answered (a client that pipelines small requests, as librdkafka's producer does,
# has them answered in one pass of the loop) while at most this many bytes of its
# responses wait to be written; past it, the next waits for the writes (a client that
# sends and does not read holds at most this much of the broker's memory). A Fetch
# response is up to fetch.max.bytes.
KAFKA_PIPELINED_UNSENT_MAX = 1024 * 1024
# Buffers one sendmsg() of the listener writes at most (Linux's IOV_MAX, UIO_MAXIOV).
KAFKA_SEND_BUFFERS_MAX = 1024
# What a zstd frame may add to data it cannot compress (its header, block headers and
# checksum: zstd's ZSTD_COMPRESSBOUND adds about 1/256 plus a few hundred bytes): a Kafka
# batch's records are split into stored batches this much under max.message.bytes
# before they are compressed (record.kafka_batches).
ZSTD_FRAME_OVERHEAD_MAX = 8 * 1024
