"""``Consumer``: reads partitions on this host straight from the segment files.

The consumer composes Kafka's consumer parts, each a module of its own:

* ``consumer_metadata.ConsumerMetadata``: the broker's metadata (each partition's
  directory and state-table row), the state table mapped, the broker's liveness.
* ``subscription_state.SubscriptionState``: the group subscription, the assigned
  partitions, and per partition its reader, position and pause.
* ``fetcher.Fetcher``: reads the assigned partitions (no syscall and no copy of the
  record data on the hot path), keeps what it fetched and has not handed out, and
  makes the records of a poll or an iteration step.
* ``consumer_coordinator.ConsumerCoordinator`` (with a ``group_id``): the group's
  work in a poll, the rebalance listener, commits; over a
  ``group_member.GroupMember``, which joins, syncs and heartbeats.

Rules
-----
* Positions, and so commits, count only the records handed out: every call on the
  consumer (poll, poll_batch, commit, position, seek, pause, assign, close) first
  puts what iteration made but has not handed out back in front of the buffer
  (``Fetcher.settle_iteration``), and the iteration goes on from there.
* ``poll`` and ``poll_batch`` go on from one position per partition and may be
  mixed: every record comes once, in order.
* A poll, an iteration, a ``poll_batch`` or a commit never compiles: a consumer
  loads every kernel of its read path when it is made (``reader.warm_kernels``:
  decoding, zstd batches, segments mapped or still empty, the state table, the
  doorbell), before it joins a group (the group's own work, joins, heartbeats and
  commits, runs no kernel in this process).

Theory of operation
-------------------
The consumer checks its settings, maps the broker's state table, loads its kernels,
and, with a ``group_id``, becomes a member of its group (``groups.py``) when it
subscribes; without one, ``subscribe`` assigns every partition of the topics. Each
public call then goes to the part that does it: a poll to the fetcher, which first
has the coordinator do the group's work (a rebalance may take buffered partitions
away), returns from what is buffered for partitions not paused, or fetches until it
finds something or its timeout passes, idling on the broker's doorbell in between;
a commit to the coordinator; a seek or a pause to the subscription state through
the fetcher, which settles iteration first.

Iteration (``for record in consumer``) is a generator over the chunks a full poll
makes (``Fetcher.next_records``), handed out through a list iterator, with no Python
call, clock read or group step per record: group work is done at least once per
``max_poll_records`` records (Kafka's poll loop, with the same
``max_poll_interval_ms`` contract), and at once whenever nothing is buffered.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import os
import re
from typing import Iterable, Iterator, Mapping, NamedTuple

from ..common import limits, settings
from ..common.errors import ClientClosedError, InvalidConfigError, LocalProtocolError
from ..common.internal_topics import INTERNAL_TOPICS
from ..common.paths import default_data_dir
from ..common.structs import OffsetAndMetadata, TopicPartition
from ..protocol.control_client import request
from . import options as client_options
from .consumer_coordinator import ConsumerCoordinator, ConsumerRebalanceListener
from .consumer_metadata import ConsumerMetadata
from .fetcher import ConsumerRecord, Fetcher, deserialized
from .group_member import GroupMember, MemberConfig
from .reader import warm_kernels
from .subscription_state import SubscriptionState

__all__ = ["Consumer", "ConsumerRecord", "TopicPartition", "OffsetAndTimestamp",
           "OffsetAndMetadata", "ConsumerRebalanceListener", "GroupMetadata"]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class GroupMetadata(NamedTuple):
    group_id: str
    generation_id: int
    member_id: str


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
        Kafka's group settings (see :class:`group_member.MemberConfig`).
    bootstrap_servers : str or [str], optional
        kafka-python's name for ``bootstrap``.
    key_deserializer, value_deserializer : callable, optional
        Applied to each record's key and value before poll or iteration returns it
        (kafka-python's rule: ``client_options.deserializer``); without them records
        are made as before, at no extra cost.
    default_offset_commit_callback : callable, optional
        ``commit_async``'s callback when it is given none (kafka-python's).
    isolation_level : "read_uncommitted" or "read_committed"
        Kafka's: read_committed reads only below each partition's last stable offset
        (before its oldest open transaction) and never returns a record of an
        aborted transaction; read_uncommitted (the default) reads everything below
        the high watermark.
    **kafka_options
        kafka-python's other options: taken and ignored, or refused
        (``client_options``).

    Raises
    ------
    InvalidConfigError
        A setting has the wrong type or is out of range (checked before the broker
        is asked anything), or is no option at all.
    UnsupportedKafkaOptionError
        A Kafka option shmlog does not support (``group_instance_id``, ...).
    """

    def __init__(self, *topics: str, bootstrap: str | None = None, group_id: str | None = None,
                 auto_offset_reset: str = "latest",
                 max_poll_records: int = limits.MAX_POLL_RECORDS_DEFAULT,
                 fetch_max_bytes: int = limits.FETCH_BYTES_DEFAULT,
                 consumer_timeout_ms: int | None = None,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3_000,
                 max_poll_interval_ms: int = 300_000,
                 partition_assignment_strategy: Iterable[str] = ("range", "cooperative-sticky"),
                 client_id: str | None = None, bootstrap_servers=None, key_deserializer=None,
                 value_deserializer=None, default_offset_commit_callback=None,
                 isolation_level: str = "read_uncommitted", **kafka_options):
        # Every setting is checked before the broker is asked anything (settings.py);
        # the group's are checked by MemberConfig.
        self.data_dir = settings.bootstrap(bootstrap, bootstrap_servers) or default_data_dir()
        client_options.check_kafka_options(client_options.CONSUMER, kafka_options,
                                           _CONSUMER_SETTINGS)
        key_deserializer = client_options.deserializer(key_deserializer, "key_deserializer")
        value_deserializer = client_options.deserializer(value_deserializer,
                                                         "value_deserializer")
        if default_offset_commit_callback is not None and \
                not callable(default_offset_commit_callback):
            raise InvalidConfigError(f"default_offset_commit_callback must be callable, got "
                                     f"{default_offset_commit_callback!r:.100}")
        self.auto_offset_reset = settings.choice("auto_offset_reset", auto_offset_reset,
                                                 ("latest", "earliest", "none"))
        self.isolation_level = settings.choice("isolation_level", isolation_level,
                                               ("read_uncommitted", "read_committed"))
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
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        member_config = MemberConfig(session_timeout_ms, heartbeat_interval_ms,
                                     max_poll_interval_ms, tuple(partition_assignment_strategy))
        self._metadata = ConsumerMetadata(
            self.data_dir, read_committed=self.isolation_level == "read_committed")
        self._subscriptions = SubscriptionState(self._metadata, self.auto_offset_reset)
        # A deserializer given: poll and iteration pass records through it (one
        # attribute test per poll otherwise, nothing per record).
        self._fetcher = Fetcher(
            self._subscriptions, fetch_max_bytes=self.fetch_max_bytes,
            max_poll_records=self.max_poll_records,
            deserialize=None if key_deserializer is None and value_deserializer is None
            else functools.partial(deserialized, key_deserializer, value_deserializer))
        self._metadata.attach()
        # Before joining a group: a first poll that compiled kernels (the GIL held
        # for seconds on a cold cache) would starve the heartbeat thread.
        warm_kernels()
        self._group: GroupMember | None = None
        self._coordinator: ConsumerCoordinator | None = None
        if group_id is not None:
            self._group = GroupMember(functools.partial(request, self.data_dir), group_id,
                                      client_id or f"shmlog-{os.getpid()}", member_config)
            self._coordinator = ConsumerCoordinator(
                self._group, self._subscriptions, self._fetcher, self._metadata,
                enable_auto_commit=enable_auto_commit,
                auto_commit_interval_ms=auto_commit_interval_ms,
                default_commit_callback=default_offset_commit_callback)
        # The generator ``for record in consumer`` runs.
        self._iteration: Iterator[ConsumerRecord] | None = None
        if topics:
            self.subscribe(topics)

    # -- assignment --------------------------------------------------------------------
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
        if self._coordinator is not None:
            self._coordinator.subscribe(topics, pattern, listener)
            return
        self._fetcher.assign(self._metadata.partitions(topics, pattern))

    def unsubscribe(self) -> None:
        """Stop consuming (and leave the group, committing first when auto commit is on)."""
        if self._coordinator is not None and self._subscriptions.subscription is not None:
            self._coordinator.unsubscribe()
        self._subscriptions.subscription = None
        self._fetcher.assign([])

    def group_metadata(self) -> GroupMetadata | None:
        """The group, generation and member id this consumer has now (Kafka's
        ``groupMetadata()``), or None without a group."""
        if self._group is None:
            return None
        return GroupMetadata(self._group.group_id, self._group.generation,
                             self._group.member_id)

    def subscription(self) -> set[str]:
        subscription = self._subscriptions.subscription
        return set(subscription[0]) if subscription else set()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces the assignment; no group
        membership, though offsets may still be committed to ``group_id``)."""
        if self._subscriptions.subscription is not None:
            raise LocalProtocolError("this consumer subscribed through its group; "
                                     "unsubscribe before assigning partitions by hand")
        self._fetcher.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned now. Subscribed partitions whose topic was deleted
        are dropped first (a read of each row in shared memory, no request), so the
        assignment and :meth:`position` agree."""
        self._fetcher.drop_deleted(list(self._subscriptions.assigned))
        return set(self._subscriptions.assigned)

    def paused(self) -> set[TopicPartition]:
        """The partitions :meth:`pause` paused (kafka-python's ``paused()``)."""
        return self._subscriptions.paused()

    def topics(self) -> set[str]:
        """Every topic on the broker but the internal ones (asks the broker)."""
        return {name for name in self._metadata.refresh() if name not in INTERNAL_TOPICS}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partition numbers, or None when there is no such topic
        (kafka-python's rule)."""
        if topic not in self._metadata.topics:
            self.topics()
        entry = self._metadata.topics.get(topic)
        return None if entry is None else {part["partition"] for part in entry["partitions"]}

    def highwater(self, partition: TopicPartition) -> int:
        """The partition's high watermark now (the offset the next committed record
        gets), read from the broker's state table: no request, always current."""
        return self._subscriptions.snapshot(partition).high_watermark

    def pause(self, *partitions: TopicPartition) -> None:
        self._fetcher.settle_iteration()             # iteration returns no more of them
        for partition in partitions:
            self._subscriptions.state(partition).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for partition in partitions:
            self._subscriptions.state(partition).paused = False

    # -- positions ---------------------------------------------------------------------
    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        return {TopicPartition(*p): self._subscriptions.snapshot(p).log_start_offset
                for p in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict:
        """The high watermarks: the offset the next appended record will get; for
        read_committed the last stable offsets (before the oldest open transaction)."""
        return {TopicPartition(*p): self._subscriptions.end_offset(p) for p in partitions}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise LocalProtocolError(f"offset must be a non-negative integer, got {offset!r}")
        self._fetcher.seek(partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for partition, offset in self.beginning_offsets(
                partitions or self._subscriptions.assigned).items():
            self.seek(partition, offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for partition, offset in self.end_offsets(
                partitions or self._subscriptions.assigned).items():
            self.seek(partition, offset)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record this consumer will return for the partition.

        Raises
        ------
        NotAssignedError
            The partition is not assigned to this consumer (Kafka's
            IllegalStateException); a subscribed partition whose topic was deleted
            is no longer assigned, and the message says it was deleted.
        UnknownTopicOrPartitionError
            The partition was assigned by hand and its topic was deleted."""
        return self._fetcher.position(partition)

    def offsets_for_times(self, timestamps: dict) -> dict:
        """For each partition, the first offset whose timestamp is >= the one given
        (as :class:`OffsetAndTimestamp`), or None when there is none."""
        return {partition: None if found is None else OffsetAndTimestamp(*found)
                for partition, found in self._metadata.offsets_for_times(timestamps).items()}

    # -- fetching ----------------------------------------------------------------------
    def poll_batch(self, timeout_ms: int = 0, max_bytes: int | None = None) -> dict:
        """New records as columns, per partition: numpy arrays of offsets,
        timestamps and key/value positions into the mapped bytes (zero copy for
        uncompressed batches). Waits up to ``timeout_ms`` for something new.

        It goes on from the same position as :meth:`poll`: records that ``poll``
        fetched and has not returned yet come first."""
        self._check_open()
        return self._fetcher.poll_batch(timeout_ms, max_bytes, self._coordinator)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        """New records per partition, as :class:`ConsumerRecord` lists (at most
        ``max_records`` in all). Waits up to ``timeout_ms`` for something new."""
        self._check_open()
        return self._fetcher.poll(timeout_ms, max_records, self._coordinator)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """The records, one at a time; stops after ``consumer_timeout_ms`` without one.

        A full poll (the group's work, a fetch when nothing is buffered) makes up to
        ``max_poll_records`` records at a time (``Fetcher.next_records``), which
        are then handed out by a generator delegating to a list iterator, with no
        Python call, clock read or group step per record: Kafka's poll loop, with
        the same ``max_poll_interval_ms`` contract. What the application has not
        been handed yet stays uncommitted, and any other call on the consumer (poll,
        commit, seek, pause, ...) first puts it back among the buffered records
        (``Fetcher.settle_iteration``)."""
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
        """Iteration's next records, after a full poll; None after
        ``consumer_timeout_ms`` without a record."""
        self._check_open()
        return self._fetcher.next_records(self.consumer_timeout_ms, self._coordinator)

    # -- the group ---------------------------------------------------------------------
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
        if self._coordinator is None:
            raise LocalProtocolError("commit needs a consumer with a group_id")
        self._coordinator.commit(offsets)

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
        if self._coordinator is None:
            raise LocalProtocolError("commit_async needs a consumer with a group_id")
        return self._coordinator.commit_async(offsets, callback)

    def committed(self, partition: TopicPartition, metadata: bool = False):
        """The group's committed offset for a partition (None when there is none);
        with ``metadata``, an :class:`OffsetAndMetadata`."""
        if self._coordinator is None:
            raise LocalProtocolError("committed needs a consumer with a group_id")
        found = self._coordinator.committed([TopicPartition(*partition)]).get(tuple(partition))
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
        self._fetcher.settle_iteration()
        self._iteration = None
        if self._coordinator is not None:
            self._coordinator.close(autocommit)
        self._subscriptions.close()
        self._metadata.close()

    def metrics(self) -> dict:
        """This consumer's metrics as kafka-python's ``metrics()`` gives them:
        ``{group: {name: value}}``. ``consumer-fetch-manager-metrics``: records and
        bytes read from the log (``records-consumed-total``, ``bytes-consumed-total``;
        records ``poll_batch`` reads again after ``poll`` buffered them count again)
        and their rates per second over the last ``limits.METRICS_RATE_WINDOW_S`` s,
        fetches that found records (``fetch-total``) with their average size and
        record count, and ``records-lag-max``: the largest lag (high watermark minus
        position) over the assigned partitions now; shmlog's own of how fetches
        chose the partitions they read: ``full-scans-total`` (every one assigned),
        ``journal-fetches-total`` (those the state table's journal named, see
        ``fetcher``), ``partitions-examined-total`` and ``partitions-examined-max``
        over the latter, and ``journal-laps-total``; the same counts per topic in
        ``consumer-fetch-manager-metrics.<topic>``; with a group,
        ``consumer-coordinator-metrics``: commits (``commit-total``,
        ``commit-rate``) and ``assigned-partitions``. Counted once per fetch, never
        per record."""
        found = self._fetcher.metrics()
        if self._coordinator is not None:
            found["consumer-coordinator-metrics"] = self._coordinator.metrics()
        return found

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# Named in the error for a keyword that is neither a setting nor a Kafka option.
_CONSUMER_SETTINGS = tuple(name for name in inspect.signature(Consumer.__init__).parameters
                           if name not in ("self", "topics", "kafka_options"))
