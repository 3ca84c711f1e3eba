"""The broker process: owns a data directory, drains every producer's ring into the
partition logs, serves the control endpoint and the consumer-group coordinator,
and runs retention, compaction and flushing.

Rules
-----
* One broker per data directory (the directory lock says so); a second one is
  refused with :class:`DataDirectoryInUseError`.
* Internal topics (``groups.INTERNAL_TOPICS``: ``__consumer_offsets``) are the
  broker's: it creates them on first use; a client cannot create, delete or grow
  them (Kafka's rule).
* SIGTERM and SIGINT stop it gracefully: it stops taking requests, drains every
  ring, flushes and closes the logs, and removes its shared memory and its control
  socket; nothing a producer was told is appended is lost.
* A malformed or unknown control request gets an error reply (a multipart one
  too); a frame larger than ``limits.CONTROL_FRAME_SIZE_MAX`` disconnects its
  sender before it is received. Nothing a client sends ends the broker.
* Its data, control socket and shared memory are private to its user, or shared
  with one ``data_group`` (see ``access``).
* Nothing outlives its use: the ring of a producer that leaves (or dies) is
  unmapped and removed, and its slot in the appender's ring table reused; rings
  under the broker's prefix that nobody registered are registered at start (their
  entries are drained) and reaped once their maker is gone; while running, an
  unregistered ring whose maker is gone is reclaimed by the liveness check.
* A client fails at once when there is no control socket (no broker runs) or it
  may not connect to it; a socket left by a killed broker is waited on, since a
  new broker may be starting (``control_client``, the clients' side; the paths are
  in ``paths`` and the settings in ``broker_config``, light modules that clients
  and the ``shmlog`` command import without numba).
* A broker that answers has loaded every kernel its requests run
  (:func:`warm_kernels`).

Theory of operation
-------------------
:class:`BrokerCore` holds the state (the :class:`LogManager`, the partition state
table, the :class:`Appender`, the registered producers) and answers requests; it
does no I/O of its own beyond the logs, so tests drive it in-process.
:func:`serve` is the thin loop around it: drain the rings, answer control
requests, and every so often check retention, flush policy, group deadlines and
whether producers are still alive. A thread of its own (``control_server.py``)
waits on the ZeroMQ ROUTER socket (``ipc://<data dir>/run/control.sock``) and hands
each request to the loop, which answers it between drains, so all state changes on
one thread. Most replies
go back at once; a group join is answered when its rebalance completes
(:class:`groups.GroupCoordinator` says when). The cleaner thread compacts one
partition at a time beside the loop, which swaps the result in.

Producers ring the state table's appender doorbell after every entry they put, so
the loop drains only when something was put (or a request or timer asks). When
nothing was put for a while (``wakeup.pause``) it sleeps on that doorbell (a
futex) until a producer or a control request rings it, or the next timer is due:
an idle broker costs no CPU and wakes in microseconds. After every drain that
appended records it rings the consumers' doorbell. :class:`Broker` runs a broker in a
child process for scripts, notebooks and tests.

No request waits for a compile: numba loads a kernel (from its disk cache, or
compiles it) at its first call with the GIL held, which stalled a new broker's first
create_topic, produce, commit and delete_topic for tenths of a second (seconds on a
cold cache). Before it binds its control socket, :func:`serve` has a scratch broker
(:func:`warm_kernels`: a directory of its own under the data directory, a state
table and rings in anonymous memory) serve one request of every kind that runs
kernels, so a broker that answers is warm.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any


from . import access, limits
from . import ring_layout as R
from . import shared_memory
from . import state_layout as S
from . import wakeup
from .appender import DRAIN_ENTRIES_MAX, Appender
from .cleaner import CleanerThread, keys_max as cleaner_keys_max
from .cleaner import plan as cleaner_plan, warm_kernels as warm_cleaner_kernels
from .control import (decode_reply, encode_request, encode_result, error_reply, handle_frame,
                      require)
from .groups import (INTERNAL_TOPICS, OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIG, CoordinatorConfig,
                     GroupCoordinator, offsets_partition)
from .broker_config import BrokerConfig
from .control_server import ControlEndpoint, remove_control_socket
from .control_client import request
from .errors import (BrokerAccessDeniedError, BrokerNotAvailableError, InvalidTopicError,
                     LocalProtocolError, ShmlogError, StorageError)
from .log_manager import LogManager
# The client's request, the paths and the config live in light modules (clients and
# the shmlog command import them without numba); they are imported back under their
# old names, which stay valid.
from .paths import (RUN_DIRECTORY, control_address, default_data_dir,
                    shared_memory_prefix)
from .paths import SOCKET_PATH_LENGTH_MAX  # noqa: F401 - the old name
from .scheduler import Scheduler
from .segments import _write_atomically
from .records import decode_records, encode_batch, now_ms
from .ring import MAKER_PENDING, MAKER_UNKNOWN, Destination, Ring, maker_pid
from .state import PartitionStateTable

log = logging.getLogger(__name__)

__all__ = ["BrokerConfig", "BrokerCore", "Broker", "serve", "warm_kernels", "default_data_dir",
           "control_address"]

WARM_UP_DIRECTORY = "warm-up"           # the warm-up's scratch data directory (warm_kernels)
ROWS_FILE = "partition-rows.json"
# The longest sleep: bounds how late a timer fires (they are due every second).
IDLE_SLEEP_LONGEST_S = 0.1
# A ring under our prefix whose header has no producer pid yet is being made (Ring.create
# writes it microseconds after creating the object); one left so for this long lost its
# maker in between and is reclaimed.
RING_CREATION_GRACE_S = 60.0
# Broker.start: how long one ping waits, and the pause between pings (a ping fails at
# once until the socket exists; a starting broker compiles for seconds).
STARTUP_PING_MS = 200
STARTUP_POLL_S = 0.02


class ProducerIds:
    """Producer ids, unique across broker restarts: handed out from blocks whose
    end is written to ``producer-ids.json`` before any id of the block is used."""

    FILE = "producer-ids.json"
    BLOCK_SIZE = 1000            # ids per write of the file

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, self.FILE)
        try:
            with open(self.path) as source:
                start = int(json.load(source)["next_block"])
        except FileNotFoundError:
            start = 0
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise StorageError(f"{self.path} is unreadable ({error}); producer ids cannot be "
                               f"handed out safely: restore or remove it") from None
        self._next = self._end = start

    def allocate(self) -> int:
        if self._next == self._end:
            self._end = self._next + self.BLOCK_SIZE
            _write_atomically(self.path, json.dumps({"next_block": self._end}))
        self._next += 1
        return self._next - 1


class BrokerCore:
    """The broker's state and request handlers, without the socket."""

    def __init__(self, config: BrokerConfig, *, table: PartitionStateTable | None = None):
        self.config = config
        self.data_dir = os.path.abspath(config.data_dir)
        access.adopt(config.data_access)               # before anything is made
        self.logs = LogManager(self.data_dir)          # the lock: one broker per directory
        self.prefix = shared_memory_prefix(self.data_dir)
        self.table_name = self.prefix + "-state" if table is None else table.name
        # A table of ours left by a broker that died is replaced: we hold the lock.
        # (``table``: the warm-up's, in anonymous memory.)
        self.table = table if table is not None else \
            PartitionStateTable.create(self.table_name, config.partitions_max)
        self.appender = Appender(self.logs, self.table)
        # Producers tag ring entries with rows: a partition keeps its row across
        # restarts, so entries still in a ring after a crash go where they were meant to.
        self._rows_path = os.path.join(self.data_dir, ROWS_FILE)
        rows = self._load_rows()
        for topic in self.logs.list_topics():
            for partition in range(self.logs.describe_topic(topic).partitions):
                self.appender.register_partition(topic, partition,
                                                 rows.get(f"{topic}/{partition}"))
        self._save_rows()
        self.producers: dict[str, tuple[Ring, int]] = {}  # ring name -> (ring, producer id)
        self._ignored_rings: set[str] = set()          # under our prefix, not ours to reclaim
        self.producer_ids = ProducerIds(self.data_dir)
        self._drained = self.table.appender_doorbell.sequence
        self._drain_due = True          # rings left by a crash are drained on registration
        now = now_ms()
        self.scheduler = Scheduler()
        self.scheduler.every(config.flush_check_interval_ms, self._flush_due, now)
        self.scheduler.every(config.retention_check_interval_ms, self.apply_retention, now)
        self.scheduler.every(config.liveness_check_interval_ms, self._check_liveness, now)
        self.scheduler.every(config.cleaner_backoff_ms, self.start_cleaning, now)
        self.cleaner = CleanerThread(cleaner_keys_max(config.cleaner_dedupe_buffer_size))
        self.groups = GroupCoordinator(
            CoordinatorConfig(config.group_initial_rebalance_delay_ms,
                              config.group_min_session_timeout_ms,
                              config.group_max_session_timeout_ms,
                              config.offsets_retention_minutes * 60_000),
            topics=self._partition_counts, append_offsets=self._append_offsets,
            end_offset=self._log_end_offset)
        self.groups.load(self._offset_records())
        self._ticket = None                 # who sent the request being handled
        self._handlers = self.handlers()
        self._adopt_left_rings(include_alive=True)
        self.reap_dead_producers()

    def _load_rows(self) -> dict:
        try:
            with open(self._rows_path) as source:
                rows = json.load(source)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("ignoring %s (%s): partitions get new rows", self._rows_path, error)
            return {}
        return {key: value for key, value in rows.items() if isinstance(value, int)} \
            if isinstance(rows, dict) else {}

    def _save_rows(self) -> None:
        rows = {f"{topic}/{partition}": self.appender.row_of(topic, partition)
                for topic in self.logs.list_topics()
                for partition in range(self.logs.describe_topic(topic).partitions)}
        _write_atomically(self._rows_path, json.dumps(rows, sort_keys=True))

    # -- requests ----------------------------------------------------------------
    def handlers(self) -> dict:
        return {"ping": self.ping, "metadata": self.metadata, "create_topic": self.create_topic,
                "delete_topic": self.delete_topic, "list_topics": self.list_topics,
                "describe_topic": self.describe_topic, "add_partitions": self.add_partitions,
                "alter_topic_config": self.alter_topic_config,
                "register_producer": self.register_producer,
                "unregister_producer": self.unregister_producer,
                "init_producer_id": self.init_producer_id,
                "offset_for_timestamp": self.offset_for_timestamp,
                "list_offsets": self.list_offsets,
                **{name: self._group_handler(getattr(self.groups, name)) for name in (
                    "join_group", "sync_group", "heartbeat", "leave_group", "commit_offsets",
                    "fetch_offsets", "list_groups", "describe_group", "delete_group")}}

    def handle(self, ticket, frame: bytes) -> bytes | None:
        """The reply to one request frame, or None when it comes later (a join waits
        for its rebalance: see :meth:`take_replies`)."""
        self._ticket = ticket
        try:
            return handle_frame(frame, self._handlers)
        finally:
            self._ticket = None

    def take_replies(self) -> list[tuple[Any, bytes]]:
        """Replies that were held back and are due now: (ticket, reply frame)."""
        return [(ticket, encode_result(result)) for ticket, result in self.groups.take_replies()]

    def _group_handler(self, method):
        """A coordinator request method as a control handler: the request's fields,
        plus who asked and the time."""
        def handler(**fields):
            return method(**fields, ticket=self._ticket, now=now_ms())
        signature = inspect.signature(method)
        handler.__signature__ = signature.replace(parameters=[
            parameter for parameter in signature.parameters.values()
            if parameter.name not in ("ticket", "now")])
        return handler

    # -- consumer groups' storage --------------------------------------------------------
    def _partition_counts(self) -> dict[str, int]:
        return {topic: self.logs.describe_topic(topic).partitions
                for topic in self.logs.list_topics()}

    def _log_end_offset(self, topic: str, partition: int) -> int | None:
        try:
            return self.logs.partition_log(topic, partition).log_end_offset
        except ShmlogError:
            return None

    def _append_offsets(self, group_id: str, records: list) -> None:
        """Append commit records to the group's partition of __consumer_offsets (made
        on first use, as Kafka does) and publish them."""
        if not records:
            return
        if OFFSETS_TOPIC not in self.logs.list_topics():
            self._create_topic(OFFSETS_TOPIC, self.config.offsets_topic_num_partitions,
                               OFFSETS_TOPIC_CONFIG)
        partition = offsets_partition(group_id, self.logs.describe_topic(OFFSETS_TOPIC).partitions)
        self.logs.partition_log(OFFSETS_TOPIC, partition).append(
            encode_batch([value for _, value in records], keys=[key for key, _ in records]))
        self.appender.refresh(self.appender.row_of(OFFSETS_TOPIC, partition))
        self.table.consumer_doorbell.ring()

    def _offset_records(self):
        """Every record of __consumer_offsets, partition by partition, oldest first."""
        if OFFSETS_TOPIC not in self.logs.list_topics():
            return
        for partition in range(self.logs.describe_topic(OFFSETS_TOPIC).partitions):
            partition_log = self.logs.partition_log(OFFSETS_TOPIC, partition)
            offset = partition_log.log_start_offset
            while offset < partition_log.log_end_offset:
                result = partition_log.read(offset, max_bytes=limits.READ_SIZE_DEFAULT)
                if not result.data.size:
                    break
                for record in decode_records(result.data, start_offset=offset):
                    yield record.key, record.value
                offset = result.next_offset

    def ping(self) -> dict:
        return {"pid": os.getpid(), "data_dir": self.data_dir}

    def _topic(self, name: str) -> dict:
        metadata = self.logs.describe_topic(require(name, str, "name"))
        return {"name": metadata.name, "topic_id": metadata.topic_id,
                "partitions": [{"partition": partition,
                                "row": self.appender.row_of(metadata.name, partition),
                                "directory": os.path.join(self.logs.topics_dir, metadata.name,
                                                          str(partition))}
                               for partition in range(metadata.partitions)],
                "config": metadata.config.as_dict()}

    def metadata(self, topics: list | None = None) -> dict:
        names = self.logs.list_topics() if topics is None else require(topics, list, "topics")
        return {"state_table": self.table_name, "broker_epoch": self.table.broker_epoch,
                "ring_prefix": self.prefix, "ring_group_id": access.current().group_id,
                "topics": [self._topic(name) for name in names]}

    def create_topic(self, name, partitions: int = 1, config: dict | None = None) -> dict:
        _refuse_internal(name, "created")
        return self._create_topic(name, partitions, config)

    def _create_topic(self, name, partitions: int, config: dict | None) -> dict:
        """Create a topic, internal ones too (the broker makes those on first use)."""
        self.logs.create_topic(name, partitions, require(config or {}, dict, "config"))
        for partition in range(partitions):
            self.appender.register_partition(name, partition)
        self._save_rows()
        self.groups.topics_changed(now_ms())
        return self._topic(name)

    def delete_topic(self, name) -> dict:
        _refuse_internal(name, "deleted")
        metadata = self.logs.describe_topic(require(name, str, "name"))
        for partition in range(metadata.partitions):
            self.appender.unregister_partition(name, partition)
        self.logs.delete_topic(name)
        self._save_rows()
        self.groups.topics_changed(now_ms())
        return {}

    def list_topics(self) -> dict:
        return {"topics": self.logs.list_topics()}

    def describe_topic(self, name) -> dict:
        return self._topic(name)

    def add_partitions(self, name, total) -> dict:
        _refuse_internal(name, "given partitions")
        before = self.logs.describe_topic(require(name, str, "name")).partitions
        self.logs.add_partitions(name, total)
        for partition in range(before, total):
            self.appender.register_partition(name, partition)
        self._save_rows()
        self.groups.topics_changed(now_ms())
        return self._topic(name)

    def alter_topic_config(self, name, set: dict | None = None, delete: list | None = None) -> dict:
        metadata = self.logs.alter_topic_config(
            require(name, str, "name"), require(set or {}, dict, "set"),
            tuple(require(delete or [], list, "delete")))
        for partition in range(metadata.partitions):
            self.appender.refresh(self.appender.row_of(name, partition))
        return self._topic(name)

    def offset_for_timestamp(self, topic, partition, timestamp) -> dict:
        """Kafka's ListOffsets by time: the first offset whose timestamp is >= it."""
        partition_log = self.logs.partition_log(require(topic, str, "topic"),
                                                require(partition, int, "partition"))
        found = partition_log.offset_for_timestamp(require(timestamp, int, "timestamp"))
        return {"offset": found[0] if found else None,
                "timestamp": found[1] if found else None}

    def list_offsets(self, topic) -> dict:
        """Kafka's ListOffsets for earliest and latest: each partition's log start
        and log end offsets."""
        metadata = self.logs.describe_topic(require(topic, str, "topic"))
        partitions = []
        for partition in range(metadata.partitions):
            partition_log = self.logs.partition_log(metadata.name, partition)
            partitions.append({"partition": partition,
                               "log_start_offset": partition_log.log_start_offset,
                               "log_end_offset": partition_log.log_end_offset})
        return {"partitions": partitions}

    def register_producer(self, ring) -> dict:
        """Start draining the producer's ring (it created it, under our prefix)."""
        name = require(ring, str, "ring")
        if not name.startswith(self.prefix + "-"):
            raise LocalProtocolError(f"ring {name!r} must be named under {self.prefix!r}")
        if name not in self.producers:
            attached = Ring.attach(name)
            self.producers[name] = (attached, self.producer_ids.allocate())
            self.appender.add_ring(attached)
            log.info("producer ring %s registered", name)
        self._drain_due = True
        attached, producer_id = self.producers[name]
        index = self.appender.index_of(attached)
        return {"index": -1 if index is None else index, "producer_id": producer_id,
                "producer_epoch": 0}

    def init_producer_id(self, ring) -> dict:
        """A new producer id for a registered ring (Kafka's InitProducerId): its
        producer has used up every epoch of the one it had (KIP-360)."""
        name = require(ring, str, "ring")
        if name not in self.producers:
            raise LocalProtocolError(f"ring {name!r} is not registered: register_producer first")
        attached, _ = self.producers[name]
        self.producers[name] = (attached, self.producer_ids.allocate())
        return {"producer_id": self.producers[name][1], "producer_epoch": 0}

    def unregister_producer(self, ring) -> dict:
        """Drain what the producer published, then forget its ring and unmap it."""
        name = require(ring, str, "ring")
        registered = self.producers.pop(name, None)
        if registered is not None:
            self.appender.drain()
            index = self.appender.index_of(registered[0])
            if index is not None:              # else poisoned: removed already
                self.appender.remove_ring(index)
        return {}

    # -- the schedule ------------------------------------------------------------
    def work_pending(self, sequence: int | None = None) -> bool:
        """Has anything been put into a ring (or asked of us) since the last drain
        that left every ring empty? (``sequence``: the doorbell's, if just read.)"""
        if sequence is None:
            sequence = self.table.appender_doorbell.sequence
        return self._drain_due or sequence != self._drained

    def drain(self) -> int:
        """Drain the rings if anything was put; tell waiting consumers of what was
        appended. Returns how many entries were handled."""
        sequence = self.table.appender_doorbell.sequence
        if not self.work_pending(sequence):
            return 0
        self._drain_due = False
        handled = self.appender.drain()
        if handled:
            self.table.consumer_doorbell.ring()
        if handled < DRAIN_ENTRIES_MAX:
            self._drained = sequence          # every ring was empty after this sequence
        return handled

    def seconds_to_next_timer(self) -> float:
        due = [deadline for deadline in (self.scheduler.next_due(), self.groups.next_deadline())
               if deadline is not None]
        return max(0.0, (min(due) - now_ms()) / 1000) if due else IDLE_SLEEP_LONGEST_S

    def run_once(self, requests_waiting: bool = False) -> int:
        """Drain the rings if needed; run whatever periodic work is due. Returns how
        many entries were handled.

        ``requests_waiting``: control requests were received and not yet answered.
        Group sessions are then not expired: the heartbeats among them were sent in
        time, and a loop that was busy (a first commit creating the offsets topic,
        say) must hear them before it judges a member silent."""
        handled = self.drain()
        now = now_ms()
        group_deadline = self.groups.next_deadline()
        if group_deadline is not None and now >= group_deadline and not requests_waiting:
            self.groups.tick(now)
        if self.cleaner.busy:
            self.swap_cleaned()       # before a cleaning the scheduler may start
        self.scheduler.run_due(now)
        return handled

    def _flush_due(self, now: int) -> None:
        for topic in self.logs.list_topics():
            for partition in range(self.logs.describe_topic(topic).partitions):
                self.logs.partition_log(topic, partition).maybe_flush(now)

    def _check_liveness(self, now: int) -> None:
        self._drain_due = True            # a safety net under the doorbell
        self._adopt_left_rings(include_alive=False)
        self.reap_dead_producers()

    def apply_retention(self, now: int | None = None) -> None:
        for topic in self.logs.list_topics():
            for partition in range(self.logs.describe_topic(topic).partitions):
                partition_log = self.logs.partition_log(topic, partition)
                if partition_log.delete_old_segments(now):
                    self.appender.refresh(self.appender.row_of(topic, partition))

    def start_cleaning(self, now: int | None = None) -> bool:
        """Hand the dirtiest compacted partition to the cleaner (when it is free);
        False when none is dirty enough."""
        if self.cleaner.busy:
            return False
        now = now_ms() if now is None else now
        plans = []
        for topic in self.logs.list_topics():
            if not self.logs.describe_topic(topic).config.compact:
                continue
            for partition in range(self.logs.describe_topic(topic).partitions):
                planned = cleaner_plan(self.logs.partition_log(topic, partition), now)
                if planned is not None:
                    plans.append((planned.dirty_ratio, topic, partition, planned))
        if not plans:
            return False
        _, topic, partition, planned = max(plans, key=lambda entry: entry[0])
        self.cleaner.submit((topic, partition), planned, now)
        return True

    def swap_cleaned(self) -> bool:
        """Swap in what the cleaner finished, if it has; True when a partition changed."""
        finished = self.cleaner.collect()
        if finished is None:
            return False
        (topic, partition), result = finished
        if isinstance(result, Exception):
            log.error("cleaning %s-%d failed: %s", topic, partition, result)
            return False
        try:
            partition_log = self.logs.partition_log(topic, partition)
        except ShmlogError:
            return False                       # deleted while it was being cleaned
        if partition_log.directory != result.plan.directory or \
                not partition_log.replace_segments(result):
            return False
        self.appender.refresh(self.appender.row_of(topic, partition))
        log.info("cleaned %s-%d up to offset %d: %d -> %d bytes", topic, partition,
                 result.end_offset, result.bytes_before, result.bytes_after)
        return True

    def reap_dead_producers(self) -> None:
        """A producer that died leaves its published entries (appended here) and at
        most one unpublished, partial entry (never read): drain, then reclaim."""
        for name, (ring, _) in list(self.producers.items()):
            # A poisoned ring was unmapped when the appender stopped reading it.
            pid = int(ring.words[R.PRODUCER_PID_WORD]) \
                if self.appender.index_of(ring) is not None else 0
            if pid and _alive(pid):
                continue
            log.warning("producer ring %s: process %d is gone; reclaiming the ring", name, pid)
            self.unregister_producer(name)
            shared_memory.unlink(name)

    def _adopt_left_rings(self, *, include_alive: bool) -> None:
        """Register the rings under our prefix that no producer registered with us,
        so that the entries in them are drained and :meth:`reap_dead_producers`
        reclaims those whose producer is gone: at start, all of them (left by a
        broker that stopped or died; a live producer registers again anyway); later,
        those whose maker is gone (it died before it registered, or between
        unregistering and removing its ring). A ring still being made (no pid in its
        header yet) is given RING_CREATION_GRACE_S."""
        names = shared_memory.names(self.prefix + "-")
        self._ignored_rings &= set(names)
        for name in names:
            if name == self.table_name or name in self.producers or name in self._ignored_rings:
                continue
            try:
                pid = maker_pid(name)
                owner, group, age_s = shared_memory.owner_and_age_s(name)
            except FileNotFoundError:
                continue
            except OSError as error:
                self._ignore_ring(name, f"it cannot be read ({error})")
                continue
            if owner != os.geteuid() and group != access.current().group_id:
                # Not a producer's we serve: nobody else may make us map and read it.
                self._ignore_ring(name, f"it belongs to {access.owner_name(owner)}, gid "
                                        f"{group}, who may not produce here")
                continue
            if pid == MAKER_UNKNOWN:
                self._ignore_ring(name, "it is not a ring of this version")
                continue
            if pid == MAKER_PENDING and age_s < RING_CREATION_GRACE_S:
                continue
            if pid != MAKER_PENDING and not include_alive and _alive(pid):
                continue
            try:
                self.register_producer(name)
            except ShmlogError as error:
                self._ignore_ring(name, str(error))

    def _ignore_ring(self, name: str, reason: str) -> None:
        log.warning("leaving %s in %s alone: %s", name, shared_memory.DIRECTORY, reason)
        self._ignored_rings.add(name)

    def close(self) -> None:
        """Drain every ring, flush and close the logs, remove the shared memory."""
        self.appender.drain(entries_max=limits.BATCH_RECORD_COUNT_MAX)
        self.cleaner.stop()
        self.logs.close()
        owner = self.table.owner
        self.table.close()
        if owner:
            shared_memory.unlink(self.table_name)


def _refuse_internal(name, done: str) -> None:
    """Clients never create, delete or grow an internal topic (Kafka refuses it too):
    the broker owns it, and a group's commits are found by hashing the group id over
    its partition count, so another count or a new empty topic loses every commit."""
    if name in INTERNAL_TOPICS:
        raise InvalidTopicError(f"{name} is an internal topic (the consumer groups' committed "
                                f"offsets); the broker manages it, it cannot be {done} by a "
                                f"client")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The warm-up's scratch broker: rows of its state table, its ring's capacity, the size of
# the records it produces (a few of them fill its 4 KiB segments, so they roll), and how
# long it waits for its cleaning (a few ms; a cold numba cache compiles for seconds).
WARM_UP_ROWS = 8
WARM_UP_RING_CAPACITY = 1 << 16
WARM_UP_SEGMENT_BYTES = 4096
WARM_UP_VALUE_SIZE = 1000
WARM_UP_CLEANING_WAIT_S = 120.0
WARM_UP_POLL_S = 0.001
_WARM_UP_TOPIC = "warm-up"
_WARM_UP_APPEND_TIME_TOPIC = "warm-up-append-time"


def warm_kernels(config: BrokerConfig) -> None:
    """Serve one scratch request of each kind that runs kernels, so that numba loads
    them from its disk cache (or compiles them) now, before the control socket is
    bound: a kernel is loaded at its first call, with the GIL held, and the loop
    answers nobody meanwhile (a first create_topic, produce, commit or delete_topic
    stalled it for 0.3-1.2 s with a warm cache, seconds with a cold one). numba's
    typed lists compile their methods in every process, never cached: they are
    compiled here too.

    The scratch broker has a data directory of its own under ``config.data_dir``
    (removed after, and before, in case a killed broker left it; call this holding
    the data directory's lock), a state table and rings in anonymous memory: no real
    topic, row, ring or client is touched. A failure is logged, not raised: a broker
    whose warm-up failed (a full disk, say) still serves, only its first requests
    load kernels.
    """
    directory = os.path.join(os.path.abspath(config.data_dir), WARM_UP_DIRECTORY)
    shutil.rmtree(directory, ignore_errors=True)
    # What the scratch broker logs (its topics, the ring it poisons) is not news.
    quiet = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        table = PartitionStateTable(WARM_UP_DIRECTORY, mmap.mmap(
            -1, S.ROWS_OFFSET + WARM_UP_ROWS * S.ROW_SIZE), owner=False)
        core = BrokerCore(dataclasses.replace(config, data_dir=directory,
                                              offsets_topic_num_partitions=1), table=table)
        try:
            _serve_scratch_requests(core)
        finally:
            core.close()
    except (ShmlogError, OSError) as error:
        logging.disable(quiet)
        log.warning("the broker's kernels were not all loaded ahead (%s); its first "
                    "requests may wait for them", error)
    finally:
        logging.disable(quiet)
        shutil.rmtree(directory, ignore_errors=True)


def _serve_scratch_requests(core: BrokerCore) -> None:
    """The warm-up's requests: every path of the drain (appended in compiled code;
    handed to Python for zstd, LogAppendTime, a roll or an identity not its row's; a
    re-sent batch; a sequence out of order; a poisoned ring), the loop's doorbells,
    a time lookup, a cleaning and its swap, retention, group offsets stored, read and
    tombstoned, and the topics deleted."""
    def ask(request_type: str, **fields) -> dict:
        return decode_reply(core.handle(None, encode_request(request_type, **fields)))

    ask("create_topic", name=_WARM_UP_TOPIC, config={
        "segment.bytes": WARM_UP_SEGMENT_BYTES, "index.interval.bytes": 0,
        "cleanup.policy": "compact,delete", "retention.bytes": 0})
    ask("create_topic", name=_WARM_UP_APPEND_TIME_TOPIC,
        config={"message.timestamp.type": "LogAppendTime"})
    ring = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + WARM_UP_RING_CAPACITY),
                owner=True)
    core.appender.add_ring(ring)
    compacted = core.appender.destination(_WARM_UP_TOPIC, 0)
    stranger = Destination(compacted.row, compacted.topic_key + 1, compacted.partition)
    value = [bytes(WARM_UP_VALUE_SIZE)]

    def batch(sequence: int, compression=None):
        return compacted, encode_batch(value, keys=[b"key"], producer_id=0, producer_epoch=0,
                                       base_sequence=sequence, compression=compression)

    # Sequences 0-8 in order, each other kind of entry in between; the zstd batch ends
    # up in a closed segment, so the cleaner inflates it.
    entries = [batch(0), batch(1), batch(2), batch(3, "zstd"), batch(3, "zstd"),
               batch(9, "zstd"), batch(4), batch(4), batch(9),
               *(batch(sequence) for sequence in range(5, 9)),
               (core.appender.destination(_WARM_UP_APPEND_TIME_TOPIC, 0), encode_batch(value)),
               (stranger, encode_batch(value))]
    for destination, payload in entries:
        ring.put(destination, payload, timeout_ms=0)
        core.table.appender_doorbell.ring()
    core.drain()
    core.table.appender_doorbell.wait(lambda: True, 0)       # found at once: never sleeps
    poisoned = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + R.CAPACITY_MIN), owner=True)
    poisoned.words[R.TAIL_WORD] = 2 * R.CAPACITY_MIN        # more than it can hold: garbage
    core.appender.add_ring(poisoned)
    core.drain()
    ask("offset_for_timestamp", topic=_WARM_UP_TOPIC, partition=0, timestamp=0)
    _clean_scratch_topic(core)
    warm_cleaner_kernels()
    core.apply_retention()                # retention.bytes 0: every closed segment goes
    offsets = [[_WARM_UP_TOPIC, 0, 1, ""]]
    ask("commit_offsets", group_id=_WARM_UP_TOPIC, offsets=offsets)
    ask("fetch_offsets", group_id=_WARM_UP_TOPIC)
    ask("delete_group", group_id=_WARM_UP_TOPIC)
    for topic in (_WARM_UP_TOPIC, _WARM_UP_APPEND_TIME_TOPIC):
        ask("delete_topic", name=topic)
    core.appender.remove_ring(core.appender.index_of(ring))


def _clean_scratch_topic(core: BrokerCore) -> None:
    """Plan, clean (on the cleaner's thread, as the loop does) and swap in the
    warm-up topic's closed segments."""
    if not core.start_cleaning(now_ms()):
        raise ShmlogError("the warm-up's compacted topic had nothing to clean")
    deadline = time.monotonic() + WARM_UP_CLEANING_WAIT_S
    while core.cleaner.busy:
        if core.swap_cleaned() or time.monotonic() > deadline:
            break
        time.sleep(WARM_UP_POLL_S)


def serve(config: BrokerConfig, *, ready=None) -> None:
    """Run a broker until SIGTERM or SIGINT."""
    stopping = []
    previous = {number: signal.signal(number, lambda received, _: stopping.append(received))
                for number in (signal.SIGTERM, signal.SIGINT)}
    core = BrokerCore(config)
    control = None
    try:
        warm_kernels(config)             # before the socket: a client never waits for it
        address = control_address(core.data_dir)
        access.make_directories(os.path.join(core.data_dir, RUN_DIRECTORY))
        control = ControlEndpoint(address, core.table.appender_doorbell)
        log.info("broker %d serving %s on %s", os.getpid(), core.data_dir, address)
        if ready is not None:
            ready()
        idle_since = None
        while not stopping:
            handled = core.run_once(requests_waiting=control.waiting)
            answered = control.answer(core.handle)
            for ticket, reply in core.take_replies():
                control.send(ticket, reply)
            if answered or handled:
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            wakeup.pause(now - idle_since, core.table.appender_doorbell,
                         lambda: core.work_pending() or control.waiting,
                         min(core.seconds_to_next_timer(), IDLE_SLEEP_LONGEST_S))
        log.info("broker %d stopping on %s: draining rings, flushing and closing the logs",
                 os.getpid(), signal.Signals(stopping[0]).name)
    finally:
        if control is not None:
            for ticket in core.groups.pending_tickets():
                control.send(ticket, error_reply(BrokerNotAvailableError("the broker is stopping")))
            control.stop()
            remove_control_socket(core.data_dir)
        core.close()
        for number, handler in previous.items():
            signal.signal(number, handler)


class Broker:
    """A broker in a child process: ``with Broker(data_dir) as broker: ...``.

    Parameters
    ----------
    data_dir : str, optional
        Defaults to :func:`default_data_dir`.
    startup_timeout_s : float
        How long to wait for the control endpoint to answer.
    """

    def __init__(self, data_dir: str | None = None, *, startup_timeout_s: float = 120.0,
                 **settings: Any):
        self.config = BrokerConfig.load(None, data_dir=data_dir, **settings)
        self.data_dir = os.path.abspath(self.config.data_dir)
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None

    def start(self) -> "Broker":
        arguments = [sys.executable, "-m", "shmlog", "broker", "--data-dir", self.data_dir]
        for field in dataclasses.fields(BrokerConfig):
            if field.name != "data_dir" and getattr(self.config, field.name) is not None:
                arguments += [f"--{field.name.replace('_', '-')}",
                              str(getattr(self.config, field.name))]
        self.process = subprocess.Popen(arguments)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise ShmlogError(f"the broker exited with status {self.process.returncode} "
                                  f"while starting (see its output above)")
            try:
                request(self.data_dir, "ping", timeout_ms=STARTUP_PING_MS)
                return self
            except BrokerAccessDeniedError:
                self.stop()
                raise
            except ShmlogError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ShmlogError(f"the broker did not answer within "
                                      f"{self.startup_timeout_s} s") from None
                time.sleep(STARTUP_POLL_S)     # no socket yet fails at once: don't spin

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout_s``); the exit status."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        return self.process.returncode

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
