"""``shmlog status``: a running broker at a glance (its pid and uptime, topics with
offsets, sizes and rates, producers and their ring fill, every group's lag, the
cleaner, transactions and the hanging ones; in a cluster the cluster's summary
too), once, as JSON, or redrawn like ``top`` (``--watch``).

Everything comes from the broker's ``stats`` request (``broker_stats``: the same
numbers its Prometheus endpoint serves); in a cluster the summary is
``shmlog cluster status``'s, read from the ZooKeeper the broker names
(``cluster_status``). Light, like the other verbs that only ask the broker: no
numba, no numpy.

``--watch [SECONDS]`` redraws every SECONDS (``limits.STATUS_WATCH_INTERVAL_S``)
until Ctrl-C or SIGTERM, which end it with status 130 or 143 (128 + the signal's
number, as Kafka's tools; even when it was started with SIGINT ignored, as a shell
starts a background command), or after ``--iterations`` views. A signal cuts the
sleep between views short; one that comes while a view is read or drawn ends the
watch once that view is out (``signals.StopRequest``). On a
terminal each view replaces the last (the screen is cleared, as ``top`` and
``watch`` do); otherwise views follow one another, and with ``--json`` each is one
line (JSON Lines).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..common import limits
from ..common.errors import ShmlogError
from .exit_codes import EXIT_OK, exit_on_signal
from .signals import StopRequest

__all__ = ["add_parser", "status_lines", "status_json", "read_status"]

# Cursor home, then erase the screen: each view of --watch replaces the last on a terminal.
CLEAR_SCREEN = "\x1b[H\x1b[2J"
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``status`` subcommand to ``commands`` (an argparse subparsers action)."""
    status = commands.add_parser(
        "status", parents=parents, help="a running broker: topics, producers, groups' lag",
        description="Show a running broker: its pid and uptime, every partition's offsets, "
        "size and rates, its producers and their ring fill, every group's lag, the "
        "cleaner, and in a cluster the cluster's summary.")
    status.add_argument("--data-dir", help="the broker's data directory")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--watch", nargs="?", type=float, metavar="SECONDS",
                        const=limits.STATUS_WATCH_INTERVAL_S,
                        help=f"redraw every SECONDS (default "
                             f"{limits.STATUS_WATCH_INTERVAL_S:g}) until Ctrl-C")
    status.add_argument("--iterations", type=int, metavar="N",
                        help="with --watch: stop after N views")
    status.set_defaults(run=_status, check=_check)


def _check(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> None:
    if arguments.watch is not None and arguments.watch < limits.STATUS_WATCH_INTERVAL_S_MIN:
        parser.error(f"--watch takes at least {limits.STATUS_WATCH_INTERVAL_S_MIN} seconds")
    if arguments.iterations is not None and arguments.iterations < 1:
        parser.error("--iterations must be at least 1")


def read_status(data_dir: str | None) -> tuple[dict, object]:
    """The broker's ``stats`` reply and, in a cluster, the summary ``shmlog cluster
    status`` shows (a ``cluster_status.ClusterStatus``, or the error that kept its
    ZooKeeper from being read, as text: the broker's own numbers are still shown);
    None for a single broker.

    Raises
    ------
    ShmlogError
        No broker answers.
    """
    from ..common.paths import default_data_dir
    from ..protocol.control_client import request
    stats = request(data_dir or default_data_dir(), "stats")
    if stats["cluster"] is None:
        return stats, None
    from ..cluster import status as cluster_status
    try:
        return stats, cluster_status.read(stats["cluster"]["zookeeper_connect"])
    except ShmlogError as error:
        return stats, f"ZooKeeper not read: {error}"


def status_json(stats: dict, summary) -> dict:
    """What ``--json`` prints: the ``stats`` reply, with ``cluster_status`` in a
    cluster (``shmlog cluster status --json``'s, or ``{"error": ...}``)."""
    if summary is None:
        return stats
    return {**stats, "cluster_status": {"error": summary} if isinstance(summary, str)
            else summary.as_dict()}


def _status(arguments) -> int:
    if arguments.watch is None:
        _show(*read_status(arguments.data_dir), arguments.json, watching=False, clear=False)
        return EXIT_OK
    clear = sys.stdout.isatty()
    shown = 0
    with StopRequest() as stop:
        while not stop.number:
            _show(*read_status(arguments.data_dir), arguments.json, watching=True,
                  clear=clear)
            shown += 1
            if arguments.iterations is not None and shown >= arguments.iterations:
                return EXIT_OK
            stop.sleep(arguments.watch)
    print(flush=True)
    return exit_on_signal(stop.number)


def _show(stats: dict, summary, as_json: bool, *, watching: bool, clear: bool) -> None:
    """Print one view: JSON (one line each while watching), or the plain lines (after
    clearing the screen, on a terminal, while watching)."""
    if as_json:
        print(json.dumps(status_json(stats, summary), indent=None if watching else 2),
              flush=True)
        return
    text = "\n".join(status_lines(stats, summary))
    print((CLEAR_SCREEN if clear else "") + text + ("\n" if watching and not clear else ""),
          flush=True)


# -- the plain view ------------------------------------------------------------------------
def _bytes(count: float) -> str:
    for unit in BYTE_UNITS:
        if abs(count) < 1024 or unit == BYTE_UNITS[-1]:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable: the last unit returns")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3_600)
    minutes, seconds = divmod(seconds, 60)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{seconds:02d}"


def _table(headers: list[str], rows: list[list]) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart."""
    cells = [headers] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in cells]


def _seconds(value: float) -> str:
    """A short time in its unit: us below a millisecond, ms below a second."""
    if value < 1e-3:
        return f"{value * 1e6:g} us"
    return f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"


def _quantile(histogram: dict, fraction: float) -> str:
    """The bucket bound below which ``fraction`` of the drain passes took."""
    if not histogram["count"]:
        return "-"
    wanted = fraction * histogram["count"]
    last = "-"
    for bound, count in histogram["buckets"]:
        if bound == "+Inf":
            return f"> {last}" if count >= wanted else "-"
        last = _seconds(bound)
        if count >= wanted:
            return f"<= {last}"
    return "-"


def _header_lines(stats: dict) -> list[str]:
    broker, totals, appender = stats["broker"], stats["totals"], stats["appender"]
    drain = appender["drain_seconds"]
    metrics = broker["metrics_url"] or "off (shmlog broker --metrics-port N)"
    kafka = ", ".join(broker.get("kafka_listeners") or []) or \
        "off (shmlog broker --listeners PLAINTEXT://127.0.0.1:9092)"
    return [f"broker {broker['pid']}  up {_duration(broker['uptime_s'])}  "
            f"data {broker['data_dir']}",
            f"metrics {metrics}",
            f"kafka {kafka}",
            f"produce {totals['produced_records_per_s']:,.0f} records/s "
            f"{_bytes(totals['produced_bytes_per_s'])}/s, consume "
            f"{totals['consumed_records_per_s']:,.0f} records/s (committed), over the last "
            f"{stats['rate_window_s']} s",
            f"appender: {appender['entries_drained']:,} entries in {drain['count']:,} drain "
            f"passes, p50 {_quantile(drain, 0.5)}, p99 {_quantile(drain, 0.99)}"
            + (f", {refused:,} appends refused by the log (disk full?)"
               if (refused := appender.get("appends_refused_storage", 0)) else "")]


def _topic_lines(stats: dict) -> list[str]:
    visible = [entry for entry in stats["partitions"] if not entry["internal"]]
    rows = [[entry["topic"], entry["partition"], entry["log_start_offset"],
             entry["log_end_offset"], entry["high_watermark"],
             entry.get("last_stable_offset", entry["high_watermark"]),
             _bytes(entry["size_bytes"]), entry["segments"], f"{entry['records_per_s']:,.0f}",
             _bytes(entry["bytes_per_s"]) + "/s"] for entry in visible]
    lines = _table(["TOPIC", "PARTITION", "START", "END", "HW", "LSO", "SIZE", "SEGMENTS",
                    "RECORDS/S", "BYTES/S"], rows) if rows else ["no topics"]
    internal = [entry for entry in stats["partitions"] if entry["internal"]]
    for topic in sorted({entry["topic"] for entry in internal}):
        of_topic = [entry for entry in internal if entry["topic"] == topic]
        lines.append(f"{topic} (internal): {len(of_topic)} partitions, "
                     f"{_bytes(sum(entry['size_bytes'] for entry in of_topic))}")
    return lines


def _producer_lines(stats: dict) -> list[str]:
    rows = [[producer["ring"], producer["producer_id"], producer["pid"],
             "all" if producer["acks_all"] else "0/1", f"{producer['fill']:.1%}",
             f"{_bytes(producer['used_bytes'])} / {_bytes(producer['capacity_bytes'])}",
             f"{producer['entries_total']:,}"] for producer in stats["producers"]]
    if not rows:
        return ["producers: none registered"]
    return [f"producers: {len(rows)}"] + _table(
        ["RING", "PRODUCER_ID", "PID", "ACKS", "FILL", "USED / CAPACITY", "ENTRIES"], rows)


def _group_lines(stats: dict) -> list[str]:
    if not stats["groups"]:
        return ["groups: none"]
    rows = [[group["group_id"], group["state"], group["members"], entry["topic"],
             entry["partition"], _or_dash(entry["committed"]),
             _or_dash(entry["log_end_offset"]), _or_dash(entry["lag"]),
             f"{entry['records_per_s']:,.0f}"]
            for group in stats["groups"] for entry in group["partitions"]
            or [{"topic": "-", "partition": "-", "committed": None, "log_end_offset": None,
                 "lag": None, "records_per_s": 0.0}]]
    return [f"groups: {len(stats['groups'])}"] + _table(
        ["GROUP", "STATE", "MEMBERS", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG",
         "RECORDS/S"], rows)


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _cleaner_line(stats: dict) -> str:
    cleaner = stats["cleaner"]
    now = "idle" if cleaner["cleaning"] is None else \
        f"cleaning {cleaner['cleaning'][0]}-{cleaner['cleaning'][1]}"
    last = "" if cleaner["last_seconds"] is None else f", last took {cleaner['last_seconds']:.2f} s"
    return (f"cleaner: {now}, {cleaner['cleanings']} cleanings ({cleaner['failures']} failed), "
            f"{_bytes(cleaner['bytes_before'])} -> {_bytes(cleaner['bytes_after'])}{last}")


def _transaction_lines(stats: dict) -> list[str]:
    """The coordinator's figures, then every hanging transaction (none in a cluster,
    which has no coordinator)."""
    transactions = stats.get("transactions")
    if transactions is None:
        return []
    states = ", ".join(f"{state} {count}" for state, count in transactions["states"].items()
                       if count)
    lines = [f"transactions: {sum(transactions['states'].values())} transactional ids"
             + (f" ({states})" if states else "")
             + f", {transactions['commits']:,} committed, {transactions['aborts']:,} aborted "
             f"({transactions['timed_out']:,} timed out), {transactions['open']} open in "
             f"partitions"]
    hanging = transactions["hanging"]
    if not hanging:
        return lines
    rows = [[entry["topic"], entry["partition"], entry["producer_id"], entry["producer_epoch"],
             entry["start_offset"],
             "-" if entry["duration_ms"] < 0 else _duration(entry["duration_ms"] / 1000),
             entry["transactional_id"] or "-",
             entry["coordinator_state"] or "unknown"] for entry in hanging]
    return lines + [f"hanging transactions: {len(hanging)} (they hold back read_committed "
                    f"consumers; shmlog transactions abort ends one)"] + _table(
        ["TOPIC", "PARTITION", "PRODUCER_ID", "EPOCH", "START_OFFSET", "OPEN",
         "TRANSACTIONAL_ID", "COORDINATOR"], rows)


def _cluster_lines(stats: dict, summary) -> list[str]:
    cluster = stats["cluster"]
    if cluster is None:
        return []
    role = ", the controller" if cluster["controller"] else ""
    lines = [f"cluster: broker {cluster['broker_id']}{role}: leads {cluster['leader_count']}, "
             f"under-replicated {cluster['under_replicated_partitions']}, offline "
             f"{cluster['offline_partitions']}, ISR shrinks {cluster['isr_shrinks']}, "
             f"expands {cluster['isr_expands']}"]
    if isinstance(summary, str):
        lines.append(f"cluster status: {summary}")
    elif summary is not None:
        from ..cluster import status as cluster_status
        lines.extend(cluster_status.describe(summary).splitlines())
    return lines


def status_lines(stats: dict, summary=None) -> list[str]:
    """The plain view of a :func:`read_status` result, line by line."""
    return [*_header_lines(stats), "", *_topic_lines(stats), "", *_producer_lines(stats), "",
            *_group_lines(stats), "", _cleaner_line(stats), *_transaction_lines(stats),
            *_cluster_lines(stats, summary)]
