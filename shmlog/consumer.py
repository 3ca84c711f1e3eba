"""``Consumer``: reads partitions on this host straight from the segment files.

Theory of operation
-------------------
The consumer asks the broker once for metadata (each partition's directory and its
row in the partition state table), attaches the table, and opens one
:class:`PartitionReader` per assigned partition. A poll then loads each high
watermark from shared memory (an acquire load), takes the batches below it as
views of the read-only mappings, and decodes them in compiled code: no syscall
and no copy of the record data on the hot path. :meth:`Consumer.poll_batch`
hands the columns over as they are; :meth:`Consumer.poll` builds record objects.

When nothing is new, a poll waits with the idle strategy of ``wakeup.pause``: it
keeps looking, then yields the CPU, and once nothing has come for a millisecond
it sleeps on the state table's consumer doorbell (a futex the broker rings after
every drain that appended records) until the broker rings it or the poll's
timeout passes. An idle consumer costs no CPU; a busy one never sleeps. Between
sleeps it checks now and then that the broker is alive; a restarted broker
publishes a new state table, which the consumer maps, keeping its positions.
Consumer groups come later; without one, ``subscribe`` assigns every partition.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, NamedTuple

from .broker import default_data_dir, request
from .errors import (LocalProtocolError, OffsetOutOfRangeError, ShmlogError,
                     UnknownTopicOrPartitionError)
from .reader import PartitionReader
from .records import Record, RecordColumns, decode_columns
from . import state_layout as S
from . import wakeup
from .state import PartitionStateTable

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "OffsetAndTimestamp"]

# How often an idle consumer checks that the broker it reads from is alive (and,
# when it is not, looks for a new one).
BROKER_CHECK_INTERVAL_S = 0.5
# Kafka's max.poll.records and max.partition.fetch.bytes defaults.
MAX_POLL_RECORDS_DEFAULT = 500
FETCH_BYTES_DEFAULT = 1 << 20


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


# A Record with the partition it came from in front: topic, partition, offset,
# timestamp, timestamp_type, key, value, headers.
ConsumerRecord = NamedTuple("ConsumerRecord", [("topic", str), ("partition", int),
                                               *Record.__annotations__.items()])


class _Assigned:
    def __init__(self, reader: PartitionReader):
        self.reader = reader
        self.position: int | None = None
        self.paused = False


class Consumer:
    """Reads topics of the local broker (kafka-python's shape).

    Parameters
    ----------
    *topics : str
        Subscribe to these (every partition: there are no groups yet).
    bootstrap : str, optional
        The broker's data directory (default: ``$SHMLOG_DATA_DIR`` or the default).
    auto_offset_reset : "latest", "earliest" or "none"
        Where to start without a position, or after the position fell out of the log.
    max_poll_records, fetch_max_bytes : int
        Per poll, and per partition per poll.
    consumer_timeout_ms : int, optional
        Iteration stops after this long without a record (default: never).
    """

    def __init__(self, *topics: str, bootstrap: str | None = None, group_id: str | None = None,
                 auto_offset_reset: str = "latest",
                 max_poll_records: int = MAX_POLL_RECORDS_DEFAULT,
                 fetch_max_bytes: int = FETCH_BYTES_DEFAULT,
                 consumer_timeout_ms: int | None = None):
        if group_id is not None:
            raise LocalProtocolError("consumer groups are not available yet: leave group_id "
                                     "unset and assign or subscribe")
        if auto_offset_reset not in ("latest", "earliest", "none"):
            raise LocalProtocolError(f"auto_offset_reset must be 'latest', 'earliest' or "
                                     f"'none', got {auto_offset_reset!r}")
        self.data_dir = bootstrap or default_data_dir()
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.fetch_max_bytes = fetch_max_bytes
        self.consumer_timeout_ms = consumer_timeout_ms
        self._assigned: dict[TopicPartition, _Assigned] = {}
        self._last_found = 0.0             # when a poll last found records (monotonic)
        self._attach()
        # Records fetched and not yet returned, per partition (in offset order).
        self._buffered: dict[TopicPartition, list[ConsumerRecord]] = {}
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
            entry = self._partition_metadata(*partition)
            state.reader.close()
            state.reader = PartitionReader(entry["directory"], table, entry["row"])
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

    def subscribe(self, topics: Iterable[str]) -> None:
        """Consume every partition of these topics (replaces the assignment)."""
        partitions = []
        for topic in topics:
            self._partition_metadata(topic, 0)
            partitions += [TopicPartition(topic, entry["partition"])
                           for entry in self._topics[topic]["partitions"]]
        self.assign(partitions)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces the assignment)."""
        wanted = [TopicPartition(*partition) for partition in partitions]
        for partition in list(self._assigned):
            if partition not in wanted:
                self._assigned.pop(partition).reader.close()
        for partition in wanted:
            if partition not in self._assigned:
                entry = self._partition_metadata(*partition)
                self._assigned[partition] = _Assigned(
                    PartitionReader(entry["directory"], self._table, entry["row"]))
        self._buffered = {partition: records for partition, records in self._buffered.items()
                          if partition in self._assigned}

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def pause(self, *partitions: TopicPartition) -> None:
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
        return {TopicPartition(*p): self._table.snapshot(self._row(p)).log_start_offset
                for p in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        """The high watermarks: the offset the next appended record will get."""
        return {TopicPartition(*p): self._table.high_watermark(self._row(p)) for p in partitions}

    def _row(self, partition: TopicPartition) -> int:
        return self._partition_metadata(*partition)["row"]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise LocalProtocolError(f"offset must be a non-negative integer, got {offset!r}")
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
        pending = self._buffered.get(TopicPartition(*partition))
        return pending[0].offset if pending else state.position

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
        row = self._table.snapshot(state.reader.row)
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
            return None
        columns = decode_columns(result.data, start_offset=state.position, verified=True)
        state.position = result.next_offset
        return columns if len(columns) else None

    def poll_batch(self, timeout_ms: int = 0, max_bytes: int | None = None) -> dict:
        """New records as columns, per partition: numpy arrays of offsets,
        timestamps and key/value positions into the mapped bytes (zero copy for
        uncompressed batches). Waits up to ``timeout_ms`` for something new."""
        return self._wait(lambda: self._poll_columns(max_bytes or self.fetch_max_bytes),
                          timeout_ms)

    def _poll_columns(self, max_bytes: int) -> dict[TopicPartition, RecordColumns]:
        found = {}
        for partition, state in self._assigned.items():
            if not state.paused:
                columns = self._fetch(partition, state, max_bytes)
                if columns is not None:
                    found[partition] = columns
        return found

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """New records per partition, as :class:`ConsumerRecord` lists (at most
        ``max_records`` in all). Waits up to ``timeout_ms`` for something new."""
        limit = max_records or self.max_poll_records
        if not self._buffered:
            for partition, columns in self._wait(
                    lambda: self._poll_columns(self.fetch_max_bytes), timeout_ms).items():
                self._buffered[partition] = columns.records(ConsumerRecord, partition.topic,
                                                            partition.partition)
        grouped: dict[TopicPartition, list[ConsumerRecord]] = {}
        for partition in list(self._buffered):
            if limit <= 0:
                break
            records = self._buffered[partition]
            grouped[partition], rest = records[:limit], records[limit:]
            limit -= len(grouped[partition])
            if rest:
                self._buffered[partition] = rest
            else:
                del self._buffered[partition]
        return grouped

    def _wait(self, attempt, timeout_ms: int):
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            found = attempt()
            now = time.monotonic()
            if found:
                self._last_found = now
            if found or now >= deadline:
                return found
            if now - self._last_found >= wakeup.YIELD_S:
                self._check_broker()
            found = wakeup.pause(now - self._last_found, self._table.consumer_doorbell,
                                 attempt, min(deadline - now, BROKER_CHECK_INTERVAL_S))
            if found:
                return found

    def __iter__(self):
        return self

    def __next__(self) -> ConsumerRecord:
        timeout = self.consumer_timeout_ms
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            wait_ms = 100 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            for records in self.poll(timeout_ms=wait_ms, max_records=1).values():
                return records[0]
            if deadline is not None and time.monotonic() >= deadline:
                raise StopIteration

    def close(self) -> None:
        for state in self._assigned.values():
            state.reader.close()
        self._assigned.clear()
        self._table.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
