"""What a consumer knows of its broker (Kafka's ConsumerMetadata): the partition state
table it maps, each topic's partitions (directory, state-table row, topic id), and
whether the broker it reads from is still alive.

Rules
-----
* The topics are asked of the broker (a ``metadata`` request) when the consumer is
  made, when it meets a topic it does not know, and when it is told to
  (:meth:`ConsumerMetadata.refresh`: a pattern subscription, ``topics()``, a
  rebalance that may bring new topics); never on a poll's hot path. A pattern never
  matches internal topics.
* A partition the broker does not have is :class:`UnknownTopicOrPartitionError`.
* The broker's liveness is a system call (``kill(pid, 0)``), made at most every
  :data:`limits.BROKER_CHECK_INTERVAL_S`, and only while the consumer is idle.

Theory of operation
-------------------
The broker publishes its partitions in a state table in shared memory; a reader
(``reader.PartitionReader``) reads a partition's row of it. :meth:`ConsumerMetadata.attach`
maps the table the broker names and learns the broker's pid. A restarted broker
makes a new table: when :meth:`ConsumerMetadata.check_broker` finds the old broker's
pid gone, it attaches again, has the consumer reopen its readers on the new table
(keeping every position), and only then closes the old table.
"""

from __future__ import annotations

import re
import time
from typing import Callable

from ..common import limits
from ..common.child_process import process_alive
from ..common.errors import ShmlogError, UnknownTopicOrPartitionError
from ..common.structs import TopicPartition
from ..protocol.control_client import request
from ..shm import state_layout as S
from ..shm.state import PartitionStateTable, topic_key
from .reader import PartitionReader

__all__ = ["ConsumerMetadata"]


class ConsumerMetadata:
    """The broker's metadata as one consumer sees it.

    Parameters
    ----------
    data_dir : str
        The broker's data directory (its control endpoint).
    """

    def __init__(self, data_dir: str, *, read_committed: bool = False):
        self.data_dir = data_dir
        self.read_committed = read_committed        # the readers' isolation level
        self.table: PartitionStateTable | None = None
        self.topics: dict[str, dict] = {}        # name: the broker's entry for the topic
        self._broker_pid = 0
        self._next_liveness_check = 0.0

    def attach(self, reopen: Callable[[], None] = lambda: None) -> None:
        """Ask the broker for its metadata and map its state table (again, after a
        broker restart: a new broker makes a new table); ``reopen()`` then moves
        whatever reads the old table to the new one, and the old one is closed."""
        metadata = request(self.data_dir, "metadata")
        table = PartitionStateTable.attach(metadata["state_table"])
        old, self.table = self.table, table
        self._broker_pid = int(table.control[S.BROKER_PID_WORD])
        self._next_liveness_check = time.monotonic() + limits.BROKER_CHECK_INTERVAL_S
        self.topics = {topic["name"]: topic for topic in metadata["topics"]}
        reopen()
        if old is not None:
            old.close()

    def check_broker(self, reopen: Callable[[], None]) -> None:
        """While idle, now and then: is the broker whose table we read still alive?
        (A system call, so never on a poll that finds records.) When it is gone,
        attach to the new one (:meth:`attach` with ``reopen``), or, when there is
        none yet, look again later."""
        now = time.monotonic()
        if now < self._next_liveness_check:
            return
        self._next_liveness_check = now + limits.BROKER_CHECK_INTERVAL_S
        # The pid is read from the table: a value no process has (only the broker's
        # user or root can write one) is a broker gone, never kill(2) of a group.
        if process_alive(self._broker_pid):
            return
        try:
            self.attach(reopen)
        except ShmlogError:
            pass                        # no broker yet: look again later

    def refresh(self) -> dict[str, dict]:
        """Ask the broker for its topics now; returns them by name."""
        self.topics = {entry["name"]: entry for entry in request(self.data_dir,
                                                                 "metadata")["topics"]}
        return self.topics

    def partition(self, topic: str, partition: int) -> dict:
        """The broker's entry for a partition (asking the broker when the topic is
        new to this consumer)."""
        if topic not in self.topics:
            self.refresh()
        entries = self.topics.get(topic, {"partitions": []})["partitions"]
        if not 0 <= partition < len(entries):
            raise UnknownTopicOrPartitionError(f"no partition {topic}-{partition} on the broker")
        return entries[partition]

    def partitions(self, topics: tuple[str, ...], pattern: str | None) -> list[TopicPartition]:
        """Every partition of ``topics`` and of the topics whose whole name matches
        ``pattern`` now (internal topics never match)."""
        if pattern is not None:
            topics += tuple(sorted(name for name in self.refresh() if not name.startswith("__")
                                   and re.fullmatch(pattern, name)))
        partitions = []
        for topic in topics:
            self.partition(topic, 0)
            partitions += [TopicPartition(topic, entry["partition"])
                           for entry in self.topics[topic]["partitions"]]
        return partitions

    def offsets_for_times(self, timestamps: dict) -> dict:
        """For each partition, ``(offset, timestamp)`` of the first record whose
        timestamp is >= the one given (Kafka's ListOffsets by time), or None."""
        found = {}
        for partition, timestamp in timestamps.items():
            reply = request(self.data_dir, "offset_for_timestamp", topic=partition[0],
                            partition=partition[1], timestamp=int(timestamp))
            found[TopicPartition(*partition)] = (
                (reply["offset"], reply["timestamp"]) if reply["offset"] is not None else None)
        return found

    def open_reader(self, partition: TopicPartition) -> PartitionReader:
        """A reader of the partition on the mapped table (it maps nothing before its
        first read)."""
        entry = self.partition(*partition)
        return PartitionReader(entry["directory"], self.table, entry["row"],
                               topic_key=topic_key(self.topics[partition.topic]["topic_id"]),
                               partition=partition.partition,
                               read_committed=self.read_committed)

    def close(self) -> None:
        if self.table is not None:
            self.table.close()
