"""``shmlog produce`` and ``shmlog consume``: the console producer and consumer
(Kafka's kafka-console-producer and kafka-console-consumer).

Lines of stdin (or of files) become records, and records become lines of stdout;
the clients are imported when the verb runs, and tqdm only when a terminal shows
its rate line, so ``--help`` and the light verbs start fast.

Rules
-----
* A line becomes a record as Kafka's ``LineMessageReader`` makes one
  (:class:`LineReader`): with ``parse.key`` (``--key-separator``) the line splits at
  the first separator into key and value (a line without it is a value with a null
  key); with ``parse.headers`` (``--parse-headers``) it first splits at
  ``headers.delimiter`` into headers (``k1:v1,k2:v2``) and the rest (Kafka 3.2's
  KIP-798, which Kafka 2.8 lacks: the same property names); ``null.marker`` makes
  a key, value or header value that equals it null. ``--header K=V`` adds a header
  to every record, after the line's own.
* A record becomes a line as Kafka's ``DefaultMessageFormatter`` writes it
  (:class:`RecordFormatter`): the fields asked for (``print.timestamp``,
  ``print.partition``, ``print.offset``, ``print.headers``, ``print.key``,
  ``print.value``) in that order, separated by ``key.separator``, ended by
  ``line.separator``; keys and values are written as the bytes they are.
* ``produce`` keeps at most ``limits.CONSOLE_PRODUCE_UNACKNOWLEDGED_RECORDS_MAX``
  records unacknowledged: past that it waits for the oldest, so memory stays
  bounded however long the input (a future per line, kept until the end, held
  286 MB for a million lines). The first refused record ends it (exit 1), as the
  broker's error says why.
* ``produce`` shows a rate line (records/s, MB/s, totals), refreshed each second,
  only when stderr is a terminal and the input is not (files, or a pipe); it always
  ends with a summary on stderr unless ``--quiet``.
* ``consume`` follows the topic until Ctrl-C (or SIGTERM), as kafka-console-consumer
  does, unless ``--max-messages`` or ``--timeout-ms`` ends it; either way it closes
  the consumer (a group member commits what it printed, then leaves) and says how
  many records it printed, as Kafka's does. It polls for at most the records it may
  still print, so a commit never covers a record it did not print.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import stat
import sys
import time

from ..common import limits
from ..common.errors import LocalProtocolError, ShmlogError
from .exit_codes import EXIT_OK, exit_on_signal
from .signals import StopRequest

__all__ = ["add_produce_parser", "add_consume_parser", "LineReader", "RecordFormatter",
           "READER_PROPERTIES", "FORMATTER_PROPERTIES"]

# Kafka's LineMessageReader properties and their defaults (key.separator and the
# header separators are Kafka's; parse.headers and its three from KIP-798).
READER_PROPERTIES = {"parse.key": "false", "key.separator": "\t", "parse.headers": "false",
                     "headers.delimiter": "\t", "headers.separator": ",",
                     "headers.key.separator": ":", "null.marker": None}
# Kafka 2.8's DefaultMessageFormatter properties and their defaults.
FORMATTER_PROPERTIES = {"print.timestamp": "false", "print.partition": "false",
                        "print.offset": "false", "print.headers": "false",
                        "print.key": "false", "print.value": "true", "key.separator": "\t",
                        "line.separator": "\n", "headers.separator": ",",
                        "null.literal": "null"}
# How often (in records) produce hands its counts to the rate line: tqdm's update is
# a few microseconds, too much per line.
PROGRESS_EVERY_RECORDS = 1024


def _properties(values: list[str], known: dict) -> dict:
    """Kafka's ``--property NAME=VALUE`` pairs over the defaults ``known``."""
    properties = dict(known)
    for value in values:
        name, found, setting = value.partition("=")
        if not found or name not in known:
            raise LocalProtocolError(f"--property {value!r}: expected NAME=VALUE with NAME "
                                     f"one of {', '.join(known)}")
        properties[name] = setting
    return properties


def _true(text: str | None) -> bool:
    return (text or "").strip().lower() == "true"        # Kafka's Boolean.parseBoolean


class LineReader:
    """One input line as a record's ``(key, value, headers)``, by Kafka's
    ``LineMessageReader`` rules (see the module's docstring).

    Parameters
    ----------
    properties : dict
        :data:`READER_PROPERTIES` with values changed (strings, as Kafka's).
    extra_headers : list of (str, bytes)
        Added to every record, after the line's own headers.

    Raises
    ------
    LocalProtocolError
        An empty separator or delimiter.
    """

    def __init__(self, properties: dict, extra_headers: list | None = None):
        self.key_separator = self._separator(properties, "key.separator") \
            if _true(properties["parse.key"]) else None
        self.headers_delimiter = self._separator(properties, "headers.delimiter") \
            if _true(properties["parse.headers"]) else None
        self.headers_separator = self._separator(properties, "headers.separator")
        self.headers_key_separator = self._separator(properties, "headers.key.separator")
        marker = properties["null.marker"]
        self.null_marker = None if marker is None else marker.encode()
        self.extra_headers = list(extra_headers or [])

    @staticmethod
    def _separator(properties: dict, name: str) -> bytes:
        separator = properties[name].encode()
        if not separator:
            raise LocalProtocolError(f"{name} must not be empty")
        return separator

    def read(self, line: bytes) -> tuple[bytes | None, bytes | None, list]:
        """``line`` (without its line end) as ``(key, value, headers)``.

        Raises
        ------
        LocalProtocolError
            ``parse.headers`` is on and the line has no headers delimiter (Kafka's
            reader refuses such a line too).
        """
        headers = []
        if self.headers_delimiter is not None:
            text, found, line = line.partition(self.headers_delimiter)
            if not found:
                raise LocalProtocolError(f"no headers delimiter "
                                         f"{self.headers_delimiter.decode()!r} in line "
                                         f"{text[:80]!r} (--parse-headers)")
            headers = self._headers(text)
        key = None
        if self.key_separator is not None:
            key, found, value = line.partition(self.key_separator)
            if not found:                 # a line without a key: the whole line, keyless
                key, value = None, line
        else:
            value = line
        return self._nullable(key), self._nullable(value), headers + self.extra_headers

    def _headers(self, text: bytes) -> list:
        headers = []
        for entry in text.split(self.headers_separator) if text else []:
            name, found, value = entry.partition(self.headers_key_separator)
            # A header without a value separator has a null value (KIP-798).
            headers.append((name.decode(errors="replace"),
                            self._nullable(value) if found else None))
        return headers

    def _nullable(self, field: bytes | None) -> bytes | None:
        if field is not None and self.null_marker is not None and field == self.null_marker:
            return None
        return field


class RecordFormatter:
    """A record as the bytes of one output line, by Kafka's ``DefaultMessageFormatter``
    rules (see the module's docstring).

    Parameters
    ----------
    properties : dict
        :data:`FORMATTER_PROPERTIES` with values changed (strings, as Kafka's).
    """

    def __init__(self, properties: dict):
        self.fields = [name for name in ("timestamp", "partition", "offset", "headers",
                                         "key", "value") if _true(properties[f"print.{name}"])]
        self.separator = properties["key.separator"].encode()
        self.line_end = properties["line.separator"].encode()
        self.headers_separator = properties["headers.separator"].encode()
        self.null = properties["null.literal"].encode()

    def format(self, record) -> bytes:
        """One line (with its line separator) for a
        :class:`~shmlog.client.consumer.ConsumerRecord`."""
        return self.separator.join([self._field(name, record) for name in self.fields]) \
            + self.line_end

    def _field(self, name: str, record) -> bytes:
        if name == "value":
            return self.null if record.value is None else record.value
        if name == "key":
            return self.null if record.key is None else record.key
        if name == "timestamp":
            if record.timestamp < 0:
                return b"NO_TIMESTAMP"
            kind = "LogAppendTime" if record.timestamp_type else "CreateTime"
            return f"{kind}:{record.timestamp}".encode()
        if name == "partition":
            return b"Partition:%d" % record.partition
        if name == "offset":
            return b"Offset:%d" % record.offset
        if not record.headers:
            return b"NO_HEADERS"
        return self.headers_separator.join(
            name.encode() + b":" + (self.null if value is None else value)
            for name, value in record.headers)


def add_produce_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``produce`` subcommand to ``commands`` (an argparse subparsers action)."""
    produce = commands.add_parser(
        "produce", parents=parents, help="send lines from stdin or files as records",
        description="Send each line of stdin (or of FILEs) as a record, as "
        "kafka-console-producer does. On a terminal, reading files or a pipe, a rate "
        "line shows progress each second.")
    produce.add_argument("topic")
    produce.add_argument("files", nargs="*", metavar="FILE", help="read these instead of stdin")
    produce.add_argument("--data-dir", help="the broker's data directory")
    produce.add_argument("--key-separator",
                         help="split each line into KEY SEP VALUE (Kafka's parse.key and "
                              "key.separator)")
    produce.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                         help="add this header to every record (repeat for more)")
    produce.add_argument("--parse-headers", action="store_true",
                         help="each line starts with headers k1:v1,k2:v2 and a tab "
                              "(Kafka's parse.headers)")
    produce.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                         help=f"a Kafka line reader property: {', '.join(READER_PROPERTIES)}")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--acks", choices=["0", "1", "all"], default="1",
                         help="1 (default); all: once every in-sync replica has the record")
    produce.add_argument("--compression", choices=["zstd"])
    produce.add_argument("--quiet", action="store_true", help="no rate line, no summary")
    produce.set_defaults(run=_produce, check=_check_produce)


def add_consume_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``consume`` subcommand to ``commands`` (an argparse subparsers action)."""
    consume = commands.add_parser(
        "consume", parents=parents, help="print records of a topic",
        description="Print the records of a topic as they come, as kafka-console-consumer "
        "does: until Ctrl-C, --max-messages or --timeout-ms.")
    consume.add_argument("topic")
    consume.add_argument("--data-dir", help="the broker's data directory")
    consume.add_argument("--group", help="consume as a member of this consumer group, "
                                         "committing what was printed")
    consume.add_argument("--partition", type=int, help="only this partition")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the oldest record (with --group: where the group "
                            "has no committed offset)")
    start.add_argument("--offset", type=int, help="start at this offset (every partition)")
    start.add_argument("--from-timestamp-ms", type=int,
                       help="start at the first record at or after this time")
    consume.add_argument("--max-messages", type=int, help="stop after this many")
    consume.add_argument("--timeout-ms", type=int,
                         help="stop after this long without a record (default: follow "
                              "until Ctrl-C)")
    consume.add_argument("--format", choices=["value", "key-value", "json"], default="value",
                         help="key-value is --print-key; json one object per line")
    for name in ("timestamp", "partition", "offset", "headers", "key"):
        consume.add_argument(f"--print-{name}", action="store_true",
                             help=f"Kafka's print.{name}")
    consume.add_argument("--key-separator", help="between the printed fields (default a tab)")
    consume.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                         help=f"a Kafka formatter property: {', '.join(FORMATTER_PROPERTIES)}")
    consume.set_defaults(run=_consume, check=_check_consume)


def _check_produce(parser: argparse.ArgumentParser, arguments) -> None:
    """Usage errors (exit 2): malformed properties and headers, before reading a line."""
    try:
        _line_reader(arguments)
    except LocalProtocolError as error:
        parser.error(str(error))


def _check_consume(parser: argparse.ArgumentParser, arguments) -> None:
    """Usage errors (exit 2): a group member's partitions and start are the group's."""
    if arguments.group is not None and (arguments.partition is not None or
                                        arguments.offset is not None or
                                        arguments.from_timestamp_ms is not None):
        parser.error("--group consumes as a group member: the group assigns the partitions "
                     "and starts at its committed offsets (only --from-beginning applies)")
    for name in ("max_messages", "timeout_ms"):
        if getattr(arguments, name) is not None and getattr(arguments, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    try:
        _formatter(arguments)
    except LocalProtocolError as error:
        parser.error(str(error))


def _line_reader(arguments) -> LineReader:
    properties = _properties(arguments.property, READER_PROPERTIES)
    if arguments.key_separator is not None:
        properties.update({"parse.key": "true", "key.separator": arguments.key_separator})
    if arguments.parse_headers:
        properties["parse.headers"] = "true"
    headers = []
    for header in arguments.header:
        name, found, value = header.partition("=")
        if not found or not name:
            raise LocalProtocolError(f"--header {header!r}: expected KEY=VALUE")
        headers.append((name, value.encode()))
    return LineReader(properties, headers)


def _formatter(arguments) -> RecordFormatter:
    properties = _properties(arguments.property, FORMATTER_PROPERTIES)
    for name in ("timestamp", "partition", "offset", "headers", "key"):
        if getattr(arguments, f"print_{name}"):
            properties[f"print.{name}"] = "true"
    if arguments.format == "key-value":
        properties["print.key"] = "true"
    if arguments.key_separator is not None:
        properties["key.separator"] = arguments.key_separator
    return RecordFormatter(properties)


# -- produce ------------------------------------------------------------------------------

class _RateLine:
    """Records and bytes so far; on a terminal, tqdm's line refreshed each second:
    bytes read (of the files' total when known) in MB and MB/s, records and records/s."""

    def __init__(self, total_bytes: int | None, shown: bool):
        self.records = 0
        self.size = 0
        self.started = time.monotonic()
        self._bar = None
        if shown:
            from tqdm import tqdm  # only here: it costs the light verbs' start-up
            # The terminal's size, given: tqdm hides a bar below the last row, and takes
            # a terminal that reports 0 rows (a new pseudo-terminal, an editor's shell)
            # for one whose rows are all below it.
            size = os.get_terminal_size(sys.stderr.fileno())
            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, mininterval=1.0,
                             file=sys.stderr, ncols=size.columns or None,
                             nrows=max(size.lines, limits.CONSOLE_TERMINAL_ROWS_MIN), leave=False)
        self._unreported = 0

    def advance(self, size: int) -> None:
        """One record of ``size`` bytes (its line) is sent."""
        self.records += 1
        self.size += size
        self._unreported += size
        if self._bar is not None and self.records % PROGRESS_EVERY_RECORDS == 0:
            self._report()

    def _report(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self._bar.set_postfix_str(f"{self.records:,} records, "
                                  f"{self.records / elapsed:,.0f} records/s", refresh=False)
        self._bar.update(self._unreported)
        self._unreported = 0

    def close(self) -> None:
        if self._bar is not None:
            self._report()
            self._bar.refresh()            # the last figures, however short the run
            self._bar.close()

    def summary(self, topic: str) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        megabytes = self.size / 1e6
        return (f"produced {self.records} records ({megabytes:.1f} MB) to {topic} in "
                f"{elapsed:.1f} s: {self.records / elapsed:,.0f} records/s, "
                f"{megabytes / elapsed:.1f} MB/s")


def _lines(sources):
    """Each line of each source, without its line end (``\\n`` or ``\\r\\n``, as Java's
    readLine), and its size with it."""
    for source in sources:
        for line in source:
            size = len(line)
            if line.endswith(b"\n"):
                line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            yield line, size


def _total_size(sources) -> int | None:
    """The bytes the sources hold, when all are regular files; else None."""
    total = 0
    for source in sources:
        status = os.fstat(source.fileno())
        if not stat.S_ISREG(status.st_mode):
            return None
        total += status.st_size
    return total


def _produce(arguments) -> int:
    """Lines from stdin (or files) become records; a bounded window of their futures
    is waited on oldest first. Ctrl-C (or SIGTERM) stops the reading: what was sent
    is flushed (for at most ``limits.CONSOLE_PRODUCE_STOP_FLUSH_S``), the summary
    says how many records the broker acknowledged, and the exit status is 128 + the
    signal's number."""
    with StopRequest() as stop:      # before the clients load: a signal is never lost
        from ..client.producer import Producer
        reader = _line_reader(arguments)
        sources = [sys.stdin.buffer] if not arguments.files else []
        try:
            for path in arguments.files:
                try:
                    sources.append(open(path, "rb"))
                except OSError as error:
                    raise ShmlogError(f"cannot read {path}: {error.strerror}") from None
            shown = not arguments.quiet and sys.stderr.isatty() and \
                not (not arguments.files and sys.stdin.isatty())
            acks = "all" if arguments.acks == "all" else int(arguments.acks)
            producer = Producer(arguments.data_dir, acks=acks,
                                compression=arguments.compression)
            # Timed from here: the rates are the sending's, not the start-up's.
            progress = _RateLine(_total_size(sources) if arguments.files else None, shown)
            try:
                acknowledged = _send_lines(producer, reader, sources, arguments, progress,
                                           stop)
            finally:
                progress.close()
                producer.close(timeout=limits.CONSOLE_PRODUCE_STOP_FLUSH_S
                               if stop.number else None)
        finally:
            for source in sources:
                if source is not sys.stdin.buffer:
                    source.close()
    if not arguments.quiet:
        print(progress.summary(arguments.topic), file=sys.stderr)
        if stop.number:
            print(f"stopped by {signal.Signals(stop.number).name}: {acknowledged} records "
                  f"acknowledged", file=sys.stderr)
    return exit_on_signal(stop.number) if stop.number else EXIT_OK


def _next_line(lines, stop: StopRequest):
    """The next ``(line, size)``, or None at the end of the input or on a stop
    signal, which may cut the wait for it short (and only that wait)."""
    try:
        try:
            stop.raising = True
            return None if stop.number else next(lines)
        finally:
            stop.raising = False        # a signal just before this raises once, below
    except (KeyboardInterrupt, StopIteration):
        return None


def _send_lines(producer, reader: LineReader, sources, arguments, progress: _RateLine,
                stop: StopRequest) -> int:
    """Send every line (until a stop signal); the records acknowledged.

    The wait for the next line is the only place a signal raises
    (``stop.raising``): a line half read is not sent. Stopped, what was sent is
    flushed (bounded) and the futures done by then are counted."""
    window_max = limits.CONSOLE_PRODUCE_UNACKNOWLEDGED_RECORDS_MAX
    unacknowledged = collections.deque()
    acknowledged = 0
    lines = _lines(sources)
    while (read := _next_line(lines, stop)) is not None:
        line, size = read
        key, value, headers = reader.read(line)
        unacknowledged.append(producer.send(arguments.topic, value, key=key, headers=headers,
                                            partition=arguments.partition))
        if len(unacknowledged) > window_max:
            unacknowledged.popleft().get()      # raises the broker's refusal
            acknowledged += 1
        progress.advance(size)
    if not stop.number:
        producer.flush()
        while unacknowledged:
            unacknowledged.popleft().get()
            acknowledged += 1
        return acknowledged
    try:
        producer.flush(timeout=limits.CONSOLE_PRODUCE_STOP_FLUSH_S)
    except ShmlogError:
        pass                            # what did not make it is not counted
    return acknowledged + sum(future.succeeded() for future in unacknowledged)


# -- consume ------------------------------------------------------------------------------

def _start(consumer, arguments) -> None:
    """Subscribe (or assign one partition), and move to the start asked for."""
    from ..client.consumer import TopicPartition
    if arguments.partition is not None:
        consumer.assign([TopicPartition(arguments.topic, arguments.partition)])
    else:
        consumer.subscribe([arguments.topic])
    if arguments.group is not None:
        return                          # the group's committed offsets, or the reset
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


def _consume(arguments) -> int:
    """Print records until Ctrl-C (or SIGTERM: exit 128 + its number, after the
    records in hand are printed, so a group's commit covers exactly what was
    printed), ``--max-messages`` or ``--timeout-ms``."""
    with StopRequest() as stop:      # before the clients load: a signal is never lost
        shown = _follow(arguments, stop)
    print(f"Processed a total of {shown} messages", file=sys.stderr)
    return exit_on_signal(stop.number) if stop.number else EXIT_OK


def _follow(arguments, stop: StopRequest) -> int:
    """The records printed, polling until a stop signal or a limit."""
    from ..client.consumer import Consumer
    reset = "earliest" if arguments.from_beginning else "latest"
    formatter = _formatter(arguments)
    write = _json_line if arguments.format == "json" else formatter.format
    output = sys.stdout.buffer
    shown = 0
    with Consumer(bootstrap=arguments.data_dir, auto_offset_reset=reset,
                  group_id=arguments.group) as consumer:
        _start(consumer, arguments)
        last_record = time.monotonic()
        while not stop.number and (arguments.max_messages is None
                                   or shown < arguments.max_messages):
            left = None if arguments.max_messages is None else arguments.max_messages - shown
            batch = consumer.poll(timeout_ms=limits.CONSOLE_CONSUME_POLL_MS, max_records=left)
            if not batch:
                if arguments.timeout_ms is not None and \
                        time.monotonic() - last_record >= arguments.timeout_ms / 1000:
                    break
                continue
            lines = [write(record) for records in batch.values() for record in records]
            output.write(b"".join(lines))
            output.flush()
            shown += len(lines)
            last_record = time.monotonic()
    return shown


def _json_line(record) -> bytes:
    """One JSON object per record; bytes are decoded as UTF-8 (bad bytes replaced)."""
    def text(field):
        return None if field is None else field.decode(errors="replace")
    return json.dumps({"topic": record.topic, "partition": record.partition,
                       "offset": record.offset, "timestamp": record.timestamp,
                       "key": text(record.key), "value": text(record.value),
                       "headers": {name: text(value) for name, value in record.headers}}
                      ).encode() + b"\n"
