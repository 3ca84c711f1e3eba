"""``shmlog dump``: print, and with ``--verify`` check, a segment, index or transaction
index file (Kafka's kafka-dump-log).

The reading is ``shmlog.storage.dump``'s (imported when the verb runs: it loads numba);
this module only prints what it reports. Exit 1 when ``--verify`` found a problem.

A segment of a running broker's data directory (``DATA/topics/TOPIC/PARTITION/``)
that is its partition's active one is verified up to the end the broker published
(:func:`published_end`: the row of the partition in the broker's state table),
because past it the broker may be copying a batch this very moment; a sealed
segment, or any segment when no broker answers, is verified whole.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..common import limits
from ..common.errors import ShmlogError
from .exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

__all__ = ["add_parser"]


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``dump`` subcommand to ``commands`` (an argparse subparsers action)."""
    dump = commands.add_parser("dump", parents=parents,
                               help="print and verify a segment (.log) or index file",
                               description="Print the batches of a segment file, or the "
                               "entries of an .index/.timeindex/.txnindex file.")
    dump.add_argument("path", help="a <base offset>.log, .index, .timeindex or .txnindex file")
    dump.add_argument("--verify", action="store_true",
                      help="check every CRC and both indexes; exit 1 on any problem")
    dump.add_argument("--records", action="store_true", help="list every record")
    dump.add_argument("--print-data", action="store_true",
                      help="with each record, print its key and value")
    dump.add_argument("--max-bytes", type=int, default=80,
                      help="print at most this many bytes of a key or value (default 80)")
    dump.add_argument("--json", action="store_true", help="machine-readable output")
    dump.set_defaults(run=_dump)


def _printable(data: bytes | None, limit: int) -> str:
    if data is None:
        return "null"
    text = data[:limit].decode("utf-8", errors="backslashreplace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + ("..." if len(data) > limit else "")


def published_end(path: str) -> int | None:
    """Where the published data of ``path`` ends when it is the active segment of a
    running broker's partition (0 for a segment newer than the one published: a roll
    under way); None for a sealed segment, a file outside a data directory's topics,
    or when no broker answers. Loaded from the state table before the file is read,
    so every byte below it is a complete batch's (``state_layout``)."""
    from ..shm.state import PartitionStateTable, topic_key
    from ..storage.dump import base_offset_of
    from ..storage.log_manager import TOPICS_DIRECTORY
    partition_dir = os.path.dirname(os.path.abspath(path))
    topic_dir = os.path.dirname(partition_dir)
    topics_dir = os.path.dirname(topic_dir)
    partition = os.path.basename(partition_dir)
    if os.path.basename(topics_dir) != TOPICS_DIRECTORY or not partition.isdigit():
        return None
    topic = os.path.basename(topic_dir)
    try:
        from ..protocol.control_client import request
        metadata = request(os.path.dirname(topics_dir), "metadata", topics=[topic],
                           timeout_ms=limits.DUMP_METADATA_TIMEOUT_MS)
        [entry] = metadata["topics"]
        rows = [row["row"] for row in entry["partitions"] if row["partition"] == int(partition)]
        if not rows:
            return None
        table = PartitionStateTable.attach(metadata["state_table"])
    except ShmlogError:
        return None                   # no broker serves it: the file is all there is
    try:
        row = table.snapshot(rows[0])
    finally:
        table.close()
    if (row.topic_key, row.partition) != (topic_key(entry["topic_id"]), int(partition)):
        return None                   # the partition left the row since the reply
    base_offset = base_offset_of(path)
    if base_offset > row.active_segment_base_offset:
        return 0
    return row.active_segment_size if base_offset == row.active_segment_base_offset else None


def _dump_log(arguments) -> int:
    from ..storage.dump import read_segment
    report = read_segment(arguments.path, with_records=arguments.records or arguments.print_data,
                          verify=arguments.verify,
                          published_end=published_end(arguments.path) if arguments.verify
                          else None)
    if arguments.json:
        body = {"path": report.path, "base_offset": report.base_offset,
                "file_size": report.file_size, "data_end": report.data_end,
                "published_end": report.published_end,
                "batches": [info._asdict() for info in report.batches],
                "problems": report.problems}
        if report.records:
            body["records"] = [[{"offset": record.offset, "timestamp": record.timestamp,
                                 "key_size": -1 if record.key is None else len(record.key),
                                 "value_size": -1 if record.value is None else len(record.value),
                                 "headers": [name for name, _ in record.headers]}
                                for record in columns.records()] for columns in report.records]
        print(json.dumps(body, indent=2))
    else:
        print(f"Dumping {report.path} (base offset {report.base_offset}, "
              f"{report.file_size} bytes)")
        for number, info in enumerate(report.batches):
            print(f"baseOffset: {info.base_offset} lastOffset: {info.last_offset} "
                  f"count: {info.record_count} position: {info.position} "
                  f"size: {info.batch_length} leaderEpoch: {info.leader_epoch} "
                  f"{'LogAppendTime' if info.timestamp_type else 'CreateTime'}: "
                  f"{info.max_timestamp} compression: {info.compression.name.lower()} "
                  f"producerId: {info.producer_id} producerEpoch: {info.producer_epoch} "
                  f"baseSequence: {info.base_sequence} "
                  f"isTransactional: {info.is_transactional} isControl: {info.is_control} "
                  f"crc: {info.crc} isValid: true")
            if report.records:
                for record in report.records[number].records():
                    line = (f"| offset: {record.offset} timestamp: {record.timestamp} "
                            f"keySize: {-1 if record.key is None else len(record.key)} "
                            f"valueSize: {-1 if record.value is None else len(record.value)} "
                            f"headers: {[name for name, _ in record.headers]}")
                    if info.is_control:
                        line += _marker_text(record)
                    elif arguments.print_data:
                        line += (f" key: {_printable(record.key, arguments.max_bytes)} "
                                 f"payload: {_printable(record.value, arguments.max_bytes)}")
                    print(line)
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
        if arguments.verify:
            verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
            live = "" if report.published_end is None else \
                f" (a live segment: up to the end its broker published, {report.published_end})"
            print(f"Verified {len(report.batches)} batches, {report.data_end} bytes{live}: "
                  f"{verdict}")
    return EXIT_OK if report.ok or not arguments.verify else EXIT_FAILURE


def _marker_text(record) -> str:
    """What a control record says, as Kafka's DumpLogSegments prints it."""
    from ..record.control import control_record
    try:
        kind, coordinator_epoch = control_record(record.key, record.value, record.offset)
    except ShmlogError as error:
        return f" controlRecord: unreadable ({error})"
    return f" endTxnMarker: {kind.name} coordinatorEpoch: {coordinator_epoch}"


def _dump_index(arguments) -> int:
    from ..storage import index_layout as I
    from ..storage.dump import read_index, read_segment, used_entries
    entries = read_index(arguments.path)
    preallocated = entries.size - used_entries(entries)
    entries = entries[:entries.size - preallocated]
    if arguments.json:
        print(json.dumps([{name: int(entry[name]) for name in entries.dtype.names}
                          for entry in entries], indent=2))
    else:
        for entry in entries:
            print(" ".join(f"{name}: {int(entry[name])}" for name in entries.dtype.names))
        if preallocated:
            print(f"({preallocated} zero entries follow: preallocated space)")
    if arguments.verify:
        log_path = arguments.path.rsplit(".", 1)[0] + I.LOG_SUFFIX
        report = read_segment(log_path, verify=True, published_end=published_end(log_path))
        for problem in report.problems:
            print(f"PROBLEM: {problem}", file=sys.stdout if not arguments.json else sys.stderr)
        return EXIT_OK if report.ok else EXIT_FAILURE
    return EXIT_OK


def _dump_txn_index(arguments) -> int:
    """The aborted transactions of a ``.txnindex``, as Kafka's DumpLogSegments prints
    them; with ``--verify``, each checked against the log beside it."""
    from ..storage.dump import read_txn_index
    report = read_txn_index(arguments.path, verify=arguments.verify)
    if arguments.json:
        print(json.dumps({"path": report.path, "base_offset": report.base_offset,
                          "file_size": report.file_size,
                          "entries": [{"version": 0, **entry._asdict()}
                                      for entry in report.entries],
                          "problems": report.problems}, indent=2))
    else:
        for entry in report.entries:
            print(f"version: 0 producerId: {entry.producer_id} firstOffset: "
                  f"{entry.first_offset} lastOffset: {entry.last_offset} "
                  f"lastStableOffset: {entry.last_stable_offset}")
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
    return EXIT_OK if report.ok or not arguments.verify else EXIT_FAILURE


def _dump(arguments) -> int:
    """Print (and with --verify check) a segment or index file."""
    from ..storage import index_layout as I
    if not os.path.exists(arguments.path):
        print(f"shmlog dump: no such file: {arguments.path}", file=sys.stderr)
        return EXIT_USAGE
    if arguments.path.endswith((I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX)):
        return _dump_index(arguments)
    if arguments.path.endswith(I.TXN_INDEX_SUFFIX):
        return _dump_txn_index(arguments)
    return _dump_log(arguments)
