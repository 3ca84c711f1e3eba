"""``shmlog produce`` and ``shmlog consume``: the console producer and consumer
(Kafka's kafka-console-producer and kafka-console-consumer).

Lines of stdin (or of files) become records, and records become lines of stdout;
the clients are imported when the verb runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .exit_codes import EXIT_OK

__all__ = ["add_produce_parser", "add_consume_parser"]


def add_produce_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``produce`` subcommand to ``commands`` (an argparse subparsers action)."""
    produce = commands.add_parser("produce", parents=parents,
                                  help="send lines from stdin or files as records")
    produce.add_argument("topic")
    produce.add_argument("files", nargs="*", help="read these instead of stdin")
    produce.add_argument("--data-dir", help="the broker's data directory")
    produce.add_argument("--key-separator", help="split each line into key SEP value")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--acks", choices=["0", "1", "all"], default="1",
                         help="1 (default); all: once every in-sync replica has the record")
    produce.add_argument("--compression", choices=["zstd"])
    produce.add_argument("--quiet", action="store_true", help="no summary on stderr")
    produce.set_defaults(run=_produce)


def add_consume_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``consume`` subcommand to ``commands`` (an argparse subparsers action)."""
    consume = commands.add_parser("consume", parents=parents, help="print records of a topic")
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


def _produce(arguments) -> int:
    """Lines from stdin (or files) become records; ``--key-separator`` splits keys."""
    from ..producer import Producer
    sources = [open(path, "rb") for path in arguments.files] if arguments.files else [sys.stdin.buffer]
    separator = arguments.key_separator.encode() if arguments.key_separator else None
    count = 0
    acks = "all" if arguments.acks == "all" else int(arguments.acks)
    with Producer(arguments.data_dir, acks=acks, compression=arguments.compression) \
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
    from ..consumer import Consumer, TopicPartition
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

