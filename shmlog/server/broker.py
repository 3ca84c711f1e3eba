"""The broker process: owns a data directory, drains every producer's ring into the
partition logs, serves the control endpoint and the consumer-group coordinator,
and runs retention, compaction and flushing.

Rules
-----
* One broker per data directory (the directory lock says so); a second one is
  refused with :class:`DataDirectoryInUseError`.
* SIGTERM and SIGINT stop it gracefully. A cluster member first moves its
  leaderships away (controlled shutdown, ``cluster.node``), serving on meanwhile. Then it
  stops taking requests, drains every
  ring, flushes and closes the logs, and removes its shared memory and its control
  socket; nothing a producer was told is appended is lost. A request held back (a
  join waiting for its rebalance) is refused with :class:`BrokerNotAvailableError`.
* SIGQUIT writes every thread's stack to its standard error (``faulthandler``), and
  it serves on: what a broker that stopped answering is doing (Java's thread dump
  on the same signal).
* A malformed or unknown control request gets an error reply (a multipart one
  too); a frame larger than ``limits.CONTROL_FRAME_SIZE_MAX`` gets
  ``ControlRequestTooLargeError`` at once, one larger than
  ``limits.CONTROL_FRAME_RECEIVED_SIZE_MAX`` disconnects its sender before it is
  received, and a client past its bound of requests in flight gets
  ``TooManyRequestsInFlightError`` (``control_server``). Nothing a client sends
  ends the broker.
* Its data, control socket and shared memory are private to its user, or shared
  with one ``data_group`` (see ``access``).
* A client fails at once when there is no control socket (no broker runs) or it
  may not connect to it; a socket left by a killed broker is waited on, since a
  new broker may be starting (``protocol.control_client``, the clients' side; the
  paths are in ``common.paths`` and the settings in ``config.broker``, light modules that clients
  and the ``shmlog`` command import without numba).
* A broker that answers has loaded every kernel its requests run
  (:func:`warm_kernels`).
* With ``metrics_port`` set it serves Prometheus metrics (``prometheus``) from the
  moment its control socket answers until it stops taking requests; each scrape
  asks the broker's own ``stats`` request (``server.stats``), so the HTTP thread
  reads nothing of the loop's. A port that cannot be bound stops the start.

Theory of operation
-------------------
:class:`BrokerCore` is the composition: a :class:`PartitionHost` (the logs, the
partition state table, the appender; ``partition_host``), a
:class:`ProducerRegistry` (the producers' rings; ``producer_registry``), the
periodic tasks of a :class:`Scheduler` (flush policy, retention, producer liveness,
cleaning), and a list of services (``service``: the topic, producer and group
services) whose handler tables together answer every request. It does no I/O of its
own beyond the logs, so tests drive it in-process.
:func:`serve` is the thin loop around it: drain the rings, answer control
requests, tick the services whose deadline came, and run the periodic tasks that
are due. A thread of its own (``control_server.py``) waits on the ZeroMQ ROUTER
socket (``ipc://<data dir>/run/control.sock``) and hands each request to the loop,
which answers it between drains, so all state changes on one thread. Most replies
go back at once; a group join is answered when its rebalance completes (the group
service holds it back and hands it over later). The cleaner thread compacts one
partition at a time beside the loop, which swaps the result in.

Producers ring the state table's appender doorbell after every entry they put, so
the loop drains only when something was put (or a request or timer asks). When
nothing was put for a while (``wakeup.pause``) it sleeps on that doorbell (a
futex) until a producer or a control request rings it, or the next deadline is
due: an idle broker costs no CPU and wakes in microseconds. With a Kafka listener the
loop does its socket work too (``wire.socket_server``: no hand-over between threads
per request) and sleeps in ``select`` on those sockets, the doorbell's rings passed
on by a relay thread. After every drain that
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
import faulthandler
import gc
import logging
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Sequence

from ..broker.appender import HighWatermarkPolicy
from ..broker.control_server import ControlEndpoint, remove_control_socket
from ..broker.group_service import GroupService
from ..broker.partition_host import PartitionHost
from ..broker.producer_registry import ProducerRegistry
from ..broker.producer_service import ProducerService
from ..broker.scheduler import Scheduler
from ..broker.service import RequestContext, Service
from ..broker.topic_service import TopicService
from ..broker.transaction_operations import TransactionOperations
from ..broker.transaction_service import TransactionService
from ..common import access, child_process, limits
from ..common.errors import BrokerAccessDeniedError, BrokerNotAvailableError, ShmlogError

# The client's request, the paths and the config live in light modules (clients and
# the shmlog command import them without numba); they are imported back under their
# old names, which stay valid.
from ..common.paths import (
    RUN_DIRECTORY,
    SOCKET_PATH_LENGTH_MAX,  # noqa: F401 - the old name
    control_address,
    default_data_dir,
    shared_memory_prefix,
)
from ..common.process_limits import raise_open_files_limit
from ..config.broker import BrokerConfig, broker_config_entries
from ..protocol.control import (
    decode_reply,
    encode_request,
    encode_result,
    error_reply,
    handle_frame,
)
from ..protocol.control_client import request
from ..record.records import encode_batch, now_ms
from ..ring import Destination, Ring
from ..segments import warm_follower_kernels
from ..shm import ring_layout as R
from ..shm import wakeup
from ..shm.completion import CompletionCode
from ..shm.state import PartitionStateTable
from ..storage.cleaner import warm_kernels as warm_cleaner_kernels
from .stats import StatsService

log = logging.getLogger("shmlog.broker")       # the broker's log, joined by its parts

__all__ = ["BrokerConfig", "BrokerCore", "Broker", "serve", "warm_kernels", "default_data_dir",
           "control_address"]

WARM_UP_DIRECTORY = "warm-up"           # the warm-up's scratch data directory (warm_kernels)


class BrokerCore:
    """The broker without its socket: a partition host, a producer registry, the
    periodic tasks, and the services that answer requests over them.

    Parameters
    ----------
    config : BrokerConfig
    table : PartitionStateTable, optional
        A state table to use instead of the broker's own (the warm-up's, in
        anonymous memory).
    kafka_endpoints : tuple of str
        The advertised Kafka listeners (``PROTOCOL://host:port``) a cluster member
        registers, bound before it joins (``serve``), as Kafka binds its sockets
        before it registers.

    Attributes
    ----------
    host : PartitionHost
    producers : ProducerRegistry
    topics, producer_service, groups : TopicService, ProducerService, GroupService
        The broker's services (a cluster member's groups: ClusterGroupService)
        (:attr:`services` lists them, and any added later).
    transactions, transaction_operations : TransactionService, TransactionOperations
        A single broker's transaction coordinator and the operators' transaction
        requests (None in a cluster).
    stats : StatsService
        The ``stats`` request (``server.stats``): what ``shmlog status`` and the
        Prometheus endpoint show.
    """

    def __init__(self, config: BrokerConfig, *, table: PartitionStateTable | None = None,
                 kafka_endpoints: tuple[str, ...] = ()):
        self.config = config
        access.adopt(config.data_access)               # before anything is made
        self.host = PartitionHost(config.data_dir, partitions_max=config.partitions_max,
                                  cleaner_dedupe_buffer_size=config.cleaner_dedupe_buffer_size,
                                  table=table)
        self.data_dir = self.host.data_dir
        self.prefix = shared_memory_prefix(self.data_dir)
        self.producers = ProducerRegistry(self.prefix, self.host,
                                           producers_max=config.producers_max)
        now = now_ms()
        self.scheduler = Scheduler()
        self.scheduler.every(config.flush_check_interval_ms, self.host.flush_due, now)
        self.scheduler.every(config.retention_check_interval_ms, self.host.apply_retention, now)
        self.scheduler.every(config.liveness_check_interval_ms, self.producers.check_liveness,
                             now)
        self.scheduler.every(config.cleaner_backoff_ms, self.host.start_cleaning, now)
        self.context = RequestContext()          # who sent the request being handled
        self.services: list[Service] = []
        self._handlers = {"ping": self.ping,
                          "describe_broker_config": self.describe_broker_config}
        self.cluster = None
        if config.cluster is None:
            self.topics = self.add_service(TopicService(self.host, self.prefix))
        else:
            self.topics = self.add_service(self._join(config, kafka_endpoints))
        self.producer_service = self.add_service(ProducerService(
            self.producers, None if self.cluster is None
            else self.cluster.replication.forwarding.transactional_ids.learn))
        self.transactions = self.transaction_operations = None
        if self.cluster is None:
            self.groups = self.add_service(GroupService(config, self.host, self.context))
            self.transactions = self.add_service(
                TransactionService(config, self.host, self.producers, self.groups))
            self.transaction_operations = self.add_service(
                TransactionOperations(self.transactions))
        else:
            from ..cluster.groups import ClusterGroupService  # a member's groups
            from ..cluster.transaction_operations import ClusterTransactionOperations
            from ..cluster.transactions import ClusterTransactionService
            self.groups = self.add_service(ClusterGroupService(config, self.host, self.context,
                                                               self.cluster.replication))
            self.transactions = self.add_service(ClusterTransactionService(
                config, self.host, self.context, self.cluster.replication, self.producers,
                self.groups))
            self.transaction_operations = self.add_service(
                ClusterTransactionOperations(self.transactions))
        self.stats = self.add_service(StatsService(self.host, self.producers,
                                                   self.groups.coordinator, self.cluster,
                                                   self.transaction_operations))
        self.producers.adopt_left_rings(include_alive=True)
        self.producers.reap_dead_producers()

    def _join(self, config: BrokerConfig, kafka_endpoints: tuple[str, ...]) -> Service:
        """Join the cluster of ``config.cluster``; the topic service of a member."""
        from ..cluster.node import ClusterNode  # kazoo: only a member loads it
        from ..cluster.topic_service import ClusterTopicService
        self.cluster = ClusterNode(config.cluster, self.host, kafka_endpoints)
        self.producers.producer_ids = self.cluster.producer_ids    # cluster-wide ids
        self.add_service(self.cluster.replication)
        return ClusterTopicService(self.host, self.prefix, self.cluster.replication,
                                   self.context)

    def add_service(self, service: Service) -> Service:
        """Answer ``service``'s requests, tick it and collect its replies from now on;
        returns it."""
        added = service.handlers()
        clashes = added.keys() & self._handlers.keys()
        assert not clashes, f"request types served twice: {sorted(clashes)}"
        self._handlers.update(added)
        self.services.append(service)
        return service

    # -- requests ----------------------------------------------------------------
    def handlers(self) -> dict:
        """{request type: handler}: the union of the services' tables."""
        return dict(self._handlers)

    def ping(self) -> dict:
        """The broker's pid and data directory; a cluster member adds how its peers
        talk to it and how many connections its replication endpoint refused (CurveZMQ
        handshakes of unknown keys or without CURVE)."""
        answer = {"pid": os.getpid(), "data_dir": self.data_dir}
        if self.cluster is not None:
            answer["replication_security"] = \
                "curve" if self.cluster.endpoint.public_key else "plaintext"
            answer["replication_refused_connections"] = self.cluster.endpoint.refused_count
        return answer

    def describe_broker_config(self) -> dict:
        """This broker's settings, each with its source (``broker_config_entries``),
        and its id in a cluster (-1 alone)."""
        return {"broker_id": self.config.cluster.broker_id if self.config.cluster else -1,
                "configs": broker_config_entries(self.config)}

    def handle(self, ticket, frame: bytes) -> bytes | None:
        """The reply to one request frame, or None when it comes later (a join waits
        for its rebalance: see :meth:`take_replies`)."""
        self.context.ticket = ticket
        try:
            return handle_frame(frame, self._handlers)
        finally:
            self.context.ticket = None

    def take_replies(self) -> list[tuple[Any, bytes]]:
        """Replies that were held back and are due now: (ticket, reply frame)."""
        return [(ticket, encode_result(result)) for ticket, result in self.take_results()]

    def take_results(self) -> list[tuple[Any, Any]]:
        """Results of requests that were held back, due now: (ticket, reply fields or
        the ShmlogError refusing it), for whichever front end owns the ticket."""
        return [(ticket, result)
                for service in self.services for ticket, result in service.take_replies()]

    def pending_tickets(self) -> list:
        """Tickets of requests held back and not answered yet."""
        return [ticket for service in self.services for ticket in service.pending_tickets()]

    # -- the loop ------------------------------------------------------------------
    def next_deadline(self) -> int | None:
        """The earliest of the periodic tasks' and the services' deadlines (ms)."""
        return self.scheduler.next_due(self.services)

    def seconds_to_next_timer(self) -> float:
        deadline = self.next_deadline()
        return max(0.0, (deadline - now_ms()) / 1000) if deadline is not None \
            else limits.BROKER_IDLE_SLEEP_LONGEST_S

    def work_pending(self) -> bool:
        """Is anything waiting for :meth:`run_once` (put into a ring, asked of us,
        or come from a peer)?"""
        return self.host.work_pending() or (self.cluster is not None and
                                            self.cluster.replication.work_pending())

    def run_once(self, requests_waiting: bool = False) -> int:
        """Drain the rings if needed; run whatever periodic work is due. Returns how
        many ring entries and peers' messages were handled.

        ``requests_waiting``: control requests were received and not yet answered.
        Services are then not ticked (``service``): the heartbeats among them were
        sent in time, and a loop that was busy (a first commit creating the offsets
        topic, say) must hear them before it judges a member silent."""
        handled = self.host.drain()
        now = now_ms()
        if self.cluster is not None:
            handled += self.cluster.replication.poll(now)
        if not requests_waiting:
            self.scheduler.tick(self.services, now)     # guarded, as the tasks are
        if self.host.cleaner.busy:
            self.host.swap_cleaned()       # before a cleaning the scheduler may start
        self.scheduler.run_due(now)
        return handled

    def start_leaving(self) -> None:
        """On SIGTERM: a cluster member with ``controlled.shutdown.enable`` starts its
        controlled shutdown (``cluster.node``); the loop serves on until
        :meth:`ready_to_leave`."""
        if self.cluster is not None and self.cluster.config.controlled_shutdown_enable:
            self.cluster.start_controlled_shutdown()

    def ready_to_leave(self) -> bool:
        """Whether :meth:`close` may run now (a controlled shutdown is over)."""
        if self.cluster is None or self.cluster.shutdown is None:
            return True
        return self.cluster.controlled_shutdown_done(now_ms())

    def close(self) -> None:
        """Leave the cluster (if a member); drain every ring, flush and close the logs,
        remove the shared memory."""
        if self.cluster is not None:
            self.topics.close()
            self.cluster.close()
        self.host.close()


_WARM_UP_TOPIC = "warm-up"
_WARM_UP_APPEND_TIME_TOPIC = "warm-up-append-time"


def warm_kernels(config: BrokerConfig) -> None:
    """Serve one scratch request of each kind that runs kernels, so that numba loads
    them from its disk cache (or compiles them) now, before the control socket is
    bound: a kernel is loaded at its first call, with the GIL held, and the loop
    answers nobody meanwhile (a first create_topic, produce, commit or delete_topic
    stalled it for 0.3-1.2 s with a warm cache, seconds with a cold one).

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
        table = PartitionStateTable.scratch(WARM_UP_DIRECTORY, limits.WARM_UP_ROWS,
                                            writable=True)
        core = BrokerCore(dataclasses.replace(config, data_dir=directory, cluster=None,
                                              offsets_topic_num_partitions=1,
                                              transaction_state_log_num_partitions=1),
                          table=table)
        try:
            _serve_scratch_requests(core)
            if config.cluster is not None:
                warm_follower_kernels(os.path.join(directory, "follower"))
        finally:
            core.close()
            del core, table
            # The scratch broker's objects hold views of its (deleted) segments in
            # reference cycles: collected now, their mappings go now, not whenever
            # the collector next runs (a leaked log kept its populated pages).
            gc.collect()
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
        "segment.bytes": limits.WARM_UP_SEGMENT_BYTES, "index.interval.bytes": 0,
        "cleanup.policy": "compact,delete", "retention.bytes": 0})
    ask("create_topic", name=_WARM_UP_APPEND_TIME_TOPIC,
        config={"message.timestamp.type": "LogAppendTime"})
    ring = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + limits.WARM_UP_RING_CAPACITY),
                owner=True)
    appender = core.host.appender
    appender.add_ring(ring)
    compacted = appender.destination(_WARM_UP_TOPIC, 0)
    stranger = Destination(compacted.row, compacted.topic_key + 1, compacted.partition)
    value = [bytes(limits.WARM_UP_VALUE_SIZE)]

    def batch(sequence: int, compression=None):
        return compacted, encode_batch(value, keys=[b"key"], producer_id=0, producer_epoch=0,
                                       base_sequence=sequence, compression=compression)

    # Sequences 0-8 in order, each other kind of entry in between; the zstd batch ends
    # up in a closed segment, so the cleaner inflates it.
    entries = [batch(0), batch(1), batch(2), batch(3, "zstd"), batch(3, "zstd"),
               batch(9, "zstd"), batch(4), batch(4), batch(9),
               *(batch(sequence) for sequence in range(5, 9)),
               (appender.destination(_WARM_UP_APPEND_TIME_TOPIC, 0), encode_batch(value)),
               (stranger, encode_batch(value))]
    for destination, payload in entries:
        ring.put(destination, payload, timeout_ms=0)
        core.host.table.appender_doorbell.ring()
    core.host.drain()
    core.host.table.appender_doorbell.wait(lambda: True, 0)   # found at once: never sleeps
    poisoned = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + R.CAPACITY_MIN), owner=True)
    poisoned.words[R.TAIL_WORD] = 2 * R.CAPACITY_MIN        # more than it can hold: garbage
    appender.add_ring(poisoned)
    core.host.drain()
    ask("offset_for_timestamp", topic=_WARM_UP_TOPIC, partition=0, timestamp=0)
    _clean_scratch_topic(core)
    warm_cleaner_kernels()
    core.host.apply_retention()           # retention.bytes 0: every closed segment goes
    _serve_scratch_acks_all(core, value)
    _serve_scratch_forwarded(core, value)
    _serve_scratch_transactions(core, ask, value)
    offsets = [[_WARM_UP_TOPIC, 0, 1, ""]]
    ask("commit_offsets", group_id=_WARM_UP_TOPIC, offsets=offsets)
    ask("fetch_offsets", group_id=_WARM_UP_TOPIC)
    ask("delete_group", group_id=_WARM_UP_TOPIC)
    for topic in (_WARM_UP_TOPIC, _WARM_UP_APPEND_TIME_TOPIC):
        ask("delete_topic", name=topic)
    appender.remove_ring(appender.index_of(ring))


def _serve_scratch_transactions(core: BrokerCore, ask, value: list) -> None:
    """A transaction's paths: its producer initialised, a partition and a group's
    offsets added, its first batch (Python's) and the next (the compiled loop's),
    offsets committed inside it, one transaction aborted (indexed) and one committed."""
    appender = core.host.appender
    ring = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + limits.WARM_UP_RING_CAPACITY),
                owner=True)
    appender.add_ring(ring)
    producer = ask("init_transactions", transactional_id=_WARM_UP_TOPIC,
                   transaction_timeout_ms=limits.TRANSACTION_TIMEOUT_MS_DEFAULT)
    identity = {"transactional_id": _WARM_UP_TOPIC, **producer}
    sequence = 0
    for committed in (False, True):
        ask("add_partitions_to_txn", **identity, partitions=[[_WARM_UP_TOPIC, 0]])
        for _ in range(2):
            ring.put(appender.destination(_WARM_UP_TOPIC, 0), encode_batch(
                value, producer_id=producer["producer_id"],
                producer_epoch=producer["producer_epoch"], base_sequence=sequence,
                transactional=True), timeout_ms=0)
            sequence += 1
        core.host.drain_soon()
        core.host.drain()
        ask("add_offsets_to_txn", **identity, group_id=_WARM_UP_TOPIC)
        ask("txn_offset_commit", **identity, group_id=_WARM_UP_TOPIC,
            offsets=[[_WARM_UP_TOPIC, 0, 1, ""]])
        ask("end_txn", **identity, committed=committed)
    appender.remove_ring(appender.index_of(ring))


def _serve_scratch_acks_all(core: BrokerCore, value: list) -> None:
    """acks=all's paths, as a replica service drives them: entries parked until the
    high watermark covers them, one completed under min.insync.replicas after its
    append and one refused before it, parked ones refused from an offset and all,
    and the count of those parked."""
    appender = core.host.appender
    row = appender.row_of(_WARM_UP_TOPIC, 0)
    ring = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + limits.WARM_UP_RING_CAPACITY),
                owner=True)
    appender.add_ring(ring, awaits_high_watermark=True)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    destination = appender.destination(_WARM_UP_TOPIC, 0)
    for _ in range(3):
        ring.put(destination, encode_batch(value, keys=[b"key"]), timeout_ms=0)
    core.host.drain_soon()
    core.host.drain()
    appender.parked_count(row)
    appender.set_under_min_isr(row, True)
    appender.advance_high_watermark(row, appender.high_watermark(row) + 1)
    appender.refuse_parked_from(row, appender.high_watermark(row) + 1,
                                CompletionCode.NOT_LEADER_OR_FOLLOWER)
    appender.refuse_parked(row, CompletionCode.NOT_LEADER_OR_FOLLOWER)
    ring.put(destination, encode_batch(value, keys=[b"key"]), timeout_ms=0)
    core.host.drain_soon()
    core.host.drain()                     # refused: under min.insync.replicas
    appender.set_under_min_isr(row, False)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.LOG_END)
    appender.remove_ring(appender.index_of(ring))


def _serve_scratch_forwarded(core: BrokerCore, value: list) -> None:
    """Forwarding's appender paths (a cluster member's producers whose partition
    another broker leads): an entry handed to a forwarder, its completion parked as
    external, then resolved."""
    appender = core.host.appender
    row = appender.row_of(_WARM_UP_TOPIC, 0)
    ring = Ring(WARM_UP_DIRECTORY, mmap.mmap(-1, R.DATA_OFFSET + limits.WARM_UP_RING_CAPACITY),
                owner=True)
    index = appender.add_ring(ring)
    forwarded: list = []
    appender.set_forwarder(forwarded.append)
    appender.set_is_leader(row, False)
    ring.put(appender.destination(_WARM_UP_TOPIC, 0), encode_batch(value), timeout_ms=0)
    core.host.drain_soon()
    core.host.drain()
    for entry in forwarded:
        appender.resolve_forwarded(entry.ring, entry.number, 0, -1)
    appender.set_is_leader(row, True)
    appender.set_forwarder(None)
    appender.remove_ring(index)


def _clean_scratch_topic(core: BrokerCore) -> None:
    """Plan, clean (on the cleaner's thread, as the loop does) and swap in the
    warm-up topic's closed segments."""
    if not core.host.start_cleaning(now_ms()):
        raise ShmlogError("the warm-up's compacted topic had nothing to clean")
    deadline = time.monotonic() + limits.WARM_UP_CLEANING_WAIT_S
    while core.host.cleaner.busy:
        if core.host.swap_cleaned() or time.monotonic() > deadline:
            break
        time.sleep(limits.WARM_UP_POLL_S)


def serve(config: BrokerConfig, *, ready=None) -> None:
    """Run a broker until SIGTERM or SIGINT."""
    stopping = []
    previous = {number: signal.signal(number, lambda received, _: stopping.append(received))
                for number in (signal.SIGTERM, signal.SIGINT)}
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    open_files = raise_open_files_limit()    # before the logs open
    kafka = _bind_kafka(config)              # before joining: its ports are registered
    try:
        core = BrokerCore(config, kafka_endpoints=kafka.endpoints if kafka else ())
    except BaseException:
        if kafka is not None:
            kafka.stop()
        raise
    control = metrics = selector = None
    try:
        warm_kernels(config)             # before the socket: a client never waits for it
        address = control_address(core.data_dir)
        access.make_directories(os.path.join(core.data_dir, RUN_DIRECTORY))
        control = ControlEndpoint(address, core.host.table.appender_doorbell)
        log.info("broker %d serving %s on %s (open-files limit %d, hard limit %d)",
                 os.getpid(), core.data_dir, address, *open_files)
        if config.metrics_port is not None:
            metrics = _serve_metrics(core)
        if kafka is not None:
            kafka.serve(core)
            core.stats.kafka_listeners = [f"{host}:{port}" for host, port in kafka.addresses]
        selector = _loop_selector(core, kafka)
        if ready is not None:
            ready()
        idle_since = None
        leaving = False
        while True:
            if stopping:
                if not leaving:
                    leaving = True
                    core.start_leaving()
                if core.ready_to_leave():
                    break
            handled = core.run_once(requests_waiting=control.waiting)
            answered = control.answer(core.handle)
            for ticket, result in core.take_results():
                if kafka is not None and kafka.owns(ticket):
                    kafka.resolve(ticket, result)
                else:
                    control.send(ticket, encode_result(result))
            if kafka is not None:
                answered |= kafka.answer()
                kafka.poll(now_ms())
            if answered or handled:
                idle_since = None
                continue
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            wakeup.pause(now - idle_since, core.host.table.appender_doorbell,
                         lambda: core.work_pending() or control.waiting or
                         (kafka is not None and kafka.waiting),
                         lambda: min(_seconds_to_next_timer(core, kafka),
                                     limits.BROKER_IDLE_SLEEP_LONGEST_S),
                         sleep=selector.sleep if selector is not None else None)
        log.info("broker %d stopping on %s: draining rings, flushing and closing the logs",
                 os.getpid(), signal.Signals(stopping[0]).name)
    finally:
        if metrics is not None:
            metrics.stop()               # first: its scrapes ask the control socket
        if kafka is not None:
            kafka.stop()
        if control is not None:
            for ticket in core.pending_tickets():
                if kafka is None or not kafka.owns(ticket):   # Kafka connections just close
                    control.send(ticket,
                                 error_reply(BrokerNotAvailableError("the broker is stopping")))
            control.stop()
            remove_control_socket(core.data_dir)
        core.close()
        if selector is not None:
            selector.close()             # last: the core's sockets leave it as they close
        for number, handler in previous.items():
            signal.signal(number, handler)
        faulthandler.unregister(signal.SIGQUIT)


def _bind_kafka(config: BrokerConfig):
    """The Kafka listener ``config`` asks for (``wire``), bound, not yet serving; None
    when ``listeners`` is unset."""
    if not config.listeners:
        return None
    from ..wire.kafka_listener import KafkaListener
    return KafkaListener(config)


def _seconds_to_next_timer(core: BrokerCore, kafka) -> float:
    """Seconds until the loop has timed work: the core's, or the Kafka listener's."""
    seconds = core.seconds_to_next_timer()
    listener = kafka.seconds_to_next_timer() if kafka is not None else None
    return seconds if listener is None else min(seconds, listener)


def _loop_selector(core: BrokerCore, kafka) -> wakeup.LoopSelector | None:
    """What the idle loop sleeps in when it has sockets of its own (a Kafka
    listener's, a cluster member's replication sockets): those and the doorbell at
    once. None without: it sleeps on the doorbell alone."""
    if kafka is None and core.cluster is None:
        return None
    selector = wakeup.LoopSelector(core.host.table.appender_doorbell, "shmlog-loop-doorbell")
    if kafka is not None:
        selector.watch(kafka.fileno())
    if core.cluster is not None:
        core.cluster.endpoint.attach(selector)
    return selector


def _serve_metrics(core: BrokerCore):
    """Start the Prometheus endpoint of ``core``'s config (``prometheus``: the library
    is imported only by a broker that serves metrics); its MetricsServer."""
    from .prometheus import MetricsServer
    metrics = MetricsServer(core.data_dir, core.config.metrics_port, core.config.metrics_address)
    core.stats.metrics_url = metrics.url
    log.info("broker %d: Prometheus metrics on %s", os.getpid(), metrics.url)
    return metrics


class Broker:
    """A broker in a child process: ``with Broker(data_dir) as broker: ...``.

    Parameters
    ----------
    data_dir : str, optional
        Defaults to :func:`default_data_dir`.
    config_file : str, optional
        A TOML file of settings (with a ``[cluster]`` table: a cluster member).
    startup_timeout_s : float
        How long to wait for the control endpoint to answer.
    launch_prefix : sequence of str
        A command the broker's command line is run under, e.g. ``["ip", "netns",
        "exec", "ns1"]`` (a test network namespace; it must exec the broker, so the
        process's pid is the broker's and signals reach it).
    output : str, optional
        A file the broker's stdout and stderr are appended to (default: this
        process's).
    """

    def __init__(self, data_dir: str | None = None, *, config_file: str | None = None,
                 startup_timeout_s: float = 120.0, launch_prefix: Sequence[str] = (),
                 output: str | None = None, **settings: Any):
        self.config_file = config_file
        self.config = BrokerConfig.load(config_file, data_dir=data_dir, **settings)
        self.data_dir = os.path.abspath(self.config.data_dir)
        self.startup_timeout_s = startup_timeout_s
        self.launch_prefix = list(launch_prefix)
        self.output = output
        self.process: subprocess.Popen | None = None

    def start(self) -> "Broker":
        """Start the broker; returns once it answers."""
        return self.launch().wait_until_serving()

    def launch(self) -> "Broker":
        """Start the broker's process without waiting for it to serve (several
        brokers warm up at once: see :meth:`wait_until_serving`)."""
        arguments = [sys.executable, "-m", "shmlog", "broker", "--data-dir", self.data_dir]
        if self.config_file is not None:
            arguments += ["--config", self.config_file]     # its tables ([cluster]) too
        for field in dataclasses.fields(BrokerConfig):
            if field.name != "data_dir" and field.name not in BrokerConfig.TABLE_SETTINGS \
                    and getattr(self.config, field.name) is not None:
                arguments += [f"--{field.name.replace('_', '-')}",
                              str(getattr(self.config, field.name))]
        if self.output is None:
            self.process = subprocess.Popen(self.launch_prefix + arguments)
        else:
            with open(self.output, "ab") as output:
                self.process = subprocess.Popen(self.launch_prefix + arguments, stdout=output,
                                                stderr=subprocess.STDOUT)
        return self

    def wait_until_serving(self) -> "Broker":
        """Wait (``startup_timeout_s`` at most) until the launched broker answers.

        Raises
        ------
        ShmlogError
            It exited, or did not answer in time (it is stopped).
        BrokerAccessDeniedError
            This user may not connect to it (it is stopped).
        """
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise ShmlogError(f"the broker exited with status {self.process.returncode} "
                                  f"while starting (see its output above)")
            try:
                request(self.data_dir, "ping", timeout_ms=limits.BROKER_STARTUP_PING_MS)
                return self
            except BrokerAccessDeniedError:
                self.stop()
                raise
            except ShmlogError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ShmlogError(f"the broker did not answer within "
                                      f"{self.startup_timeout_s} s") from None
                # no socket yet fails at once: don't spin
                time.sleep(limits.BROKER_STARTUP_POLL_S)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout_s``); the exit status."""
        if self.process is None:
            return 0
        return child_process.stop(self.process, timeout_s)

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
