"""A consumer's fetcher (Kafka's Fetcher): reads the assigned partitions from their
positions, keeps what it fetched and has not handed out, and makes the records a
poll or an iteration step returns.

Rules
-----
* No syscall and no copy of record data on the hot path: a fetch loads each high
  watermark from shared memory, takes the batches below it as views of the
  read-only mappings and decodes them in compiled code (``decode_columns``).
* Records are made only for what is handed out, by ``RecordColumns.records`` (one
  copy of their bytes, then C-level slicing, ``tolist`` and ``tuple.__new__`` over a
  ``zip``): no Python bytecode per record. Deserializers, when given, add one
  attribute test per poll and nothing per record without them.
* Positions, and so commits, count only the records handed out. Before anything
  reads or moves a position (:meth:`Fetcher.position`, :meth:`Fetcher.positions`,
  :meth:`Fetcher.assign`, a seek, a pause, a poll) what iteration made but has not
  handed out is put back in front of the buffer (:meth:`Fetcher.settle_iteration`).
* A deleted partition assigned by hand raises :class:`UnknownTopicOrPartitionError`
  from the fetch (and from ``position``), after putting back what the same fetch
  read from the others; a subscribed one leaves the assignment when a fetch,
  ``position`` or ``assignment`` finds it deleted (:attr:`Fetcher.on_deleted`, the
  coordinator's: the listener hears of it as lost, and the member joins again).
* Counted once per fetch, never per record (``metrics``).
* A fetch looks at the partitions that may have something new, not at every one
  assigned: those whose rows the state table's journal names since the last fetch,
  those a read left short of their high watermark, those moved or paused from
  outside (``SubscriptionState.touched``) and those found deleted. It looks at every
  one on its first fetch, after the assignment or its readers changed (a rebalance,
  a broker restart), when the journal lapped it or went back, after a fetch that
  raised, and at least every :data:`limits.FETCH_FULL_SCAN_INTERVAL_S`. A row the
  journal names is only a hint: a row the consumer does not hold is ignored, and a
  read still checks the row is its partition's.

Theory of operation
-------------------
A fetch reads every assigned partition that is not paused, up to ``max_bytes``
each, from its position (reset by ``auto_offset_reset`` when it has none or fell
out of the log), and advances the position past what it read. ``poll_batch`` hands
the columns over as they are. ``poll`` keeps them as :class:`CompletedFetch` (the
columns and a cursor per partition) and makes records for the ``max_records`` it
returns; the rest stay columns for the next call. Both go on from one position per
partition: ``poll_batch`` first moves each position back over what ``poll``
buffered, so the two may be mixed and every record comes once, in order.

Which partitions a fetch looks at (:class:`FetchChoice`): the broker names
every row it publishes in the table's journal (``state_layout``), and stores the
journal's sequence after the slots it covers. A fetch loads the sequence, reads the
slots from the one it saw last and maps their rows to its partitions through its
own dictionary (built at every full look); a seqlock's second load of the sequence
says whether the broker may have written over the slots meanwhile. A full look
loads the sequence before it reads a partition, so what is published during it is
named from there on. With one busy partition among 10 000, a fetch that finds
nothing new then costs one compiled load, not 10 000 reads.

When nothing is new, a poll waits with the idle strategy of ``wakeup.pause``: it
keeps looking, then yields the CPU, and once nothing has come for a millisecond
it sleeps on the state table's consumer doorbell (a futex the broker rings after
every drain that appended records) until the broker rings it or the poll's
timeout passes. An idle consumer costs no CPU; a busy one never sleeps. Between
sleeps it checks now and then that the broker is alive
(``ConsumerMetadata.check_broker``: a restarted broker's new table is mapped, the
readers reopened on it, every position kept). The group's work (``GroupWork``:
the consumer's coordinator) is done before a poll fetches, and while it waits as
soon as some comes up (a rebalance, a join that finished), every wait counting as
polling for ``max_poll_interval_ms``; a join under way is looked at every
:data:`limits.JOIN_CHECK_INTERVAL_S`, as it rings no doorbell.

Iteration (``for record in consumer``) takes a chunk of records at a time
(:meth:`Fetcher.next_records`) and hands them out through a list iterator.
It makes fewer than ``max_poll_records`` at a time when that keeps the garbage
collector's youngest generation below its threshold (250 records with Python's
default of 700): the records made then balance those freed, and iteration starts no
collection at all. What the application has not been handed yet is the iterator's
remaining length, which :meth:`settle_iteration` gives back to the buffer.
"""

from __future__ import annotations

import functools
import gc
import operator
import time
from typing import Callable, Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from ..common import limits
from ..common.errors import OffsetOutOfRangeError, ShmlogError, UnknownTopicOrPartitionError
from ..common.metrics import FlowCounts
from ..common.structs import TopicPartition
from ..record.records import Record, RecordColumns, decode_columns
from ..shm import state_layout as S
from ..shm import wakeup
from ..shm.state import JOURNAL_LAPPED
from .subscription_state import AssignedPartition, SubscriptionState

__all__ = ["Fetcher", "FetchChoice", "CompletedFetch", "ConsumerRecord", "GroupWork",
           "ScanCounts", "deserialized"]

# A ConsumerRecord and its headers list: the objects the garbage collector tracks
# per record made; and a margin for the others a chunk of iteration makes (its list
# and iterator, a poll's dictionaries, a fetch's columns: ~80 measured, when the
# collector's count settles 616 of 700 with the default threshold).
TRACKED_OBJECTS_PER_RECORD = 2
ITERATION_OTHER_OBJECTS = 200

# A Record with the partition it came from in front: topic, partition, offset,
# timestamp, timestamp_type, key, value, headers.
ConsumerRecord = NamedTuple("ConsumerRecord", [("topic", str), ("partition", int),
                                               *Record.__annotations__.items()])


class GroupWork(Protocol):
    """What a poll does for the consumer's group: ``consumer_coordinator.ConsumerCoordinator``."""

    joining: object                     # a join under way, or None

    def poll(self, timeout_ms: int) -> None: ...

    def step(self, started: float, timeout_ms: int) -> None: ...

    def work_due(self, now: float) -> bool: ...


def deserialized(key_deserializer, value_deserializer, records: list) -> list:
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


class CompletedFetch:
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


class ScanCounts:
    """How fetches chose the partitions they looked at (``Fetcher.metrics``): full looks
    at every assigned partition, and fetches that followed the journal with the
    partitions those looked at (in all, and the most one did)."""

    __slots__ = ("full_scans", "journal_fetches", "examined", "examined_max", "laps")

    def __init__(self):
        self.full_scans = self.journal_fetches = self.examined = self.examined_max = 0
        self.laps = 0                  # journal reads that found it lapped or gone back

    def journal_fetch(self, examined: int) -> None:
        self.journal_fetches += 1
        self.examined += examined
        self.examined_max = max(self.examined_max, examined)


class FetchChoice:
    """Which assigned partitions a fetch looks at (the module's rules; the theory's
    second part): every one now and then, else those the state table's journal
    names since the last fetch, those the last look left with more (:attr:`more`,
    which the fetcher sets after each look) and those touched."""

    def __init__(self, subscriptions: SubscriptionState):
        self.subscriptions = subscriptions
        self.counts = ScanCounts()
        # Partitions a read left short of their high watermark, or found deleted.
        self.more: set[TopicPartition] = set()
        # The table whose journal is followed, the sequence seen, the slots read into,
        # the assignment's version the row map was built for, the row map, each
        # partition's place in the assignment (the order fetches go in), and when
        # the next full look is due.
        self._table = None
        self._seen = 0
        self._slots = np.empty(S.JOURNAL_CAPACITY, np.int64)
        self._assignment_version = -1
        self._by_row: dict[int, TopicPartition] = {}
        self._order: dict[TopicPartition, int] = {}
        self._full_scan_due = 0.0

    def look_at_every_one_next(self) -> None:
        self._full_scan_due = 0.0

    def candidates(self) -> list[tuple[TopicPartition, AssignedPartition]]:
        """The assigned partitions this fetch looks at, in the assignment's order:
        every one (a full look, see the rules for when), or those the journal names
        since the last fetch, those a read left with more, and those touched."""
        subscriptions = self.subscriptions
        table = subscriptions.metadata.table
        now = time.monotonic()
        if table is self._table and subscriptions.version == self._assignment_version:
            sequence, count = table.journal_changes(self._seen, self._slots)
            if count == JOURNAL_LAPPED:
                self.counts.laps += 1
            elif now < self._full_scan_due:
                self._seen = sequence
                return self._named(count)
        return self._full_scan(table, now)

    def _full_scan(self, table, now: float) -> list[tuple[TopicPartition, AssignedPartition]]:
        """Every assigned partition, after loading the journal's sequence (what is
        published from now on is named after it) and mapping rows to partitions."""
        subscriptions = self.subscriptions
        self._seen = table.journal_sequence()
        if table is not self._table or subscriptions.version != self._assignment_version:
            self._table, self._assignment_version = table, subscriptions.version
            self._by_row = {state.reader.row: partition
                            for partition, state in subscriptions.assigned.items()}
            self._order = {partition: index
                           for index, partition in enumerate(subscriptions.assigned)}
        self._full_scan_due = now + limits.FETCH_FULL_SCAN_INTERVAL_S
        subscriptions.touched.clear()
        self.counts.full_scans += 1
        return list(subscriptions.assigned.items())

    def _named(self, count: int) -> list[tuple[TopicPartition, AssignedPartition]]:
        """The partitions of rows in the journal's ``count`` new slots (a row of no
        partition of ours is ignored), with those left with more and those touched."""
        subscriptions = self.subscriptions
        names = self.more | subscriptions.touched
        subscriptions.touched.clear()
        if count:
            by_row = self._by_row
            for row in set(self._slots[:count].tolist()):
                partition = by_row.get(row)
                if partition is not None:
                    names.add(partition)
        assigned, order = subscriptions.assigned, self._order
        chosen = [(partition, assigned[partition])
                  for partition in sorted(names, key=lambda name: order.get(name, -1))
                  if partition in assigned]
        self.counts.journal_fetch(len(chosen))
        return chosen


class Fetcher:
    """Fetches the assigned partitions of a :class:`SubscriptionState`.

    Parameters
    ----------
    subscriptions : SubscriptionState
        The partitions, their readers, positions and pauses (and, through its
        metadata, the broker's state table and doorbell).
    fetch_max_bytes, max_poll_records : int
        Per partition per fetch, and per poll (iteration's largest chunk).
    deserialize : callable, optional
        ``deserialize(records)``: the records a poll or an iteration step made,
        with keys and values deserialized (:func:`deserialized`); None: as made.

    The poll methods take the consumer's ``group`` (its ``ConsumerCoordinator``, or
    None without a group id), whose work they do before and while they wait.
    """

    def __init__(self, subscriptions: SubscriptionState, *, fetch_max_bytes: int,
                 max_poll_records: int, deserialize: Callable[[list], list] | None = None):
        self.subscriptions = subscriptions
        self.fetch_max_bytes = fetch_max_bytes
        self.max_poll_records = max_poll_records
        self.deserialize = deserialize
        self._last_found = 0.0             # when a fetch last found records (monotonic)
        # Records fetched and not yet returned, per partition; none is left empty.
        self._buffered: dict[TopicPartition, CompletedFetch] = {}
        # Iteration's records being handed out: (where they came from, the records,
        # the iterator over them).
        self._iterating: tuple[CompletedFetch, list, Iterator] | None = None
        # metrics(): counted per fetch, never per record.
        self._counts = FlowCounts()
        self._choice = FetchChoice(subscriptions)
        # The group's: ``on_deleted({partition: why})`` drops subscribed partitions
        # whose topic was deleted (None without a group).
        self.on_deleted: Callable[[dict[TopicPartition, str]], None] | None = None

    # -- polls -----------------------------------------------------------------------------
    def poll(self, timeout_ms: int, max_records: int | None, group: GroupWork | None) -> dict:
        """``Consumer.poll``'s work: records per partition, at most ``max_records``
        (``max_poll_records`` when None) in all, waiting up to ``timeout_ms``."""
        self.settle_iteration()
        return self._take(self._ready(timeout_ms, group), max_records or self.max_poll_records)

    def poll_batch(self, timeout_ms: int, max_bytes: int | None,
                   group: GroupWork | None) -> dict[TopicPartition, RecordColumns]:
        """``Consumer.poll_batch``'s work: the next columns per partition, from the
        same positions as :meth:`poll` (what it buffered comes first)."""
        self._rewind()
        max_bytes = max_bytes or self.fetch_max_bytes
        return self._wait(lambda: self._fetch_columns(max_bytes), time.monotonic(), timeout_ms,
                          group)

    def next_records(self, consumer_timeout_ms: int | None,
                     group: GroupWork | None) -> Iterator[ConsumerRecord] | None:
        """Iteration's next records (an iterator over one partition's), after a full
        poll; None after ``consumer_timeout_ms`` (None: never) without a record."""
        timeout = consumer_timeout_ms
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            self.settle_iteration()
            wait_ms = 100 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            records = self._iteration_records(self._ready(wait_ms, group))
            if records is not None:
                return records
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _ready(self, timeout_ms: int, group: GroupWork | None) -> list[CompletedFetch]:
        """The group's poll-time work, then the fetched records to return from: those
        buffered for partitions not paused, or, when there are none, what a fetch
        finds within ``timeout_ms``."""
        started = time.monotonic()
        if group is not None:
            group.poll(0)          # first: a rebalance may take buffered partitions away
        return self._buffered_ready() or self._buffer(self._wait(
            lambda: self._fetch_columns(self.fetch_max_bytes), started, timeout_ms, group))

    def _wait(self, attempt, started: float, timeout_ms: int, group: GroupWork | None):
        """Do the group's poll-time work, then ``attempt()`` until it finds something
        or ``timeout_ms`` from ``started`` has passed, idling in between. Group work
        that comes up meanwhile (a rebalance, a join that finished) is done at once,
        and a long wait counts as polling for ``max_poll_interval_ms``."""
        deadline = started + timeout_ms / 1000
        metadata = self.subscriptions.metadata
        if group is not None:
            group.step(started, timeout_ms)
        while True:
            found = attempt()
            now = time.monotonic()
            if found:
                self._last_found = now
            if found or now >= deadline:
                return found
            if group is not None and group.work_due(now):
                group.step(started, timeout_ms)
                continue
            if now - self._last_found >= limits.IDLE_YIELD_S:
                metadata.check_broker(self.subscriptions.reopen_readers)
            # A join under way ends with no doorbell: look at it often meanwhile.
            slice_s = limits.JOIN_CHECK_INTERVAL_S if group is not None and \
                group.joining is not None else limits.BROKER_CHECK_INTERVAL_S
            found = wakeup.pause(now - self._last_found, metadata.table.consumer_doorbell,
                                 attempt, functools.partial(min, deadline - now, slice_s))
            if found:
                return found

    # -- fetching --------------------------------------------------------------------------
    def _fetch(self, partition: TopicPartition, state: AssignedPartition, max_bytes: int):
        """One partition's next columns (or None); advances its position."""
        if state.position is None:
            self.subscriptions.reset(partition, state)
        try:
            result = state.reader.read(state.position, max_bytes)
        except OffsetOutOfRangeError:
            self.subscriptions.reset(partition, state)   # retention passed us: Kafka resets
            result = state.reader.read(state.position, max_bytes)
        if not result.data.size:
            state.advance(max(state.position, result.next_offset))   # past a compacted gap
            return None
        columns = decode_columns(result.data, start_offset=state.position, verified=True,
                                 aborted=state.reader.aborted)
        state.advance(result.next_offset)
        if not len(columns):
            return None
        self._counts.record(partition.topic, len(columns), int(result.data.size))
        return columns

    def _fetch_columns(self, max_bytes: int) -> dict[TopicPartition, RecordColumns]:
        """The next columns of every assigned partition not paused that has new
        records (up to ``max_bytes`` each); advances their positions. Only the
        partitions :class:`FetchChoice` names are looked at."""
        found = {}
        deleted = None
        gone: dict[TopicPartition, str] = {}
        more = set()
        try:
            for partition, state in self._choice.candidates():
                if state.paused:
                    continue
                try:
                    columns = self._fetch(partition, state, max_bytes)
                except UnknownTopicOrPartitionError as error:
                    deleted = error
                    gone[partition] = str(error)
                    more.add(partition)            # it says so again at every fetch
                    continue
                if columns is not None:
                    found[partition] = columns
                if state.position < state.reader.high_watermark_seen:
                    more.add(partition)            # capped by max_bytes, or files changing
        except BaseException:
            # Cut short (no position to reset to, a damaged batch): what it did not
            # look at is looked at next time, with everything else.
            self._choice.look_at_every_one_next()
            raise
        self._choice.more = more
        if deleted is not None and self.subscriptions.subscription is None:
            # Assigned by hand: the application must hear of it (Kafka's consumer
            # raises too). What this poll fetched from the other partitions is put
            # back, so the error loses no record.
            for partition, columns in found.items():
                self.subscriptions.assigned[partition].position = int(columns.offsets[0])
            raise deleted
        # A group's subscription: the partition leaves the assignment now (no error
        # for the application), and the group's next assignment has it no more.
        if gone and self.on_deleted is not None:
            self._choice.more = more - gone.keys()
            self.on_deleted(gone)
        return found

    # -- the buffer ------------------------------------------------------------------------
    def _buffered_ready(self) -> list[CompletedFetch]:
        """The buffered fetches of partitions not paused (those of paused ones stay
        buffered: Kafka's rule)."""
        assigned = self.subscriptions.assigned
        return [fetched for partition, fetched in self._buffered.items()
                if not assigned[partition].paused]

    def _buffer(self, found: dict[TopicPartition, RecordColumns]) -> list[CompletedFetch]:
        """Keep a fetch's columns to make records from; returns them."""
        ready = []
        for partition, columns in found.items():
            self._buffered[partition] = fetched = CompletedFetch(partition, columns)
            ready.append(fetched)
        return ready

    def _take(self, ready: list[CompletedFetch], limit: int) -> dict:
        """Records of the ``ready`` fetches, per partition, at most ``limit`` in all."""
        grouped: dict[TopicPartition, list[ConsumerRecord]] = {}
        for fetched in ready:
            if limit <= 0:
                break
            records = fetched.take(limit)
            grouped[fetched.partition] = records if self.deserialize is None else \
                self.deserialize(records)
            limit -= len(records)
            if not fetched.remaining():
                del self._buffered[fetched.partition]
        return grouped

    def _rewind(self) -> None:
        """Move each position back to the first record that poll fetched but has not
        returned, and drop those records: a fetch from there reads them again (a view
        of the mapped segment, no copy), so both polls draw from one position."""
        self.settle_iteration()
        for partition, fetched in self._buffered.items():
            self.subscriptions.assigned[partition].position = fetched.next_offset()
        self._buffered.clear()

    # -- iteration -------------------------------------------------------------------------
    def _iteration_records(self, ready: list[CompletedFetch]) -> Iterator[ConsumerRecord] | None:
        """Iteration's next records: an iterator over a chunk of the first ready
        fetch's (:meth:`_iteration_chunk` of them), held until handed out or settled;
        None when nothing is ready."""
        for fetched in ready:
            records = fetched.take(self._iteration_chunk(self.max_poll_records))
            if self.deserialize is not None:
                records = self.deserialize(records)
            if not fetched.remaining():
                del self._buffered[fetched.partition]
            iterator = iter(records)
            self._iterating = (fetched, records, iterator)
            return iterator
        return None

    @staticmethod
    def _iteration_chunk(max_poll_records: int) -> int:
        """How many records iteration makes at a time: ``max_poll_records``, or fewer
        so that making them (two tracked objects each: the tuple, its headers list)
        while the previous ones are freed keeps the garbage collector's youngest
        generation below its threshold. Iteration then starts no collection at all,
        where 500 at a time start one per chunk, each ageing the live records toward
        full collections of the whole heap (measured here: ~0.5 us a record)."""
        threshold = gc.get_threshold()[0]
        if threshold <= 0:
            return max_poll_records            # collection is off
        fitting = (threshold - ITERATION_OTHER_OBJECTS) // TRACKED_OBJECTS_PER_RECORD
        return max(1, min(max_poll_records, fitting))

    def settle_iteration(self) -> None:
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

    # -- positions and the assignment ------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Assign exactly these partitions (``SubscriptionState.assign``), iteration
        settled first, and drop what was buffered for partitions no longer assigned."""
        self.settle_iteration()
        self.subscriptions.assign(partitions)
        assigned = self.subscriptions.assigned
        self._buffered = {partition: fetched for partition, fetched in self._buffered.items()
                         if partition in assigned}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Fetch from ``offset`` next; what was buffered for the partition is dropped."""
        self.settle_iteration()
        self.subscriptions.state(partition).position = offset
        self._buffered.pop(TopicPartition(*partition), None)

    def drop_deleted(self, partitions: Iterable[TopicPartition]) -> None:
        """Of these, drop the subscribed partitions whose topic was deleted (through
        :attr:`on_deleted`); partitions assigned by hand stay (their reads raise)."""
        if self.on_deleted is not None and self.subscriptions.subscription is not None:
            gone = self.subscriptions.found_deleted(partitions)
            if gone:
                self.on_deleted(gone)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record the consumer will return for the partition.

        Raises
        ------
        NotAssignedError
            The partition is not assigned (a subscribed one whose topic was deleted
            leaves the assignment here, and the error says so).
        UnknownTopicOrPartitionError
            The partition, assigned by hand, was deleted."""
        partition = TopicPartition(*partition)
        self.drop_deleted((partition,))
        state = self.subscriptions.state(partition)
        state.reader.snapshot()                # assigned by hand and deleted: raises
        if state.position is None:
            self.subscriptions.reset(TopicPartition(*partition), state)
        self.settle_iteration()
        fetched = self._buffered.get(partition)
        return fetched.next_offset() if fetched is not None else state.position

    def positions(self, partitions: Iterable[TopicPartition]) -> dict:
        """Positions known for these partitions (no reset is forced), leaving out
        deleted ones: the coordinator refuses a commit that names one."""
        self.settle_iteration()
        positions = {}
        for partition in partitions:
            state = self.subscriptions.assigned.get(partition)
            if state is not None and state.reader.deleted():
                continue
            fetched = self._buffered.get(partition)
            if fetched is not None:
                positions[partition] = fetched.next_offset()
            elif state is not None and state.position is not None:
                positions[partition] = state.position
        return positions

    # -- metrics ---------------------------------------------------------------------------
    def lag_max(self) -> int:
        """The largest end offset (high watermark, or last stable offset for
        read_committed) minus position over the assigned partitions with a position
        (0 when none has one)."""
        lags = [0]
        for partition, state in self.subscriptions.assigned.items():
            buffered = self._buffered.get(partition)
            position = buffered.next_offset() if buffered is not None else state.position
            if position is None:
                continue
            try:
                lags.append(state.reader.end_offset() - position)
            except ShmlogError:
                continue            # its topic went: the next poll says so, not metrics()
        return max(lags)

    def metrics(self) -> dict:
        """``consumer-fetch-manager-metrics`` and the same per topic (see
        ``Consumer.metrics``)."""
        fetched = self._counts
        fetches = fetched.batches
        found = {"consumer-fetch-manager-metrics": {
            "records-consumed-total": fetched.records.total,
            "records-consumed-rate": fetched.records.rate(),
            "bytes-consumed-total": fetched.bytes.total,
            "bytes-consumed-rate": fetched.bytes.rate(),
            "fetch-total": fetches,
            "fetch-size-avg": fetched.bytes.total / fetches if fetches else 0.0,
            "records-per-request-avg": fetched.records.total / fetches if fetches else 0.0,
            "records-lag-max": self.lag_max(),
            # shmlog's: how fetches chose what to read (the journal, in the theory).
            "full-scans-total": self._choice.counts.full_scans,
            "journal-fetches-total": self._choice.counts.journal_fetches,
            "partitions-examined-total": self._choice.counts.examined,
            "partitions-examined-max": self._choice.counts.examined_max,
            "journal-laps-total": self._choice.counts.laps}}
        for topic, (records, size, _) in sorted(fetched.topics.items()):
            found[f"consumer-fetch-manager-metrics.{topic}"] = {
                "records-consumed-total": records.total,
                "records-consumed-rate": records.rate(),
                "bytes-consumed-total": size.total, "bytes-consumed-rate": size.rate()}
        return found
