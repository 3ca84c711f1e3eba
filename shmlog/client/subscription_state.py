"""What a consumer consumes (Kafka's SubscriptionState): its group subscription, the
partitions assigned to it, and per partition its reader, its position and whether it
is paused.

Rules
-----
* A consumer either subscribes through its group (:attr:`SubscriptionState.subscription`
  is set: the group assigns the partitions) or has its partitions assigned by hand
  (``subscription`` is None); a hand-assigned partition that is deleted is an error
  for the application (poll and position raise), a subscribed one leaves the
  assignment as soon as the consumer sees its topic deleted (a fetch, ``position``,
  ``assignment``), and the group joins again: the assignment and the positions then
  agree, as in Kafka after the rebalance its metadata update starts. Asked for
  afterwards, the partition is :class:`NotAssignedError`, saying it was deleted
  (:attr:`SubscriptionState.deleted`, until the partition is assigned again).
* A position is the offset of the next record to fetch; None until it is known (a
  committed offset, a seek, or a reset). Without one, a partition starts at
  ``auto_offset_reset``: its log start (``earliest``), its high watermark
  (``latest``), or not at all (``none``: :class:`OffsetOutOfRangeError`).
* Pausing is the application's flow control: a paused partition keeps its position
  and is not fetched.
* Every assigned partition has a reader open on the broker's current state table;
  one that is unassigned is closed at once.
* Whatever moves a position or a pause from outside the fetcher's reads (a seek, a
  committed offset, a rebalance, a pause or resume) says so: the partition goes into
  :attr:`SubscriptionState.touched`, which the fetcher looks at on its next fetch
  along with the rows the broker's journal names. A new assignment or reopened
  readers move :attr:`SubscriptionState.version` on, and the fetcher then looks at
  every partition. The fetcher's own moves (``AssignedPartition.advance``, a reset)
  touch nothing: it reads those partitions as it moves them.

Theory of operation
-------------------
The fetcher (``fetcher.py``) reads from the positions here and moves them on; the
consumer's group work (``consumer_coordinator.py``) changes the assignment and
starts new partitions at their committed offsets. Records fetched and not yet
handed out are the fetcher's, so a partition's *consumer* position is the fetcher's
to say (``Fetcher.position``); the position here is where the next fetch starts.
"""

from __future__ import annotations

from typing import Iterable

from ..common.errors import NotAssignedError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from ..common.structs import TopicPartition
from ..shm.state import RowSnapshot
from .consumer_metadata import ConsumerMetadata
from .reader import PartitionReader

__all__ = ["SubscriptionState", "AssignedPartition"]


class AssignedPartition:
    """One assigned partition: its reader, the offset its next fetch starts at (None
    until known) and whether the application paused it. Setting either puts the
    partition into ``touched`` (the fetcher's cue to look at it)."""

    __slots__ = ("partition", "reader", "_position", "_paused", "_touched")

    def __init__(self, partition: TopicPartition, reader: PartitionReader,
                 touched: set[TopicPartition]):
        self.partition = partition
        self.reader = reader
        self._position: int | None = None
        self._paused = False
        self._touched = touched
        touched.add(partition)                 # no position yet: a fetch must start it

    @property
    def position(self) -> int | None:
        return self._position

    @position.setter
    def position(self, offset: int | None) -> None:
        self._position = offset
        self._touched.add(self.partition)

    def advance(self, offset: int) -> None:
        """The fetcher's move of the position past what it read (touches nothing)."""
        self._position = offset

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, paused: bool) -> None:
        self._paused = paused
        self._touched.add(self.partition)


class SubscriptionState:
    """The subscription and the assigned partitions of one consumer.

    Parameters
    ----------
    metadata : ConsumerMetadata
        Opens the readers of the partitions assigned.
    auto_offset_reset : "latest", "earliest" or "none"
        Where a partition without a position starts.
    """

    def __init__(self, metadata: ConsumerMetadata, auto_offset_reset: str):
        self.metadata = metadata
        self.auto_offset_reset = auto_offset_reset
        self.assigned: dict[TopicPartition, AssignedPartition] = {}
        # Partitions whose position or pause changed outside the fetcher's reads, and
        # a count of changes of the assignment or of its readers (see the rules).
        self.touched: set[TopicPartition] = set()
        self.version = 0
        # The group subscription: (topics, pattern), or None (partitions by hand).
        self.subscription: tuple[tuple[str, ...], str | None] | None = None
        # Subscribed partitions dropped because their topic was deleted: why (the
        # reader's error), for NotAssignedError's message; one entry per partition,
        # gone when the partition is assigned again.
        self.deleted: dict[TopicPartition, str] = {}

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Assign exactly these partitions: readers of those that go are closed, of
        those that come opened (their positions unknown); the others keep theirs."""
        wanted = [TopicPartition(*partition) for partition in partitions]
        kept = set(wanted)
        for partition in list(self.assigned):
            if partition not in kept:
                self.assigned.pop(partition).reader.close()
                self.touched.discard(partition)
        for partition in wanted:
            self.deleted.pop(partition, None)
            if partition not in self.assigned:
                self.assigned[partition] = AssignedPartition(
                    partition, self.metadata.open_reader(partition), self.touched)
        self.version += 1

    def reopen_readers(self) -> None:
        """Open every assigned partition's reader again on the table the metadata
        maps now (after a broker restart), keeping the positions."""
        for partition, state in self.assigned.items():
            reader = self.metadata.open_reader(partition)
            state.reader.close()
            state.reader = reader
        self.version += 1

    def state(self, partition: TopicPartition) -> AssignedPartition:
        try:
            return self.assigned[TopicPartition(*partition)]
        except KeyError:
            why = self.deleted.get(TopicPartition(*partition))
            raise NotAssignedError(
                f"{partition} is not assigned to this consumer" +
                (f": it left the assignment when its topic was deleted ({why})"
                 if why is not None else "; assign or subscribe to it first")) from None

    def found_deleted(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        """Of these assigned partitions, those whose topic was deleted, with why
        (a read of each one's row in shared memory, no system call)."""
        found = {}
        for partition in partitions:
            state = self.assigned.get(partition)
            if state is None:
                continue
            try:
                state.reader.snapshot()
            except UnknownTopicOrPartitionError as error:
                found[partition] = str(error)
        return found

    def paused(self) -> set[TopicPartition]:
        return {partition for partition, state in self.assigned.items() if state.paused}

    def snapshot(self, partition: TopicPartition) -> RowSnapshot:
        """The partition's row, checked to still be the partition's (a reader maps
        nothing before its first read, so an unassigned one costs no system call)."""
        return self._with_reader(partition, lambda reader: reader.snapshot())

    def end_offset(self, partition: TopicPartition) -> int:
        """Where the partition's reads end now, by the isolation level
        (``PartitionReader.end_offset``)."""
        return self._with_reader(partition, lambda reader: reader.end_offset())

    def _with_reader(self, partition: TopicPartition, ask):
        partition = TopicPartition(*partition)
        state = self.assigned.get(partition)
        if state is not None:
            return ask(state.reader)
        reader = self.metadata.open_reader(partition)
        try:
            return ask(reader)
        finally:
            reader.close()

    def reset(self, partition: TopicPartition, state: AssignedPartition) -> None:
        """Start a partition at ``auto_offset_reset`` (no position, or it fell out of
        the log)."""
        if self.auto_offset_reset == "none":
            raise OffsetOutOfRangeError(
                f"{partition.topic}-{partition.partition} has no valid position and "
                f"auto_offset_reset is 'none'; seek first", offset=-1,
                log_start_offset=-1, log_end_offset=-1)
        row = state.reader.snapshot()
        # Not a touch: the fetcher reads the partition now, or did not know where to.
        state.advance(row.log_start_offset if self.auto_offset_reset == "earliest"
                      else state.reader.end_offset(row))

    def close(self) -> None:
        for state in self.assigned.values():
            state.reader.close()
        self.assigned.clear()
        self.touched.clear()
        self.deleted.clear()
        self.version += 1
