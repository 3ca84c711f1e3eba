"""The ``shmlog`` command. Each subcommand parses its arguments and calls the library.

Exit codes: 0 ok, 1 a problem was found (corruption, a failed request), 2 usage error.

A verb imports what it needs when it runs: the ones that only ask the broker
something (``topics``, ``groups``) load neither numba nor numpy, and start in a
tenth of a second instead of a second. Only light modules (``errors``, ``limits``,
``broker_config``) are imported here at the top.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

from . import limits
from .broker_config import BrokerConfig
from .errors import LocalProtocolError, ShmlogError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _printable(data: bytes | None, limit: int) -> str:
    if data is None:
        return "null"
    text = data[:limit].decode("utf-8", errors="backslashreplace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + ("..." if len(data) > limit else "")


def _dump_log(arguments) -> int:
    from .dump import read_segment
    report = read_segment(arguments.path, with_records=arguments.records or arguments.print_data,
                          verify=arguments.verify)
    if arguments.json:
        body = {"path": report.path, "base_offset": report.base_offset,
                "file_size": report.file_size, "data_end": report.data_end,
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
                  f"baseSequence: {info.base_sequence} isControl: {info.is_control} "
                  f"crc: {info.crc} isValid: true")
            if report.records:
                for record in report.records[number].records():
                    line = (f"| offset: {record.offset} timestamp: {record.timestamp} "
                            f"keySize: {-1 if record.key is None else len(record.key)} "
                            f"valueSize: {-1 if record.value is None else len(record.value)} "
                            f"headers: {[name for name, _ in record.headers]}")
                    if arguments.print_data:
                        line += (f" key: {_printable(record.key, arguments.max_bytes)} "
                                 f"payload: {_printable(record.value, arguments.max_bytes)}")
                    print(line)
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
        if arguments.verify:
            verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
            print(f"Verified {len(report.batches)} batches, {report.data_end} bytes: {verdict}")
    return EXIT_OK if report.ok or not arguments.verify else EXIT_FAILURE


def _dump_index(arguments) -> int:
    from . import index_layout as I
    from .dump import read_index, read_segment, used_entries
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
        report = read_segment(arguments.path.rsplit(".", 1)[0] + I.LOG_SUFFIX, verify=True)
        for problem in report.problems:
            print(f"PROBLEM: {problem}", file=sys.stdout if not arguments.json else sys.stderr)
        return EXIT_OK if report.ok else EXIT_FAILURE
    return EXIT_OK


def _dump(arguments) -> int:
    """Print (and with --verify check) a segment or index file."""
    from . import index_layout as I
    if not os.path.exists(arguments.path):
        print(f"shmlog dump: no such file: {arguments.path}", file=sys.stderr)
        return EXIT_USAGE
    if arguments.path.endswith((I.OFFSET_INDEX_SUFFIX, I.TIME_INDEX_SUFFIX)):
        return _dump_index(arguments)
    return _dump_log(arguments)


def _broker(arguments) -> int:
    """Run a broker in the foreground until SIGTERM or SIGINT."""
    from .broker import serve
    settings = {field.name: getattr(arguments, field.name)
                for field in dataclasses.fields(BrokerConfig)}
    serve(BrokerConfig.load(arguments.config, **settings))
    return EXIT_OK


def _topics(arguments) -> int:
    from .admin import Admin
    admin = Admin(arguments.data_dir)
    action = arguments.action
    if action == "list":
        result: object = admin.list_topics()
    elif action == "create":
        result = admin.create_topic(arguments.topic, arguments.partitions,
                                    _key_values(arguments.config))
    elif action == "describe":
        result = admin.describe_topic(arguments.topic)
    elif action == "alter":
        result = admin.alter_topic_config(arguments.topic, _key_values(arguments.config),
                                          arguments.delete_config)
        if arguments.partitions:
            result = admin.add_partitions(arguments.topic, arguments.partitions)
    else:
        admin.delete_topic(arguments.topic)
        result = {"deleted": arguments.topic}
    if arguments.json:
        print(json.dumps(result, indent=2))
    elif action == "list":
        print("\n".join(result))
    elif action == "delete":
        print(f"deleted topic {arguments.topic}")
    else:
        print(f"Topic: {result['name']}  TopicId: {result['topic_id']}  "
              f"PartitionCount: {len(result['partitions'])}")
        overrides = {key: value for key, value in result["config"].items()}
        print("Configs: " + ", ".join(f"{key}={value}" for key, value in sorted(overrides.items())))
    return EXIT_OK


def _groups(arguments) -> int:
    """Kafka's kafka-consumer-groups: list, describe (with lag), reset-offsets
    (a dry run unless --execute), delete."""
    from .admin import Admin
    admin = Admin(arguments.data_dir)
    action = arguments.action
    if action == "list":
        result: object = admin.list_consumer_groups()
        lines = [f"{group['group_id']}  {group['state']}  members={group['members']}"
                 for group in result]
    elif action == "describe":
        result = admin.describe_consumer_group(arguments.group)
        clients = {member["member_id"]: member["client_id"] for member in result["members"]}
        rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                 "CLIENT-ID")]
        rows += [(entry["topic"], entry["partition"], _dash(entry["committed"]),
                  _dash(entry["log_end_offset"]), _dash(entry["lag"]),
                  _dash(entry["member_id"]), _dash(clients.get(entry["member_id"])))
                 for entry in result["partitions"]]
        lines = [f"Group {result['group_id']}: {result['state']}, generation "
                 f"{result['generation']}, assignor {result['protocol'] or '-'}, "
                 f"{len(result['members'])} members", *_table(rows)]
    elif action == "reset-offsets":
        to, value = _reset_target(arguments)
        topics = arguments.topic or sorted({topic for topic, _ in
                                            admin.list_consumer_group_offsets(arguments.group)})
        if not topics:
            print(f"shmlog groups: group {arguments.group!r} has no committed offsets; name "
                  f"the topics with --topic", file=sys.stderr)
            return EXIT_USAGE
        plan = admin.plan_offset_reset(arguments.group, topics, to=to, value=value)
        if arguments.execute:
            admin.alter_consumer_group_offsets(arguments.group, {
                (entry["topic"], entry["partition"]): entry["new"] for entry in plan})
        result = {"executed": arguments.execute, "offsets": plan}
        rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET")]
        rows += [(entry["topic"], entry["partition"], _dash(entry["current"]), entry["new"])
                 for entry in plan]
        lines = [*_table(rows), "offsets reset" if arguments.execute else
                 "dry run: nothing changed (add --execute to apply)"]
    else:
        admin.delete_consumer_group(arguments.group)
        result = {"deleted": arguments.group}
        lines = [f"deleted group {arguments.group}"]
    print(json.dumps(result, indent=2) if arguments.json else "\n".join(lines))
    return EXIT_OK


def _reset_target(arguments) -> tuple[str, int | None]:
    for name, value in (("earliest", arguments.to_earliest), ("latest", arguments.to_latest)):
        if value:
            return name, None
    for name, value in (("offset", arguments.to_offset),
                        ("timestamp", arguments.to_timestamp_ms), ("shift", arguments.shift_by)):
        if value is not None:
            return name, value
    raise LocalProtocolError("reset-offsets needs one of --to-earliest, --to-latest, "
                             "--to-offset, --to-timestamp-ms, --shift-by")


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def _produce(arguments) -> int:
    """Lines from stdin (or files) become records; ``--key-separator`` splits keys."""
    from .producer import Producer
    sources = [open(path, "rb") for path in arguments.files] if arguments.files else [sys.stdin.buffer]
    separator = arguments.key_separator.encode() if arguments.key_separator else None
    count = 0
    with Producer(arguments.data_dir, acks=arguments.acks, compression=arguments.compression) \
            as producer:
        futures = []
        for source in sources:
            for line in source:
                line = line.rstrip(b"\n")
                key = None
                if separator is not None:
                    key, found, value = line.partition(separator)
                    if not found:
                        key, value = None, line
                else:
                    value = line
                futures.append(producer.send(arguments.topic, value, key=key,
                                             partition=arguments.partition))
                count += 1
        producer.flush()
        for future in futures:
            future.get()
    if not arguments.quiet:
        print(f"produced {count} records to {arguments.topic}", file=sys.stderr)
    return EXIT_OK


def _consume(arguments) -> int:
    """Print records from the beginning, an offset or a timestamp, up to a count."""
    from .consumer import Consumer, TopicPartition
    reset = "earliest" if arguments.from_beginning else "latest"
    shown = 0
    with Consumer(bootstrap=arguments.data_dir, auto_offset_reset=reset) as consumer:
        partitions = ([TopicPartition(arguments.topic, arguments.partition)]
                      if arguments.partition is not None else None)
        if partitions:
            consumer.assign(partitions)
        else:
            consumer.subscribe([arguments.topic])
        assigned = sorted(consumer.assignment())
        if arguments.offset is not None:
            for partition in assigned:
                consumer.seek(partition, arguments.offset)
        if arguments.from_timestamp_ms is not None:
            found = consumer.offsets_for_times({p: arguments.from_timestamp_ms for p in assigned})
            for partition, position in found.items():
                if position is None:
                    consumer.seek_to_end(partition)
                else:
                    consumer.seek(partition, position.offset)
        deadline = time.monotonic() + arguments.timeout_ms / 1000
        while arguments.max_messages is None or shown < arguments.max_messages:
            batch = consumer.poll(timeout_ms=100)
            if not batch and time.monotonic() > deadline:
                break
            for records in batch.values():
                for record in records:
                    if arguments.max_messages is not None and shown >= arguments.max_messages:
                        break
                    print(_format_record(record, arguments.format), flush=True)
                    shown += 1
            if batch:
                deadline = time.monotonic() + arguments.timeout_ms / 1000
    return EXIT_OK


def _format_record(record, style: str) -> str:
    if style == "json":
        return json.dumps({"topic": record.topic, "partition": record.partition,
                           "offset": record.offset, "timestamp": record.timestamp,
                           "key": None if record.key is None else record.key.decode(errors="replace"),
                           "value": None if record.value is None
                           else record.value.decode(errors="replace"),
                           "headers": {name: None if value is None
                                       else value.decode(errors="replace")
                                       for name, value in record.headers}})
    value = "null" if record.value is None else record.value.decode(errors="backslashreplace")
    if style == "key-value":
        key = "null" if record.key is None else record.key.decode(errors="backslashreplace")
        return f"{key}\t{value}"
    return value


def _perf(arguments) -> int:
    """Kafka-style perf tools against a running broker."""
    from . import perf

    def progress(done: int, elapsed: float) -> None:
        print(f"  {done:,} records in {elapsed:.1f} s ({done / elapsed:,.0f}/s)",
              file=sys.stderr, flush=True)

    if arguments.mode == "produce":
        result = perf.produce(arguments.data_dir, arguments.topic, arguments.records,
                              arguments.record_size, batch_records=arguments.batch_records,
                              acks=arguments.acks, progress=progress)
    elif arguments.mode == "consume":
        result = perf.consume(arguments.data_dir, arguments.topic, arguments.records,
                              batch=arguments.batch, timeout_ms=arguments.timeout_ms,
                              progress=progress)
    else:
        result = perf.end_to_end(arguments.data_dir, arguments.topic, arguments.rate,
                                 arguments.seconds, arguments.record_size)
    if arguments.json:
        print(json.dumps(result, indent=2))
    elif arguments.mode == "e2e":
        print(f"{result['records']:,} records at {result['rate']:,}/s: latency p50 "
              f"{result['p50_us']:.1f} us, p99 {result['p99_us']:.1f} us, p99.9 "
              f"{result['p999_us']:.1f} us, max {result['max_us']:.1f} us")
    else:
        print(f"{result['records']:,} records in {result['seconds']:.2f} s: "
              f"{result['records_per_s']:,.0f} records/s, {result['bytes_per_s'] / 1e6:,.1f} MB/s")
    return EXIT_OK


def _key_values(pairs: list[str] | None) -> dict:
    values = {}
    for pair in pairs or []:
        key, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"shmlog topics: --config takes key=value, got {pair!r}")
        values[key] = value
    return values


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
# A broker says when it serves and when it stops, as Kafka's does at INFO; the
# client commands print only their results.
LOG_LEVEL_BROKER = "INFO"
LOG_LEVEL_CLIENT = "WARNING"


def _common_options(default) -> argparse.ArgumentParser:
    """The options every subcommand takes, before or after its name. The subcommands'
    copy has no default (SUPPRESS), so it never overwrites a value given before."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", choices=LOG_LEVELS, default=default,
                        help=f"default {LOG_LEVEL_BROKER} for the broker, "
                             f"{LOG_LEVEL_CLIENT} for the other commands")
    return common


def log_level(arguments: argparse.Namespace) -> str:
    """The level asked for, or the command's default."""
    if arguments.log_level:
        return arguments.log_level
    return LOG_LEVEL_BROKER if arguments.command == "broker" else LOG_LEVEL_CLIENT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shmlog", description=__doc__.splitlines()[0],
                                     parents=[_common_options(None)])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = [_common_options(argparse.SUPPRESS)]

    dump = commands.add_parser("dump", parents=common,
                               help="print and verify a segment (.log) or index file",
                               description="Print the batches of a segment file, or the "
                               "entries of an .index/.timeindex file.")
    dump.add_argument("path", help="a <base offset>.log, .index or .timeindex file")
    dump.add_argument("--verify", action="store_true",
                      help="check every CRC and both indexes; exit 1 on any problem")
    dump.add_argument("--records", action="store_true", help="list every record")
    dump.add_argument("--print-data", action="store_true",
                      help="with each record, print its key and value")
    dump.add_argument("--max-bytes", type=int, default=80,
                      help="print at most this many bytes of a key or value (default 80)")
    dump.add_argument("--json", action="store_true", help="machine-readable output")
    dump.set_defaults(run=_dump)

    broker = commands.add_parser("broker", parents=common,
                                 help="run a broker (no config file needed)",
                                 description="Run a broker in the foreground; SIGTERM or "
                                 "Ctrl-C stops it gracefully.")
    broker.add_argument("--config", help="a TOML file of broker settings")
    broker.add_argument("--data-dir", help="default: $SHMLOG_DATA_DIR or ~/.local/share/shmlog")
    for field in dataclasses.fields(BrokerConfig):
        if field.name != "data_dir":
            broker.add_argument(f"--{field.name.replace('_', '-')}",
                                type=str if field.name in BrokerConfig.TEXT_SETTINGS else int,
                                help=f"default {field.default}")
    broker.set_defaults(run=_broker)

    topics = commands.add_parser("topics", parents=common,
                                 help="create, list, describe, alter, delete topics")
    topics.add_argument("action", choices=["create", "list", "describe", "alter", "delete"])
    topics.add_argument("topic", nargs="?", help="the topic (all actions but list)")
    topics.add_argument("--data-dir", help="the broker's data directory")
    topics.add_argument("--partitions", type=int, default=None,
                        help="partition count (create; alter: the new, larger count)")
    topics.add_argument("--config", action="append", metavar="KEY=VALUE",
                        help="a topic config, Kafka's names (repeatable)")
    topics.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                        help="remove a config override (alter; repeatable)")
    topics.add_argument("--json", action="store_true", help="machine-readable output")
    topics.set_defaults(run=_topics)

    groups = commands.add_parser("groups", parents=common,
                                 help="list, describe, reset offsets of, delete "
                                 "consumer groups")
    groups.add_argument("action", choices=["list", "describe", "reset-offsets", "delete"])
    groups.add_argument("group", nargs="?", help="the group (all actions but list)")
    groups.add_argument("--data-dir", help="the broker's data directory")
    groups.add_argument("--topic", action="append",
                        help="reset-offsets: this topic (repeatable; default: every topic the "
                             "group committed offsets for)")
    target = groups.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int)
    target.add_argument("--to-timestamp-ms", type=int,
                        help="the first offset at or after this time")
    target.add_argument("--shift-by", type=int, help="move the committed offsets by this many")
    groups.add_argument("--execute", action="store_true",
                        help="reset-offsets: apply the plan (the default is a dry run)")
    groups.add_argument("--json", action="store_true", help="machine-readable output")
    groups.set_defaults(run=_groups)

    produce = commands.add_parser("produce", parents=common,
                                  help="send lines from stdin or files as records")
    produce.add_argument("topic")
    produce.add_argument("files", nargs="*", help="read these instead of stdin")
    produce.add_argument("--data-dir", help="the broker's data directory")
    produce.add_argument("--key-separator", help="split each line into key SEP value")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--acks", type=int, choices=[0, 1], default=1)
    produce.add_argument("--compression", choices=["zstd"])
    produce.add_argument("--quiet", action="store_true", help="no summary on stderr")
    produce.set_defaults(run=_produce)

    consume = commands.add_parser("consume", parents=common, help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument("--data-dir", help="the broker's data directory")
    consume.add_argument("--partition", type=int, help="only this partition")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", type=int, help="start at this offset (every partition)")
    start.add_argument("--from-timestamp-ms", type=int,
                       help="start at the first record at or after this time")
    consume.add_argument("--max-messages", type=int, help="stop after this many")
    consume.add_argument("--timeout-ms", type=int, default=1000,
                         help="stop after this long without a record (default 1000)")
    consume.add_argument("--format", choices=["value", "key-value", "json"], default="value")
    consume.set_defaults(run=_consume)

    perf = commands.add_parser("perf", parents=common,
                               help="throughput and latency tools (need a broker)")
    perf.add_argument("mode", choices=["produce", "consume", "e2e"])
    perf.add_argument("topic", help="partition 0 of this topic is used")
    perf.add_argument("--data-dir", help="the broker's data directory")
    perf.add_argument("--records", type=int, default=1_000_000)
    perf.add_argument("--record-size", type=int, default=100, help="bytes per value")
    perf.add_argument("--batch-records", type=int, default=0,
                      help="produce with send_batch of this many rows (0: one send each)")
    perf.add_argument("--acks", type=int, choices=[0, 1], default=1)
    perf.add_argument("--batch", action="store_true", help="consume with poll_batch")
    perf.add_argument("--timeout-ms", type=int, default=limits.PERF_IDLE_TIMEOUT_MS,
                      help="consume: stop after this long without a record (default "
                           f"{limits.PERF_IDLE_TIMEOUT_MS}, as Kafka's consumer perf test)")
    perf.add_argument("--rate", type=int, default=10_000, help="e2e: records per second")
    perf.add_argument("--seconds", type=float, default=5.0, help="e2e: how long")
    perf.add_argument("--json", action="store_true")
    perf.set_defaults(run=_perf)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command == "topics" and arguments.action != "list" and not arguments.topic:
        parser.error(f"topics {arguments.action} needs a topic name")
    if arguments.command == "groups" and arguments.action != "list" and not arguments.group:
        parser.error(f"groups {arguments.action} needs a group id")
    if arguments.command == "topics" and arguments.action == "create" \
            and arguments.partitions is None:
        arguments.partitions = 1
    logging.basicConfig(level=log_level(arguments),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return arguments.run(arguments)
    except ShmlogError as error:
        print(f"shmlog {arguments.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
