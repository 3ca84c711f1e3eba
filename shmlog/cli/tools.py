"""``shmlog offsets``, ``shmlog delete-records`` and ``shmlog log-dirs``: Kafka's
kafka-get-offsets, kafka-delete-records and kafka-log-dirs, against the local broker.

Each follows its Kafka tool's options and output where they fit a broker found by
its data directory: ``offsets`` prints ``topic:partition:offset`` lines,
``delete-records`` reads Kafka's ``--offset-json-file`` and prints each partition's
low watermark, ``log-dirs --json`` prints Kafka's JSON (with each partition's
segment count and offsets added). Light, as ``admin.py``'s verbs: no numba, no numpy.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from ..common.errors import LocalProtocolError, UnknownTopicOrPartitionError
from ..storage import delete_records as deletion
from .exit_codes import EXIT_FAILURE, EXIT_OK

__all__ = ["add_offsets_parser", "add_delete_records_parser", "add_log_dirs_parser",
           "partition_filter", "table"]

# kafka-get-offsets' --time values that are not timestamps.
TIME_LATEST = -1
TIME_EARLIEST = -2


def add_offsets_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``offsets`` (kafka-get-offsets) to ``commands``."""
    offsets = commands.add_parser(
        "offsets", parents=parents, help="the offsets of partitions at a time, as "
        "topic:partition:offset lines (kafka-get-offsets)")
    offsets.add_argument("topic_partitions", nargs="*", metavar="TOPIC[:PARTITIONS]",
                         help="a topic (a regular expression) and optionally partitions: N, "
                              "N-M (M excluded), N-, -M; comma-separated patterns are "
                              "taken too (Kafka's --topic-partitions); default every topic")
    offsets.add_argument("--time", type=int, default=TIME_LATEST,
                         help="-1 the latest (the high watermark), -2 the earliest (the log "
                              "start), else a timestamp in ms: the first offset at or after "
                              "it (empty when there is none)")
    offsets.add_argument("--exclude-internal-topics", action="store_true")
    offsets.add_argument("--data-dir", help="the broker's data directory")
    offsets.add_argument("--json", action="store_true", help="machine-readable output")
    offsets.set_defaults(run=_offsets)


def add_delete_records_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``delete-records`` (kafka-delete-records) to ``commands``."""
    delete = commands.add_parser(
        "delete-records", parents=parents,
        help="delete the records below an offset (kafka-delete-records)")
    delete.add_argument("--offset-json-file", "--offsets", dest="offsets_file",
                        metavar="JSON-FILE",
                        help='Kafka\'s file: {"partitions": [{"topic": "t", "partition": 0, '
                             '"offset": 10}], "version": 1}; offset -1 is the high watermark')
    delete.add_argument("--topic")
    delete.add_argument("--partition", type=int)
    delete.add_argument("--offset", type=int, help="the new log start (-1: the high watermark)")
    delete.add_argument("--timeout-ms", type=int, default=None,
                        help="how long to wait for the followers (default: the client's)")
    delete.add_argument("--data-dir", help="the broker's data directory")
    delete.add_argument("--json", action="store_true", help="machine-readable output")
    delete.set_defaults(run=_delete_records, check=_check_delete_records)


def add_log_dirs_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``log-dirs`` (kafka-log-dirs --describe) to ``commands``."""
    log_dirs = commands.add_parser(
        "log-dirs", parents=parents,
        help="disk use per partition: bytes, segments, offsets (kafka-log-dirs)")
    log_dirs.add_argument("--describe", action="store_true",
                          help="accepted for Kafka's command line: describing is all it does")
    log_dirs.add_argument("--topic-list", help="comma-separated topics (default: every topic)")
    log_dirs.add_argument("--data-dir", help="the broker's data directory")
    log_dirs.add_argument("--json", action="store_true",
                          help="Kafka's JSON (brokers, logDirs, partitions), segment counts "
                               "and offsets added")
    log_dirs.set_defaults(run=_log_dirs)


# -- offsets ------------------------------------------------------------------------------
def partition_filter(pattern: str):
    """(topic regular expression, partition predicate) of one kafka-get-offsets
    ``--topic-partitions`` pattern: ``TOPIC[:N|N-M|N-|-M]`` (M excluded, as Kafka's).

    Raises
    ------
    LocalProtocolError
        Not such a pattern.
    """
    topic, separator, partitions = pattern.partition(":")
    try:
        expression = re.compile(topic or ".*")
    except re.error as error:
        raise LocalProtocolError(f"{topic!r} is not a regular expression: {error}") from None
    match = re.fullmatch(r"(\d*)(-?)(\d*)", partitions)
    if separator and (match is None or not partitions or
                      (not match.group(2) and match.group(3))):
        raise LocalProtocolError(f"{pattern!r}: the partitions after ':' are N, N-M, N- or -M")
    if not partitions:
        return expression, lambda number: True
    low, dash, high = match.groups()
    if not dash:
        return expression, lambda number: number == int(low)
    return expression, lambda number: (not low or number >= int(low)) and \
        (not high or number < int(high))


def _offsets(arguments) -> int:
    from ..client.admin import Admin
    from ..common.internal_topics import INTERNAL_TOPICS
    admin = Admin(arguments.data_dir)
    patterns = [partition_filter(pattern) for argument in arguments.topic_partitions
                for pattern in argument.split(",")] or [partition_filter("")]
    topics = [topic for topic in sorted(admin.list_topics())
              if not (arguments.exclude_internal_topics and topic in INTERNAL_TOPICS)
              and any(expression.fullmatch(topic) for expression, _ in patterns)]
    found = []
    for topic in topics:
        wanted = [accepts for expression, accepts in patterns if expression.fullmatch(topic)]
        for entry in admin.list_offsets(topic):
            if any(accepts(entry["partition"]) for accepts in wanted):
                found.append({"topic": topic, "partition": entry["partition"],
                              "offset": _offset_at(admin, topic, entry, arguments.time)})
    if not found:           # Kafka's tool fails so too
        raise UnknownTopicOrPartitionError("could not match any topic-partitions with the "
                                           "specified filters")
    if arguments.json:
        print(json.dumps(found, indent=2))
    else:
        print("\n".join(f"{entry['topic']}:{entry['partition']}:"
                        f"{'' if entry['offset'] is None else entry['offset']}"
                        for entry in found))
    return EXIT_OK


def _offset_at(admin, topic: str, entry: dict, at: int) -> int | None:
    if at == TIME_LATEST:
        return entry["high_watermark"]
    if at == TIME_EARLIEST:
        return entry["log_start_offset"]
    if at < 0:
        raise LocalProtocolError(f"--time takes -1, -2 or a timestamp in ms, got {at}")
    return admin.offset_for_time(topic, entry["partition"], at)


# -- delete-records -------------------------------------------------------------------------
def _check_delete_records(parser: argparse.ArgumentParser, arguments) -> None:
    """Either a JSON file or all of --topic, --partition and --offset."""
    single = [arguments.topic, arguments.partition, arguments.offset]
    if arguments.offsets_file is not None and any(value is not None for value in single):
        parser.error("delete-records takes --offset-json-file or --topic/--partition/--offset, "
                     "not both")
    if arguments.offsets_file is None and any(value is None for value in single):
        parser.error("delete-records needs --offset-json-file, or --topic, --partition and "
                     "--offset")


def _delete_records(arguments) -> int:
    from ..client.admin import Admin
    if arguments.offsets_file is not None:
        try:
            with open(arguments.offsets_file) as source:
                triples = deletion.parse_offset_json(source.read())
        except OSError as error:
            raise LocalProtocolError(f"cannot read {arguments.offsets_file}: {error}") from None
    else:
        triples = [(arguments.topic, arguments.partition, arguments.offset)]
    entries = Admin(arguments.data_dir).delete_records_report(
        {(topic, partition): offset for topic, partition, offset in triples},
        arguments.timeout_ms)
    if arguments.json:
        print(json.dumps(entries, indent=2))
    else:
        print("Executing records delete operation\nRecords delete operation completed:")
        for entry in entries:
            where = f"partition: {entry['topic']}-{entry['partition']}"
            error = deletion.partition_error(entry)
            print(f"{where}\tlow_watermark: {entry['low_watermark']}" if error is None
                  else f"{where}\terror: {error}")
    failed = [entry for entry in entries if entry["error"] is not None]
    if failed:
        print(f"shmlog delete-records: {len(failed)} of {len(entries)} partitions failed",
              file=sys.stderr)
    return EXIT_FAILURE if failed else EXIT_OK


# -- log-dirs -------------------------------------------------------------------------------
def _log_dirs(arguments) -> int:
    from ..client.admin import Admin
    admin = Admin(arguments.data_dir)
    topics = None if arguments.topic_list is None else \
        [name for name in arguments.topic_list.split(",") if name]
    described = admin.describe_log_dirs(topics)
    broker_id = admin.metadata().get("broker_id", 0)
    if arguments.json:
        print(json.dumps(_kafka_log_dirs(broker_id, described)))
        return EXIT_OK
    rows = [("TOPIC", "PARTITION", "SIZE", "SEGMENTS", "LOG-START-OFFSET", "LOG-END-OFFSET",
             "HIGH-WATERMARK", "OFFSET-LAG")]
    rows += [(entry["topic"], entry["partition"], entry["size"], entry["segment_count"],
              entry["log_start_offset"], entry["log_end_offset"], entry["high_watermark"],
              entry["offset_lag"]) for entry in described["partitions"]]
    total = sum(entry["size"] for entry in described["partitions"])
    print(f"Broker {broker_id}, log directory {described['log_dir']}: "
          f"{len(described['partitions'])} partitions, {total} bytes")
    print("\n".join(table(rows)))
    return EXIT_OK


def _kafka_log_dirs(broker_id: int, described: dict) -> dict:
    """kafka-log-dirs --describe's JSON for this broker's one log directory."""
    partitions = [{"partition": f"{entry['topic']}-{entry['partition']}", "size": entry["size"],
                   "offsetLag": entry["offset_lag"], "isFuture": False,
                   "segmentCount": entry["segment_count"],
                   "logStartOffset": entry["log_start_offset"],
                   "logEndOffset": entry["log_end_offset"],
                   "highWatermark": entry["high_watermark"]}
                  for entry in described["partitions"]]
    return {"version": 1, "brokers": [{"broker": broker_id, "logDirs": [
        {"logDir": described["log_dir"], "error": None, "partitions": partitions}]}]}


def table(rows: list[tuple]) -> list[str]:
    """Rows as left-aligned columns two spaces apart (Kafka's tools' tables)."""
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]
