"""``Consumer``: reads partitions on this host straight from the segment files.

Theory of operation
-------------------
The consumer asks the broker once for metadata (each partition's directory and its
row in the partition state table), attaches the table, and opens one
:class:`PartitionReader` per assigned partition. A poll then loads each high
watermark from shared memory (an acquire load), takes the batches below it as
views of the read-only mappings, and decodes them in compiled code: no syscall
and no copy of the record data on the hot path. :meth:`Consumer.poll_batch`
hands the columns over as they are. :meth:`Consumer.poll` keeps what it fetched
as those columns and a cursor per partition, and makes record objects only for
the ``max_records`` it returns (``RecordColumns.records``: one copy of their bytes,
then C-level slicing, ``tolist`` and ``tuple.__new__`` over a ``zip``, no Python
bytecode per record); the rest stay columns for the next call. Both go on from
one position per partition: ``poll_batch`` first moves the position back over
what ``poll`` buffered, so the two may be mixed and every record comes once, in
order.

Iteration (``for record in consumer``) is a generator: a full poll (the group's
work below, a fetch when nothing is buffered) makes up to ``max_poll_records``
records, and the generator hands them out through a list iterator, with no
Python call, clock read or group step per record. Group work is therefore done at
least once per ``max_poll_records`` records (Kafka's poll loop, with the same
``max_poll_interval_ms`` contract), and at once whenever nothing is buffered. It
makes fewer at a time when that keeps the garbage collector's youngest generation
below its threshold (250 records with Python's default of 700): the records made
then balance those freed, and iteration starts no collection at all.
Positions, and so commits, count only the records handed out: every other call
on the consumer (poll, poll_batch, commit, position, seek, pause, assign, close)
first puts what iteration made but has not handed out back in front of the
buffer (``_settle_iteration``), and the iteration goes on from there.

When nothing is new, a poll waits with the idle strategy of ``wakeup.pause``: it
keeps looking, then yields the CPU, and once nothing has come for a millisecond
it sleeps on the state table's consumer doorbell (a futex the broker rings after
every drain that appended records) until the broker rings it or the poll's
timeout passes. An idle consumer costs no CPU; a busy one never sleeps. Between
sleeps it checks now and then that the broker is alive; a restarted broker
publishes a new state table, which the consumer maps, keeping its positions.

With a ``group_id``, ``subscribe`` makes the consumer a member of a consumer group
(``groups.py``): each poll first acts on what its heartbeat thread noticed (a
rebalance, being fenced), joins the group when it must, calls the rebalance
listener, starts newly assigned partitions at their committed offsets, and commits
its positions every ``auto_commit_interval_ms`` when ``enable_auto_commit`` is set.
Without a group, ``subscribe`` assigns every partition of the topics.

``commit_async`` sends its commit on a worker thread of the consumer's (one, so
commits go in the order made) and, as Kafka does, runs its callback on the
consumer's thread: in the group work of a later poll (or iteration step), in
``commit``, which waits for the async commits before it, or in ``close``.
Deserializers, when given, turn the records a poll or an iteration step made into
new ones; without them poll does one attribute test more, nothing per record.

A deleted partition is :class:`UnknownTopicOrPartitionError` for a consumer that
assigned it by hand (its reader sees its state table row freed or given to another
partition); under a group subscription it just yields nothing until the rebalance
the deletion starts takes it away, and commits leave it out (Kafka's behaviour).

A consumer loads every kernel of its read path when it is made
(``reader.warm_kernels``: decoding, zstd batches, segments mapped or still
empty, the state table, the doorbell), before it joins a group: a poll, an
iteration, a ``poll_batch`` or a commit never compiles (the group's own work,
joins, heartbeats and commits, runs no kernel in this process).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import gc
import inspect
import logging
import operator
import os
import re
import time
from typing import Iterable, Iterator, Mapping, NamedTuple

from ..common import limits, settings
from ..common.errors import (
    ClientClosedError,
    CommitFailedError,
    InvalidConfigError,
    LocalProtocolError,
    OffsetOutOfRangeError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.metrics import FlowCounts, RateWindow
from ..common.paths import default_data_dir
from ..common.structs import OffsetAndMetadata, TopicPartition
from ..protocol.control_client import request
from ..record.records import Record, RecordColumns, decode_columns
from ..shm import state_layout as S
from ..shm import wakeup
from ..shm.state import PartitionStateTable, RowSnapshot, topic_key
from . import options as client_options
from .group_member import GroupMember, MemberConfig
from .reader import PartitionReader, warm_kernels

log = logging.getLogger(__name__)

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "OffsetAndTimestamp",
           "OffsetAndMetadata", "ConsumerRebalanceListener", "GroupMetadata"]

# How often an idle consumer checks that the broker it reads from is alive (and,
# when it is not, looks for a new one).
BROKER_CHECK_INTERVAL_S = 0.5
# How often a waiting poll looks whether a join under way (on the member's join
# thread) has finished, so its assignment is taken on at once: a rebalance is paced
# by heartbeats (hundreds of ms), and an idle check costs a few microseconds.
JOIN_CHECK_INTERVAL_S = 0.005
# Kafka's max.poll.records and max.partition.fetch.bytes defaults.
MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BYTES_DEFAULT = 1 << 20
# A ConsumerRecord and its headers list: the objects the garbage collector tracks
# per record made; and a margin for the others a chunk of iteration makes (its list
# and iterator, a poll's dictionaries, a fetch's columns: ~80 measured, when the
# collector's count settles 616 of 700 with the default threshold).
TRACKED_OBJECTS_PER_RECORD = 2
ITERATION_OTHER_OBJECTS = 200
# What a commit the consumer makes by itself (auto commit, before a revocation) may
# be refused for and go on: fenced by a rebalance, or a partition deleted (or its
# log truncated) since its position was taken. Kafka logs these too.
_COMMIT_REFUSALS = (CommitFailedError, UnknownTopicOrPartitionError, OffsetOutOfRangeError)


def _remaining_ms(started: float, timeout_ms: int) -> int:
    return max(0, int(timeout_ms - (time.monotonic() - started) * 1000))


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class GroupMetadata(NamedTuple):
    group_id: str
    generation_id: int
    member_id: str


class ConsumerRebalanceListener:
    """Called from ``poll`` when the group's assignment of this consumer changes
    (Kafka's interface). Override what you need."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before partitions go to another member: commit what was processed. With
        an eager assignor, every partition is revoked before each rebalance."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """After the rebalance: the partitions added to this consumer."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """This consumer was fenced (missed its session, or was not polled within
        max_poll_interval_ms): the partitions may belong to others already, so
        committing is pointless. Kafka's default: treat them as revoked."""
        self.on_partitions_revoked(lost)


# A Record with the partition it came from in front: topic, partition, offset,
# timestamp, timestamp_type, key, value, headers.
ConsumerRecord = NamedTuple("ConsumerRecord", [("topic", str), ("partition", int),
                                               *Record.__annotations__.items()])


def _deserialized(key_deserializer, value_deserializer, records: list) -> list:
    """``records`` with their keys and values passed through the deserializers
    (``f(topic, data)``, None too: kafka-python's ``Fetcher._deserialize``)."""
    made = []
    for record in records:
        topic = record.topic
        made.append(record._replace(
            key=record.key if key_deserializer is None else key_deserializer(topic, record.key),
            value=record.value if value_deserializer is None
            else value_deserializer(topic, record.value)))
    return made


def _offset_and_metadata(value) -> OffsetAndMetadata:
    """A commit's value: an offset, our OffsetAndMetadata, or any tuple with
    ``offset`` and ``metadata`` fields (kafka-python's has a third, leader_epoch)."""
    if isinstance(value, OffsetAndMetadata):
        return value
    if hasattr(value, "offset"):
        return OffsetAndMetadata(value.offset, getattr(value, "metadata", None) or "")
    return OffsetAndMetadata(value)


class _Assigned:
    def __init__(self, reader: PartitionReader):
        self.reader = reader
        self.position: int | None = None
        self.paused = False


class _Fetched:
    """One partition's records fetched and not yet returned: the fetch's columns and
    a cursor, the index of the first record not returned. Records are made only for
    what a poll returns."""

    __slots__ = ("partition", "columns", "cursor")

    def __init__(self, partition: TopicPartition, columns: RecordColumns):
        self.partition = partition
        self.columns = columns
        self.cursor = 0

    def remaining(self) -> int:
        return len(self.columns) - self.cursor

    def next_offset(self) -> int:
        return int(self.columns.offsets[self.cursor])

    def take(self, limit: int) -> list:
        """Up to ``limit`` records from the cursor on, as ConsumerRecords."""
        start, self.cursor = self.cursor, min(self.cursor + limit, len(self.columns))
        return self.columns.records(ConsumerRecord, *self.partition, start=start,
                                    stop=self.cursor)


class Consumer:
    """Reads topics of the local broker (kafka-python's shape).

    Parameters
    ----------
    *topics : str
        Subscribe to these.
    bootstrap : str, optional
        The broker's data directory (default: ``$SHMLOG_DATA_DIR`` or the default).
    group_id : str, optional
        Join this consumer group when subscribing, and commit offsets to it.
    auto_offset_reset : "latest", "earliest" or "none"
        Where to start without a committed offset or position, or after the position
        fell out of the log.
    max_poll_records, fetch_max_bytes : int
        Per poll, and per partition per poll.
    consumer_timeout_ms : int, optional
        Iteration stops after this long without a record (default: never).
    enable_auto_commit, auto_commit_interval_ms
        Commit the positions of what poll returned, from poll, this often (and on
        close): at-least-once for records processed before the next poll.
    session_timeout_ms, heartbeat_interval_ms, max_poll_interval_ms,
    partition_assignment_strategy, client_id
        Kafka's group settings (see :class:`groups.MemberConfig`).
    bootstrap_servers : str or [str], optional
        kafka-python's name for ``bootstrap``.
    key_deserializer, value_deserializer : callable, optional
        Applied to each record's key and value before poll or iteration returns it
        (kafka-python's rule: ``client_options.deserializer``); without them records
        are made as before, at no extra cost.
    default_offset_commit_callback : callable, optional
        ``commit_async``'s callback when it is given none (kafka-python's).
    **kafka_options
        kafka-python's other options: taken and ignored, or refused
        (``client_options``).

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range (checked before the broker
        is asked anything), or is no option at all.
    UnsupportedKafkaOptionError
        A Kafka option shmlog does not support (``isolation_level="read_committed"``, ...).
    """

    def __init__(self, *topics: str, bootstrap: str | None = None, group_id: str | None = None,
                 auto_offset_reset: str = "latest",
                 max_poll_records: int = MAX_POLL_RECORDS_DEFAULT,
                 fetch_max_bytes: int = FETCH_BYTES_DEFAULT,
                 consumer_timeout_ms: int | None = None,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3_000,
                 max_poll_interval_ms: int = 300_000,
                 partition_assignment_strategy: Iterable[str] = ("range", "cooperative-sticky"),
                 client_id: str | None = None, bootstrap_servers=None, key_deserializer=None,
                 value_deserializer=None, default_offset_commit_callback=None,
                 **kafka_options):
        # Every setting is checked before the broker is asked anything (settings.py);
        # the group's are checked by MemberConfig.
        self.data_dir = settings.bootstrap(bootstrap, bootstrap_servers) or default_data_dir()
        client_options.check_kafka_options(client_options.CONSUMER, kafka_options,
                                           _CONSUMER_SETTINGS)
        key_deserializer = client_options.deserializer(key_deserializer, "key_deserializer")
        value_deserializer = client_options.deserializer(value_deserializer,
                                                         "value_deserializer")
        # None unless a deserializer was given: then poll and iteration pass records
        # through it (one attribute test per poll otherwise, nothing per record).
        self._deserialize = None if key_deserializer is None and value_deserializer is None \
            else functools.partial(_deserialized, key_deserializer, value_deserializer)
        if default_offset_commit_callback is not None and \
                not callable(default_offset_commit_callback):
            raise InvalidConfigError(f"default_offset_commit_callback must be callable, got "
                                     f"{default_offset_commit_callback!r:.100}")
        self._default_commit_callback = default_offset_commit_callback
        self.auto_offset_reset = settings.choice("auto_offset_reset", auto_offset_reset,
                                                 ("latest", "earliest", "none"))
        self.max_poll_records = settings.integer("max_poll_records", max_poll_records, 1,
                                                 limits.POLL_RECORDS_MAX)
        self.fetch_max_bytes = settings.integer("fetch_max_bytes", fetch_max_bytes, 1,
                                                limits.FETCH_SIZE_MAX)
        self.consumer_timeout_ms = settings.optional_integer(
            "consumer_timeout_ms", consumer_timeout_ms, 0, limits.CLIENT_WAIT_MS_MAX)
        settings.flag("enable_auto_commit", enable_auto_commit)
        settings.integer("auto_commit_interval_ms", auto_commit_interval_ms, 0,
                         limits.CLIENT_WAIT_MS_MAX)
        for name, value in (("session_timeout_ms", session_timeout_ms),
                            ("heartbeat_interval_ms", heartbeat_interval_ms),
                            ("max_poll_interval_ms", max_poll_interval_ms)):
            settings.integer(name, value, 1, limits.CLIENT_WAIT_MS_MAX)
        settings.optional_text("group_id", group_id)
        settings.optional_text("client_id", client_id)
        self._closed = False
        self._assigned: dict[TopicPartition, _Assigned] = {}
        self._last_found = 0.0             # when a poll last found records (monotonic)
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self._subscription: tuple[tuple[str, ...], str | None] | None = None
        self._listener = ConsumerRebalanceListener()
        self._group = None
        self._joining: concurrent.futures.Future | None = None     # a join under way
        self._paused_over_join: set[TopicPartition] = set()
        # commit_async: (future, offsets, callback) in the order sent, on one worker.
        self._async_commits: collections.deque = collections.deque()
        self._committer: concurrent.futures.ThreadPoolExecutor | None = None
        member_config = MemberConfig(session_timeout_ms, heartbeat_interval_ms,
                                     max_poll_interval_ms, tuple(partition_assignment_strategy))
        self._attach()
        # Before joining a group: a first poll that compiled kernels (the GIL held
        # for seconds on a cold cache) would starve the heartbeat thread.
        warm_kernels()
        if group_id is not None:
            self._group = GroupMember(
                functools.partial(request, self.data_dir), group_id,
                client_id or f"shmlog-{os.getpid()}", member_config)
        # Records fetched and not yet returned, per partition; none is left empty.
        self._buffered: dict[TopicPartition, _Fetched] = {}
        # Iteration's records being handed out: (where they came from, the records,
        # the iterator over them), and the generator ``for record in consumer`` runs.
        self._iterating: tuple[_Fetched, list, Iterator] | None = None
        self._iteration: Iterator[ConsumerRecord] | None = None
        # metrics(): counted per fetch and per commit, never per record.
        self._fetch_counts = FlowCounts()
        self._commit_counts = RateWindow()
        if topics:
            self.subscribe(topics)

    def _attach(self) -> None:
        """Map the broker's state table (again, after a broker restart: a new broker
        makes a new table) and reopen the readers, keeping every position."""
        metadata = request(self.data_dir, "metadata")
        table = PartitionStateTable.attach(metadata["state_table"])
        old, self._table = getattr(self, "_table", None), table
        self._broker_pid = int(table.control[S.BROKER_PID_WORD])
        self._next_liveness_check = time.monotonic() + BROKER_CHECK_INTERVAL_S
        self._topics = {topic["name"]: topic for topic in metadata["topics"]}
        for partition, state in self._assigned.items():
            reader = self._open_reader(partition)
            state.reader.close()
            state.reader = reader
        if old is not None:
            old.close()

    def _check_broker(self) -> None:
        """While idle, now and then: is the broker whose table we read still alive?
        (A system call, so never on a poll that finds records.)"""
        now = time.monotonic()
        if now < self._next_liveness_check:
            return
        self._next_liveness_check = now + BROKER_CHECK_INTERVAL_S
        try:
            os.kill(self._broker_pid, 0)
            return
        except ProcessLookupError:
            pass
        except PermissionError:
            return
        try:
            self._attach()
        except ShmlogError:
            pass                        # no broker yet: look again later

    # -- assignment --------------------------------------------------------------------
    def _partition_metadata(self, topic: str, partition: int) -> dict:
        if topic not in self._topics:
            reply = request(self.data_dir, "metadata")
            self._topics = {entry["name"]: entry for entry in reply["topics"]}
        entries = self._topics.get(topic, {"partitions": []})["partitions"]
        if not 0 <= partition < len(entries):
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition} on the broker")
        return entries[partition]

    def _open_reader(self, partition: TopicPartition) -> PartitionReader:
        entry = self._partition_metadata(*partition)
        return PartitionReader(entry["directory"], self._table, entry["row"],
                               topic_key=topic_key(self._topics[partition.topic]["topic_id"]),
                               partition=partition.partition)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Consume these topics, and those whose whole name matches ``pattern`` (a
        regular expression; internal topics never match).

        With a ``group_id``, the group shares their partitions among its members:
        the consumer joins at its next poll, and ``listener`` hears of every change.
        Without one, the consumer takes every partition of the topics there are now.
        """
        topics = (topics,) if isinstance(topics, str) else tuple(topics)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise LocalProtocolError(f"pattern {pattern!r}: {error}") from None
        if self._group is not None:
            self._subscription = (tuple(sorted(set(topics))), pattern)
            self._listener = listener or ConsumerRebalanceListener()
            self._group.rejoin_needed = True
            return
        if pattern is not None:
            self._topics = {entry["name"]: entry for entry in request(self.data_dir,
                                                                      "metadata")["topics"]}
            topics += tuple(sorted(name for name in self._topics if not name.startswith("__")
                                   and re.fullmatch(pattern, name)))
        partitions = []
        for topic in topics:
            self._partition_metadata(topic, 0)
            partitions += [TopicPartition(topic, entry["partition"])
                           for entry in self._topics[topic]["partitions"]]
        self._assign(partitions)

    def unsubscribe(self) -> None:
        """Stop consuming (and leave the group, committing first when auto commit is on)."""
        if self._group is not None and self._subscription is not None:
            self._commit_on_revoke(set(self._assigned))
            self._listener.on_partitions_revoked(set(self._assigned))
            # Also cancels a join under way: it ends in JoinCancelledError, which
            # nobody waits for, having left whatever it joined.
            self._group.leave()
            self._joining = None
        self._subscription = None
        self._assign([])

    def group_metadata(self) -> GroupMetadata | None:
        """The group, generation and member id this consumer has now (Kafka's
        ``groupMetadata()``), or None without a group."""
        if self._group is None:
            return None
        return GroupMetadata(self._group.group_id, self._group.generation,
                             self._group.member_id)

    def subscription(self) -> set[str]:
        return set(self._subscription[0]) if self._subscription else set()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces the assignment; no group
        membership, though offsets may still be committed to ``group_id``)."""
        if self._subscription is not None:
            raise LocalProtocolError("this consumer subscribed through its group; "
                                     "unsubscribe before assigning partitions by hand")
        self._assign(partitions)

    def _assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._settle_iteration()
        wanted = [TopicPartition(*partition) for partition in partitions]
        for partition in list(self._assigned):
            if partition not in wanted:
                self._assigned.pop(partition).reader.close()
        for partition in wanted:
            if partition not in self._assigned:
                self._assigned[partition] = _Assigned(self._open_reader(partition))
        self._buffered = {partition: fetched for partition, fetched in self._buffered.items()
                          if partition in self._assigned}

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def paused(self) -> set[TopicPartition]:
        """The partitions :meth:`pause` paused (kafka-python's ``paused()``)."""
        return {partition for partition, state in self._assigned.items() if state.paused}

    def topics(self) -> set[str]:
        """Every topic on the broker but the internal ones (asks the broker)."""
        self._topics = {entry["name"]: entry for entry in request(self.data_dir,
                                                                  "metadata")["topics"]}
        return {name for name in self._topics if name not in INTERNAL_TOPICS}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partition numbers, or None when there is no such topic
        (kafka-python's rule)."""
        if topic not in self._topics:
            self.topics()
        entry = self._topics.get(topic)
        return None if entry is None else {part["partition"] for part in entry["partitions"]}

    def highwater(self, partition: TopicPartition) -> int:
        """The partition's high watermark now (the offset the next committed record
        gets), read from the broker's state table: no request, always current."""
        return self._snapshot(partition).high_watermark

    def pause(self, *partitions: TopicPartition) -> None:
        self._settle_iteration()             # iteration returns no more of them
        for partition in partitions:
            self._state(partition).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for partition in partitions:
            self._state(partition).paused = False

    def _state(self, partition: TopicPartition) -> _Assigned:
        try:
            return self._assigned[TopicPartition(*partition)]
        except KeyError:
            raise LocalProtocolError(f"{partition} is not assigned to this consumer") from None

    # -- positions ---------------------------------------------------------------------
    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return {TopicPartition(*p): self._snapshot(p).log_start_offset for p in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        """The high watermarks: the offset the next appended record will get."""
        return {TopicPartition(*p): self._snapshot(p).high_watermark for p in partitions}

    def _snapshot(self, partition: TopicPartition) -> RowSnapshot:
        """The partition's row, checked to still be the partition's (a reader maps
        nothing before its first read, so an unassigned one costs no system call)."""
        partition = TopicPartition(*partition)
        state = self._assigned.get(partition)
        if state is not None:
            return state.reader.snapshot()
        reader = self._open_reader(partition)
        try:
            return reader.snapshot()
        finally:
            reader.close()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise LocalProtocolError(f"offset must be a non-negative integer, got {offset!r}")
        self._settle_iteration()
        self._state(partition).position = offset
        self._buffered.pop(TopicPartition(*partition), None)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for partition, offset in self.beginning_offsets(partitions or self._assigned).items():
            self.seek(partition, offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for partition, offset in self.end_offsets(partitions or self._assigned).items():
            self.seek(partition, offset)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record this consumer will return for the partition."""
        state = self._state(partition)
        if state.position is None:
            self._reset(TopicPartition(*partition), state)
        self._settle_iteration()
        fetched = self._buffered.get(TopicPartition(*partition))
        return fetched.next_offset() if fetched is not None else state.position

    def offsets_for_times(self, timestamps: dict) -> dict:
        """For each partition, the first offset whose timestamp is >= the one given
        (as :class:`OffsetAndTimestamp`), or None when there is none."""
        found = {}
        for partition, timestamp in timestamps.items():
            reply = request(self.data_dir, "offset_for_timestamp", topic=partition[0],
                            partition=partition[1], timestamp=int(timestamp))
            found[TopicPartition(*partition)] = (
                OffsetAndTimestamp(reply["offset"], reply["timestamp"])
                if reply["offset"] is not None else None)
        return found

    def _reset(self, partition: TopicPartition, state: _Assigned) -> None:
        if self.auto_offset_reset == "none":
            raise OffsetOutOfRangeError(
                f"{partition.topic}-{partition.partition} has no valid position and "
                f"auto_offset_reset is 'none'; seek first", offset=-1,
                log_start_offset=-1, log_end_offset=-1)
        row = state.reader.snapshot()
        state.position = (row.log_start_offset if self.auto_offset_reset == "earliest"
                          else row.high_watermark)

    # -- fetching ----------------------------------------------------------------------
    def _fetch(self, partition: TopicPartition, state: _Assigned, max_bytes: int):
        """One partition's next columns (or None); advances its position."""
        if state.position is None:
            self._reset(partition, state)
        try:
            result = state.reader.read(state.position, max_bytes)
        except OffsetOutOfRangeError:
            self._reset(partition, state)            # retention passed us: Kafka resets
            result = state.reader.read(state.position, max_bytes)
        if not result.data.size:
            state.position = max(state.position, result.next_offset)   # past a compacted gap
            return None
        columns = decode_columns(result.data, start_offset=state.position, verified=True)
        state.position = result.next_offset
        if not len(columns):
            return None
        self._fetch_counts.record(partition.topic, len(columns), int(result.data.size))
        return columns

    def poll_batch(self, timeout_ms: int = 0, max_bytes: int | None = None) -> dict:
        """New records as columns, per partition: numpy arrays of offsets,
        timestamps and key/value positions into the mapped bytes (zero copy for
        uncompressed batches). Waits up to ``timeout_ms`` for something new.

        It goes on from the same position as :meth:`poll`: records that ``poll``
        fetched and has not returned yet come first."""
        self._check_open()
        self._rewind_buffered()
        return self._wait(lambda: self._poll_columns(max_bytes or self.fetch_max_bytes),
                          time.monotonic(), timeout_ms)

    def _rewind_buffered(self) -> None:
        """Move each position back to the first record that poll fetched but has not
        returned, and drop those records: a fetch from there reads them again (a view
        of the mapped segment, no copy), so both polls draw from one position."""
        self._settle_iteration()
        for partition, fetched in self._buffered.items():
            self._assigned[partition].position = fetched.next_offset()
        self._buffered.clear()

    def _poll_columns(self, max_bytes: int) -> dict[TopicPartition, RecordColumns]:
        found = {}
        deleted = None
        for partition, state in self._assigned.items():
            if state.paused:
                continue
            try:
                columns = self._fetch(partition, state, max_bytes)
            except UnknownTopicOrPartitionError as error:
                deleted = error
                continue
            if columns is not None:
                found[partition] = columns
        if deleted is not None and self._subscription is None:
            # Assigned by hand: the application must hear of it (Kafka's consumer
            # raises too). What this poll fetched from the other partitions is put
            # back, so the error loses no record.
            for partition, columns in found.items():
                self._assigned[partition].position = int(columns.offsets[0])
            raise deleted
        # A group's subscription: the broker rebalances the group when a topic is
        # deleted, and the partition goes with the next assignment; until then it
        # has nothing to read (Kafka's behaviour, no error for the application).
        return found

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """New records per partition, as :class:`ConsumerRecord` lists (at most
        ``max_records`` in all). Waits up to ``timeout_ms`` for something new."""
        self._check_open()
        self._settle_iteration()
        limit = max_records or self.max_poll_records
        grouped: dict[TopicPartition, list[ConsumerRecord]] = {}
        for fetched in self._ready(timeout_ms):
            if limit <= 0:
                break
            records = fetched.take(limit)
            grouped[fetched.partition] = records if self._deserialize is None else \
                self._deserialize(records)
            limit -= len(records)
            if not fetched.remaining():
                del self._buffered[fetched.partition]
        return grouped

    def _ready(self, timeout_ms: int) -> list[_Fetched]:
        """The group's poll-time work, then the fetched records to return from: those
        buffered for partitions not paused (they stay buffered while paused, Kafka's
        rule), or, when there are none, what a fetch finds within ``timeout_ms``."""
        started = time.monotonic()
        self._poll_group(0)          # first: a rebalance may take buffered partitions away
        ready = [fetched for partition, fetched in self._buffered.items()
                 if not self._assigned[partition].paused]
        if not ready:
            for partition, columns in self._wait(
                    lambda: self._poll_columns(self.fetch_max_bytes),
                    started, timeout_ms).items():
                self._buffered[partition] = fetched = _Fetched(partition, columns)
                ready.append(fetched)
        return ready

    def _wait(self, attempt, started: float, timeout_ms: int):
        """Do the group's poll-time work, then ``attempt()`` until it finds something
        or ``timeout_ms`` from ``started`` has passed, idling in between. Group work
        that comes up meanwhile (a rebalance, a join that finished) is done at once,
        and a long wait counts as polling for ``max_poll_interval_ms``."""
        deadline = started + timeout_ms / 1000
        self._group_step(started, timeout_ms)
        while True:
            found = attempt()
            now = time.monotonic()
            if found:
                self._last_found = now
            if found or now >= deadline:
                return found
            if self._group_work_due(now):
                self._group_step(started, timeout_ms)
                continue
            if now - self._last_found >= wakeup.YIELD_S:
                self._check_broker()
            # A join under way ends with no doorbell: look at it often meanwhile.
            slice_s = JOIN_CHECK_INTERVAL_S if self._joining is not None else \
                BROKER_CHECK_INTERVAL_S
            found = wakeup.pause(now - self._last_found, self._table.consumer_doorbell,
                                 attempt, min(deadline - now, slice_s))
            if found:
                return found

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """The records, one at a time; stops after ``consumer_timeout_ms`` without one.

        A full poll (the group's work, a fetch when nothing is buffered) makes up to
        ``max_poll_records`` records at a time (:meth:`_iteration_records`), which
        are then handed out by a generator delegating to a list iterator, with no
        Python call, clock read or group step per record: Kafka's poll loop, with
        the same ``max_poll_interval_ms`` contract. What the application has not
        been handed yet stays uncommitted, and any other call on the consumer (poll,
        commit, seek, pause, ...) first puts it back among the buffered records
        (:meth:`_settle_iteration`)."""
        if self._iteration is None:
            self._iteration = self._iterate()
        return self._iteration

    def __next__(self) -> ConsumerRecord:
        return next(iter(self))

    def _iterate(self) -> Iterator[ConsumerRecord]:
        while True:
            try:
                records = self._next_records()
            except BaseException:
                self._iteration = None          # a failed generator is over: start anew
                raise
            if records is None:
                self._iteration = None
                return
            yield from records

    def _next_records(self) -> Iterator[ConsumerRecord] | None:
        """Iteration's next records (an iterator over one partition's), after a full
        poll; None after ``consumer_timeout_ms`` without a record."""
        self._check_open()
        timeout = self.consumer_timeout_ms
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            self._settle_iteration()
            wait_ms = 100 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            for fetched in self._ready(wait_ms):
                records = fetched.take(self._iteration_records())
                if self._deserialize is not None:
                    records = self._deserialize(records)
                if not fetched.remaining():
                    del self._buffered[fetched.partition]
                iterator = iter(records)
                self._iterating = (fetched, records, iterator)
                return iterator
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _iteration_records(self) -> int:
        """How many records iteration makes at a time: ``max_poll_records``, or fewer
        so that making them (two tracked objects each: the tuple, its headers list)
        while the previous ones are freed keeps the garbage collector's youngest
        generation below its threshold. Iteration then starts no collection at all,
        where 500 at a time start one per chunk, each ageing the live records toward
        full collections of the whole heap (measured here: ~0.5 us a record)."""
        threshold = gc.get_threshold()[0]
        if threshold <= 0:
            return self.max_poll_records            # collection is off
        fitting = (threshold - ITERATION_OTHER_OBJECTS) // TRACKED_OBJECTS_PER_RECORD
        return max(1, min(self.max_poll_records, fitting))

    def _settle_iteration(self) -> None:
        """Put what iteration took but has not handed out back among the buffered
        records, and end its run over them: the consumer's positions are then those
        of the records the application has. (The application only ever holds
        records the iterator has passed, so its remaining length says how many.)"""
        if self._iterating is None:
            return
        fetched, records, iterator = self._iterating
        self._iterating = None
        unreturned = operator.length_hint(iterator)
        records.clear()                # the generator's ``yield from`` ends there
        if unreturned:
            fetched.cursor -= unreturned
            if fetched.partition not in self._buffered:
                # First again: these records come before any fetched since.
                self._buffered = {fetched.partition: fetched, **self._buffered}

    # -- the group ---------------------------------------------------------------------
    def _group_step(self, started: float, timeout_ms: int) -> None:
        """The group's work within a poll: a member with partitions keeps consuming
        them while a join is under way; one with none waits for the join (up to the
        poll's timeout), as there is nothing else to do."""
        self._poll_group(0)
        if self._joining is not None and not self._assigned:
            self._poll_group(_remaining_ms(started, timeout_ms))

    def _group_work_due(self, now: float) -> bool:
        """While a poll waits (not on its hot path): is there group work it should
        stop waiting for? Also counts the wait as polling (Kafka's poll timer)."""
        member = self._group
        if member is None or self._subscription is None:
            return False
        member.last_poll = now
        if self._joining is not None:
            return self._joining.done()
        return member.rejoin_needed or member.lost or member.poll_timed_out

    def _poll_group(self, timeout_ms: int) -> None:
        """Kafka's poll-time group work: act on being fenced, rejoin when the group
        rebalances (waiting at most ``timeout_ms`` for the rebalance; a join not done
        by then is picked up by a later poll), commit when auto commit is due."""
        member = self._group
        if member is None:
            return
        if self._async_commits:
            self._run_commit_callbacks(wait=False)
        member.last_poll = time.monotonic()
        if self._subscription is None:
            return
        if (member.lost or member.poll_timed_out) and self._joining is None:
            lost = set(self._assigned)
            self._assign([])
            if lost:
                self._listener.on_partitions_lost(lost)
        deadline = time.monotonic() + timeout_ms / 1000
        while member.rejoin_needed or self._joining is not None:
            if not self._rejoin(max(0.0, deadline - time.monotonic())):
                break
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._auto_commit()

    def _rejoin(self, timeout_s: float) -> bool:
        """Start a join, or wait up to ``timeout_s`` for the one under way and apply
        its assignment; False while it is still under way. (A cooperative member
        keeps consuming what it holds meanwhile; an eager one holds nothing.)"""
        member = self._group
        if self._joining is None:
            # Paused partitions stay paused if they come back (pause is the
            # application's flow control, not the group's).
            self._paused_over_join = {partition for partition, state in self._assigned.items()
                                      if state.paused}
            if not member.cooperative and self._assigned:
                # Eager: give up everything before joining (commit it first).
                revoked = set(self._assigned)
                self._commit_on_revoke(revoked)
                self._listener.on_partitions_revoked(revoked)
                self._assign([])
            topics, pattern = self._subscription
            self._joining = member.start_join(topics, pattern, set(self._assigned))
        try:
            assignment = {TopicPartition(*partition)
                          for partition in self._joining.result(timeout=timeout_s)}
        except concurrent.futures.TimeoutError:
            return False
        finally:
            if self._joining.done():
                self._joining = None
        if member.lost or member.poll_timed_out:
            # Fenced after this join finished (it left, or missed its session): the
            # assignment is stale and the partitions may be another's. Lose them
            # all and join again.
            lost = set(self._assigned)
            self._assign([])
            if lost:
                self._listener.on_partitions_lost(lost)
            member.rejoin_needed = True
            member.lost = member.poll_timed_out = False
            return True
        revoked = set(self._assigned) - assignment
        added = assignment - set(self._assigned)
        if revoked:
            # Given up first: dropping partitions is always safe. What this member
            # gave up reaches its new owner in the next generation, so join again
            # at once. (An eager member revoked everything before it joined; it
            # gets here only when the group moved from a cooperative assignor.)
            self._commit_on_revoke(revoked)
            self._listener.on_partitions_revoked(revoked)
            self._assign(sorted(set(self._assigned) - revoked))
            member.rejoin_needed = True
        try:
            # Everything the new partitions need, before any of them is taken on, so
            # a failure leaves the assignment as it was, not half applied. Metadata
            # again: the rebalance may be for new topics or new partitions.
            committed = {}
            if added:
                self._topics = {entry["name"]: entry for entry in request(
                    self.data_dir, "metadata")["topics"]}
                for partition in added:
                    self._partition_metadata(*partition)
                committed = member.committed(added)
        except ShmlogError as error:
            log.warning("group %s: taking on %d partitions of generation %d failed (%s); "
                        "joining again", member.group_id, len(added), member.generation, error)
            member.rejoin_needed = True
            return True
        self._assign(sorted(assignment))
        for partition in added:
            if partition in committed:
                self._assigned[partition].position = committed[partition][0]
            self._assigned[partition].paused = partition in self._paused_over_join
        self._listener.on_partitions_assigned(added)
        return True

    def _positions(self, partitions: Iterable[TopicPartition]) -> dict:
        """Positions known for these partitions (no reset is forced), leaving out
        deleted ones: the coordinator refuses a commit that names one."""
        self._settle_iteration()
        positions = {}
        for partition in partitions:
            state = self._assigned.get(partition)
            if state is not None and state.reader.deleted():
                continue
            fetched = self._buffered.get(partition)
            if fetched is not None:
                positions[partition] = fetched.next_offset()
            elif state is not None and state.position is not None:
                positions[partition] = state.position
        return positions

    def _commit_on_revoke(self, partitions: set[TopicPartition]) -> None:
        if not (self.enable_auto_commit and partitions and self._group is not None):
            return
        if self._group.lost or self._group.poll_timed_out:
            return                              # fenced: nothing may be committed
        try:
            self._commit_offsets({partition: OffsetAndMetadata(offset) for partition, offset
                                  in self._positions(partitions).items()})
        except _COMMIT_REFUSALS as error:
            log.warning("%s", error)

    def _auto_commit(self) -> None:
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000
        try:
            self._commit_offsets({partition: OffsetAndMetadata(offset) for partition, offset
                                  in self._positions(self._assigned).items()})
        except _COMMIT_REFUSALS as error:
            log.warning("auto commit: %s", error)

    def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
               ) -> None:
        """Commit offsets to the group: ``offsets`` (the offset of the next record to
        read, per partition), or by default the positions of every assigned
        partition, that is, everything poll has returned.

        Raises
        ------
        CommitFailedError
            The group rebalanced and this consumer's generation is over.
        LocalProtocolError
            The consumer has no group_id.
        """
        if self._group is None:
            raise LocalProtocolError("commit needs a consumer with a group_id")
        if self._async_commits:
            # Kafka's commitSync: the async commits before it finish (and their
            # callbacks run) first, so commits land in the order they were made.
            self._run_commit_callbacks(wait=True)
        self._commit_offsets(self._commit_entries(offsets))

    def _commit_entries(self, offsets) -> dict[TopicPartition, OffsetAndMetadata]:
        """A commit's offsets (the positions by default), checked."""
        if offsets is None:
            offsets = self._positions(self._assigned)
        entries = {TopicPartition(*partition): _offset_and_metadata(value)
                   for partition, value in offsets.items()}
        for partition, value in entries.items():
            if isinstance(value.offset, bool) or not isinstance(value.offset, int) or \
                    value.offset < 0:
                raise LocalProtocolError(f"offset for {partition} must be a non-negative "
                                         f"integer, got {value.offset!r}")
        return entries

    def _commit_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                        as_member: bool | None = None) -> None:
        if offsets:
            self._group.commit({partition: (value.offset, value.metadata)
                                for partition, value in offsets.items()},
                               as_member=self._subscription is not None
                               if as_member is None else as_member)
            self._commit_counts.record(1)

    def commit_async(self, offsets: Mapping | None = None, callback=None
                     ) -> concurrent.futures.Future:
        """Commit as :meth:`commit` does, on a worker thread, without waiting
        (kafka-python's ``commit_async``). Commits are sent in the order made.

        ``callback(offsets, response)`` (or ``default_offset_commit_callback``) runs
        on this consumer's thread in a later ``poll``, iteration step, ``commit`` or
        ``close``, as in Kafka: ``response`` is None when the commit succeeded,
        else the error (``CommitFailedError``, ...). Without a callback a failure is
        logged. Returns a future of the same outcome.

        Raises
        ------
        LocalProtocolError
            The consumer has no group_id, or an offset is invalid.
        """
        self._check_open()
        if self._group is None:
            raise LocalProtocolError("commit_async needs a consumer with a group_id")
        entries = self._commit_entries(offsets)
        if self._committer is None:
            self._committer = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"shmlog-commit-{self._group.group_id}")
        if len(self._async_commits) >= limits.ASYNC_COMMITS_IN_FLIGHT_MAX:
            concurrent.futures.wait([self._async_commits[0][0]])
            self._run_commit_callbacks(wait=False)
        future = self._committer.submit(self._commit_offsets, entries,
                                        self._subscription is not None)
        self._async_commits.append((future, entries,
                                    callback or self._default_commit_callback))
        return future

    def _run_commit_callbacks(self, wait: bool) -> None:
        """Run the callbacks of finished async commits, oldest first (with ``wait``,
        of all of them, waiting for each)."""
        while self._async_commits:
            future, offsets, callback = self._async_commits[0]
            if not wait and not future.done():
                return
            error = future.exception()
            self._async_commits.popleft()
            if callback is None:
                if error is not None:
                    log.warning("async commit of %d offsets failed: %s", len(offsets), error)
                continue
            try:
                callback(offsets, error)
            except Exception:
                log.exception("an offset commit callback raised")

    def committed(self, partition: TopicPartition, metadata: bool = False):
        """The group's committed offset for a partition (None when there is none);
        with ``metadata``, an :class:`OffsetAndMetadata`."""
        if self._group is None:
            raise LocalProtocolError("committed needs a consumer with a group_id")
        found = self._group.committed([TopicPartition(*partition)]).get(tuple(partition))
        if found is None:
            return None
        return OffsetAndMetadata(*found) if metadata else found[0]

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed; create a new one")

    def close(self, autocommit: bool = True) -> None:
        """Commit (when auto commit is on), leave the group, release the mappings.
        Closing again does nothing; a poll after close raises :class:`ClientClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._settle_iteration()
        self._iteration = None
        if self._async_commits:
            self._run_commit_callbacks(wait=True)
        if self._committer is not None:
            self._committer.shutdown()
        if self._group is not None:
            if autocommit and self._subscription is not None:
                self._commit_on_revoke(set(self._assigned))
            self._group.close()
        for state in self._assigned.values():
            state.reader.close()
        self._assigned.clear()
        self._table.close()

    def metrics(self) -> dict:
        """This consumer's metrics as kafka-python's ``metrics()`` gives them:
        ``{group: {name: value}}``. ``consumer-fetch-manager-metrics``: records and
        bytes read from the log (``records-consumed-total``, ``bytes-consumed-total``;
        records ``poll_batch`` reads again after ``poll`` buffered them count again)
        and their rates per second over the last ``limits.METRICS_RATE_WINDOW_S`` s,
        fetches that found records (``fetch-total``) with their average size and
        record count, and ``records-lag-max``: the largest lag (high watermark minus
        position) over the assigned partitions now; the same counts per topic in
        ``consumer-fetch-manager-metrics.<topic>``; with a group,
        ``consumer-coordinator-metrics``: commits (``commit-total``,
        ``commit-rate``) and ``assigned-partitions``. Counted once per fetch, never
        per record."""
        fetched = self._fetch_counts
        fetches = fetched.batches
        found = {"consumer-fetch-manager-metrics": {
            "records-consumed-total": fetched.records.total,
            "records-consumed-rate": fetched.records.rate(),
            "bytes-consumed-total": fetched.bytes.total,
            "bytes-consumed-rate": fetched.bytes.rate(),
            "fetch-total": fetches,
            "fetch-size-avg": fetched.bytes.total / fetches if fetches else 0.0,
            "records-per-request-avg": fetched.records.total / fetches if fetches else 0.0,
            "records-lag-max": self._lag_max()}}
        for topic, (records, size, _) in sorted(fetched.topics.items()):
            found[f"consumer-fetch-manager-metrics.{topic}"] = {
                "records-consumed-total": records.total,
                "records-consumed-rate": records.rate(),
                "bytes-consumed-total": size.total, "bytes-consumed-rate": size.rate()}
        if self._group is not None:
            found["consumer-coordinator-metrics"] = {
                "commit-total": self._commit_counts.total,
                "commit-rate": self._commit_counts.rate(),
                "assigned-partitions": len(self._assigned)}
        return found

    def _lag_max(self) -> int:
        """The largest high watermark minus position over the assigned partitions
        with a position (0 when none has one)."""
        lags = [0]
        for partition, state in self._assigned.items():
            buffered = self._buffered.get(partition)
            position = buffered.next_offset() if buffered is not None else state.position
            if position is None:
                continue
            try:
                lags.append(state.reader.snapshot().high_watermark - position)
            except ShmlogError:
                continue            # its topic went: the next poll says so, not metrics()
        return max(lags)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# Named in the error for a keyword that is neither a setting nor a Kafka option.
_CONSUMER_SETTINGS = tuple(name for name in inspect.signature(Consumer.__init__).parameters
                           if name not in ("self", "topics", "kafka_options"))
