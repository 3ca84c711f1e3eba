"""The broker's Prometheus endpoint (``shmlog broker --metrics-port N``), built on
the ``prometheus-client`` library.

Rules
-----
* Opt-in: a broker serves metrics only with ``metrics_port`` set (0: a free port,
  which ``stats`` and ``shmlog status`` name), on ``metrics_address``
  (127.0.0.1 unless told: topic and group names are not everyone's business).
* Nothing is updated on the hot path: a custom collector (:class:`StatsCollector`)
  asks the broker's own ``stats`` request (``broker_stats``) at scrape time, over
  the control socket, so the loop's thread answers it as it answers any client and
  no object of the loop is read from the HTTP server's thread. A scrape and
  ``shmlog status`` show the same numbers. A broker that does not answer in
  ``limits.METRICS_STATS_TIMEOUT_MS`` gives a scrape with ``shmlog_stats_up`` 0
  and nothing else (exporters' ``<name>_up`` convention), never an error in the
  broker.
* Names follow Prometheus' conventions: the ``shmlog_`` prefix, base units
  (``_bytes``, ``_seconds``), ``_total`` for counters, labels ``topic``,
  ``partition``, ``group``, ``ring``, ``state``. Rates are left to Prometheus
  (``rate(shmlog_partition_appended_records_total[1m])``); the windowed rates of
  ``stats`` are for ``shmlog status``.

* Scrapers cannot make the broker work continuously: a rendered scrape is served
  again for ``limits.METRICS_SCRAPE_CACHE_S`` (the broker samples once a second),
  and the HTTP server is one thread with bounded connections, time and request
  size (``metrics_http``). The body is prometheus-client's exposition, as its own
  server made it (format by ``Accept``, gzip by ``Accept-Encoding``, ``name[]``
  filters); any other method than GET and OPTIONS is 405.

Theory of operation
-------------------
:func:`metric_families` turns one ``stats`` reply into metric families (pure: unit
tests feed it dicts); :class:`StatsCollector` calls it at every scrape;
:class:`MetricsServer` serves a registry holding only that collector over
``metrics_http.MetricsHttpServer`` (a daemon thread of its own), caches what it
rendered, and stops it at the broker's stop.
"""

from __future__ import annotations

import gzip
import logging
import time
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from ..common import limits
from ..common.errors import ShmlogError
from ..protocol.control_client import request
from .metrics_http import MetricsHttpServer, Reply

log = logging.getLogger("shmlog.broker")

__all__ = ["StatsCollector", "MetricsServer", "metric_families"]

_PARTITION = ("topic", "partition")
_RING = ("ring", "producer_id")
_GROUP_PARTITION = ("group", "topic", "partition")


def _gauge(name: str, documentation: str, labels=None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"shmlog_{name}", documentation, labels=labels)


def _counter(name: str, documentation: str, labels=None) -> CounterMetricFamily:
    return CounterMetricFamily(f"shmlog_{name}", documentation, labels=labels)


def _labelled(families: list[Metric], entries: list[dict], keys: tuple[str, ...],
              fields: tuple[str, ...]) -> None:
    """Add one sample per entry to each family (the i-th family reads ``fields[i]``)."""
    for entry in entries:
        labels = [str(entry[key]) for key in keys]
        for family, field in zip(families, fields):
            if entry.get(field) is not None:
                family.add_metric(labels, entry[field])


def _broker_families(stats: dict) -> list[Metric]:
    broker, totals = stats["broker"], stats["totals"]
    started = _gauge("broker_start_time_seconds", "When the broker started (Unix time).")
    started.add_metric([], broker["started_ms"] / 1000)
    uptime = _gauge("broker_uptime_seconds", "Seconds since the broker started.")
    uptime.add_metric([], broker["uptime_s"])
    families: list[Metric] = [started, uptime]
    for name, field, documentation in (
            ("produced_records", "produced_records", "Records appended (all partitions)."),
            ("produced_bytes", "produced_bytes", "Bytes appended (all partitions)."),
            ("consumed_records", "consumed_records",
             "Records consumed, as groups' committed offsets moved.")):
        counter = _counter(name, documentation)
        counter.add_metric([], totals[field])
        families.append(counter)
    producers = _gauge("producers", "Registered producers (rings).")
    producers.add_metric([], totals["producers"])
    families.append(producers)
    return families


def _partition_families(stats: dict) -> list[Metric]:
    gauges = [_gauge("partition_log_start_offset", "The first offset in the log.", _PARTITION),
              _gauge("partition_log_end_offset", "The offset the next record gets.", _PARTITION),
              _gauge("partition_high_watermark", "What consumers may read up to.", _PARTITION),
              _gauge("partition_size_bytes", "Bytes of the partition's segments.", _PARTITION),
              _gauge("partition_segments", "Segment files of the partition.", _PARTITION),
              _counter("partition_appended_records", "Records appended since the broker "
                       "started.", _PARTITION),
              _counter("partition_appended_bytes", "Bytes appended since the broker started.",
                       _PARTITION),
              _gauge("partition_clean_offset", "Compacted topics: below it, cleaned.",
                     _PARTITION),
              _gauge("partition_last_stable_offset", "What read_committed consumers may read "
                     "up to: below the first open transaction, at most the high watermark.",
                     _PARTITION),
              _gauge("partition_open_transactions", "Transactions that wrote to the "
                     "partition and are not ended (no marker yet).", _PARTITION)]
    _labelled(gauges, stats["partitions"], ("topic", "partition"),
              ("log_start_offset", "log_end_offset", "high_watermark", "size_bytes", "segments",
               "records_total", "bytes_total", "clean_offset", "last_stable_offset",
               "open_transactions"))
    return gauges


def _transaction_families(stats: dict) -> list[Metric]:
    transactions = stats.get("transactions")
    if transactions is None:                 # a cluster member: no coordinator
        return []
    states = _gauge("transactions", "Transactional ids by their transaction's state.",
                    ("state",))
    for state, count in sorted(transactions["states"].items()):
        states.add_metric([state], count)
    hanging = _gauge("transactions_hanging", "Open transactions the coordinator does not "
                     "hold, or open past their timeout: an operator aborts them "
                     "(shmlog transactions abort).")
    hanging.add_metric([], len(transactions["hanging"]))
    families: list[Metric] = [states, hanging]
    for name, field, documentation in (
            ("transaction_commits", "commits", "Transactions committed since the start."),
            ("transaction_aborts", "aborts", "Transactions aborted since the start (by their "
             "producer, a fence or a timeout)."),
            ("transaction_timeouts", "timed_out", "Transactions aborted at their timeout."),
            ("transaction_hanging_aborted", "hanging_aborted",
             "Hanging transactions an operator aborted.")):
        counter = _counter(name, documentation)
        counter.add_metric([], transactions[field])
        families.append(counter)
    return families


def _producer_families(stats: dict) -> list[Metric]:
    families = [_gauge("producer_ring_used_bytes", "Bytes put and not yet drained.", _RING),
                _gauge("producer_ring_capacity_bytes", "The ring's data bytes.", _RING),
                _gauge("producer_ring_fill_ratio", "used / capacity.", _RING),
                _counter("producer_ring_bytes", "Bytes the producer put (entry headers too).",
                         _RING),
                _counter("producer_ring_entries", "Entries (batches) the producer put.", _RING)]
    _labelled(families, stats["producers"], _RING,
              ("used_bytes", "capacity_bytes", "fill", "bytes_total", "entries_total"))
    return families


def _appender_families(stats: dict) -> list[Metric]:
    appender = stats["appender"]
    histogram = appender["drain_seconds"]
    drain = HistogramMetricFamily(
        "shmlog_appender_drain_seconds", "How long one drain pass of the appender took.",
        buckets=[("+Inf" if bound == "+Inf" else repr(float(bound)), count)
                 for bound, count in histogram["buckets"]],
        sum_value=histogram["sum"])
    entries = _counter("appender_entries_drained", "Ring entries the appender handled.")
    entries.add_metric([], appender["entries_drained"])
    refused = _counter("appender_appends_refused_storage",
                       "Appends the log refused (a full disk, an I/O error): their batches "
                       "were failed, nothing of them stored.")
    refused.add_metric([], appender["appends_refused_storage"])
    return [drain, entries, refused]


def _group_families(stats: dict) -> list[Metric]:
    committed = _gauge("group_committed_offset", "The group's committed offset.",
                       _GROUP_PARTITION)
    lag = _gauge("group_lag", "Log end offset minus the committed offset.", _GROUP_PARTITION)
    members = _gauge("group_members", "Members of the group.", ("group",))
    for group in stats["groups"]:
        members.add_metric([group["group_id"]], group["members"])
        for entry in group["partitions"]:
            labels = [group["group_id"], entry["topic"], str(entry["partition"])]
            if entry["committed"] is not None:
                committed.add_metric(labels, entry["committed"])
            if entry["lag"] is not None:
                lag.add_metric(labels, entry["lag"])
    return [committed, lag, members]


def _cleaner_families(stats: dict) -> list[Metric]:
    cleaner = stats["cleaner"]
    families: list[Metric] = []
    for name, field, documentation in (
            ("cleaner_cleanings", "cleanings", "Cleanings swapped in."),
            ("cleaner_failures", "failures", "Cleanings that failed."),
            ("cleaner_read_bytes", "bytes_before", "Bytes of the segments cleaned."),
            ("cleaner_written_bytes", "bytes_after", "Bytes the cleanings kept.")):
        counter = _counter(name, documentation)
        counter.add_metric([], cleaner[field])
        families.append(counter)
    busy = _gauge("cleaner_busy", "1 while a partition is being cleaned.")
    busy.add_metric([], 0 if cleaner["cleaning"] is None else 1)
    families.append(busy)
    if cleaner["last_seconds"] is not None:
        last = _gauge("cleaner_last_duration_seconds", "How long the last cleaning took.")
        last.add_metric([], cleaner["last_seconds"])
        families.append(last)
    dirty = _gauge("partition_dirty_records", "Compacted topics: offsets not cleaned yet.",
                   _PARTITION)
    _labelled([dirty], cleaner["partitions"], _PARTITION, ("dirty_records",))
    families.append(dirty)
    return families


def _cluster_families(stats: dict) -> list[Metric]:
    cluster = stats["cluster"]
    if cluster is None:
        return []
    families: list[Metric] = []
    for name, value, documentation in (
            ("cluster_leader_count", cluster["leader_count"], "Partitions this broker leads."),
            ("cluster_under_replicated_partitions", cluster["under_replicated_partitions"],
             "Partitions this broker leads whose ISR is smaller than their replicas."),
            ("cluster_offline_partitions", cluster["offline_partitions"],
             "Partitions of the cluster without a live leader (this broker's view)."),
            ("cluster_controller", int(cluster["controller"]),
             "1 when this broker is the active controller."),
            ("cluster_live_brokers", len(cluster["live_brokers"]), "Live brokers.")):
        gauge = _gauge(name, documentation)
        gauge.add_metric([], value)
        families.append(gauge)
    for name, field, documentation in (
            ("cluster_isr_shrinks", "isr_shrinks", "ISR shrinks this broker wrote as leader."),
            ("cluster_isr_expands", "isr_expands", "ISR expands this broker wrote as leader.")):
        counter = _counter(name, documentation)
        counter.add_metric([], cluster[field])
        families.append(counter)
    return families


def metric_families(stats: dict) -> list[Metric]:
    """The metric families of one ``stats`` reply (see the module's rules)."""
    return [*_broker_families(stats), *_partition_families(stats),
            *_producer_families(stats), *_appender_families(stats), *_group_families(stats),
            *_cleaner_families(stats), *_transaction_families(stats),
            *_cluster_families(stats)]


class StatsCollector:
    """A prometheus-client collector: ``read_stats()`` (a ``stats`` reply) turned into
    metric families at every scrape, with ``shmlog_stats_up`` 1; when the broker does
    not answer (a :class:`ShmlogError`), only ``shmlog_stats_up`` 0 (as exporters'
    ``mysql_up``: the scrape itself works, the broker's loop did not answer)."""

    def __init__(self, read_stats: Callable[[], dict]):
        self._read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        up = _gauge("stats_up", "1 when the broker answered this scrape's stats request.")
        try:
            stats = self._read_stats()
        except ShmlogError as error:
            log.warning("a metrics scrape got no stats from the broker: %s", error)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metric_families(stats)

    def describe(self) -> list[Metric]:
        """Nothing: registering must not ask the broker (its loop is not serving yet)."""
        return []


def _gzip_accepted(accept_encoding: str) -> bool:
    return any(entry.split(";")[0].strip().lower() == "gzip"
               for entry in accept_encoding.split(","))


class MetricsServer:
    """The broker's metrics over HTTP (``metrics_http``: one thread), for the broker
    of ``data_dir``.

    Parameters
    ----------
    data_dir : str
        The broker whose ``stats`` each scrape asks for.
    port : int
        0: a free port (see :attr:`url`).
    address : str

    Raises
    ------
    OSError
        The address cannot be bound (the port is taken).
    """

    def __init__(self, data_dir: str, port: int, address: str):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatsCollector(
            lambda: request(data_dir, "stats", timeout_ms=limits.METRICS_STATS_TIMEOUT_MS)))
        self._rendered: dict[tuple, Reply] = {}       # on the server's thread only
        self._rendered_at = 0.0
        self._server = MetricsHttpServer(self.respond, port, address)
        bound_address, bound_port = self._server.server_address[:2]
        host = f"[{bound_address}]" if ":" in bound_address else bound_address
        self.url = f"http://{host}:{bound_port}/metrics"

    def respond(self, method: str, target: str, headers: dict[str, str]) -> Reply:
        """The reply to one request, as prometheus-client's WSGI app gave it."""
        if method == "OPTIONS":
            return "200 OK", [("Allow", "OPTIONS,GET")], b""
        if method != "GET":
            return ("405 Method Not Allowed", [("Allow", "OPTIONS,GET")],
                    f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode())
        path, _, query = target.partition("?")
        if urlsplit(path).path == "/favicon.ico":
            return "200 OK", [], b""
        names = tuple(parse_qs(query).get("name[]", ()))
        return self.scrape(headers.get("accept", ""), headers.get("accept-encoding", ""),
                           names, time.monotonic())

    def scrape(self, accept: str, accept_encoding: str, names: tuple[str, ...],
               now: float) -> Reply:
        """A scrape at ``now`` (monotonic seconds), rendered at most once per
        ``limits.METRICS_SCRAPE_CACHE_S`` for the same headers: each render asks the
        broker's loop (see the module)."""
        if now - self._rendered_at >= limits.METRICS_SCRAPE_CACHE_S:
            self._rendered.clear()
            self._rendered_at = now
        key = (accept, _gzip_accepted(accept_encoding), names)
        reply = self._rendered.get(key)
        if reply is None:
            encoder, content_type = choose_encoder(accept)
            registry = self.registry.restricted_registry(names) if names else self.registry
            body, headers = encoder(registry), [("Content-Type", content_type)]
            if key[1]:
                body = gzip.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            reply = "200 OK", headers, body
            if len(self._rendered) < limits.METRICS_SCRAPE_CACHE_ENTRIES_MAX:
                self._rendered[key] = reply
        return reply

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._server.connections

    def stop(self) -> None:
        """Stop serving and close the sockets (a scrape being rendered ends first)."""
        self._server.stop(limits.METRICS_STATS_TIMEOUT_MS / 1000)
