"""The console tools' line formats: a line becomes a record as Kafka's
``LineMessageReader`` makes one, and a record becomes a line as Kafka's
``DefaultMessageFormatter`` writes it; bad properties are usage errors (exit 2).

Method: table-style, one Kafka rule per case, on :class:`LineReader` and
:class:`RecordFormatter` with plain bytes (no broker); the usage errors through
``cli.main`` in-process, before any client is made.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from shmlog import cli
from shmlog.cli.console import FORMATTER_PROPERTIES, READER_PROPERTIES, LineReader, RecordFormatter
from shmlog.client.consumer import ConsumerRecord
from shmlog.common.errors import LocalProtocolError


def reader(extra_headers=None, **properties):
    return LineReader({**READER_PROPERTIES, **{name.replace("_", "."): value
                                               for name, value in properties.items()}},
                      extra_headers)


# LineMessageReader.readMessage (Kafka 2.8; headers from KIP-798, Kafka 3.2).
READS = {
    "the whole line is the value": (reader(), b"a\tb", (None, b"a\tb", [])),
    "parse.key splits at the first separator": (
        reader(parse_key="true", key_separator=":"), b"k:v:w", (b"k", b"v:w", [])),
    "parse.key: tab by default": (reader(parse_key="true"), b"k\tv", (b"k", b"v", [])),
    "a line without the separator is a keyless value": (
        reader(parse_key="true", key_separator=":"), b"plain", (None, b"plain", [])),
    "parse.headers: headers, tab, then the rest": (
        reader(parse_headers="true"), b"h1:a,h2:b\tvalue",
        (None, b"value", [("h1", b"a"), ("h2", b"b")])),
    "parse.headers with parse.key": (
        reader(parse_headers="true", parse_key="true", key_separator="="),
        b"h:1\tk=v", (b"k", b"v", [("h", b"1")])),
    "an empty headers part is no headers": (
        reader(parse_headers="true"), b"\tvalue", (None, b"value", [])),
    "a header without its key separator has a null value": (
        reader(parse_headers="true"), b"flag\tvalue", (None, b"value", [("flag", None)])),
    "a header value splits at its first key separator": (
        reader(parse_headers="true"), b"url:http://x\tv", (None, b"v", [("url", b"http://x")])),
    "other separators": (
        reader(parse_headers="true", headers_delimiter="|", headers_separator=";",
               headers_key_separator="="), b"a=1;b=2|v", (None, b"v", [("a", b"1"), ("b", b"2")])),
    "null.marker makes a key, a value or a header value null": (
        reader(parse_headers="true", parse_key="true", null_marker="NULL"),
        b"h:NULL\tNULL\tNULL", (None, None, [("h", None)])),
    "--header adds to every record, after the line's own": (
        reader([("source", b"cli")], parse_headers="true"), b"h:1\tv",
        (None, b"v", [("h", b"1"), ("source", b"cli")])),
}


@pytest.mark.parametrize("line_reader, line, expected", READS.values(), ids=READS.keys())
def test_line_reader(line_reader, line, expected):
    assert line_reader.read(line) == expected


def test_a_line_without_the_headers_delimiter_is_refused():
    with pytest.raises(LocalProtocolError, match="no headers delimiter"):
        reader(parse_headers="true").read(b"no delimiter here")


def record(key=b"k", value=b"v", headers=(), timestamp=1700, timestamp_type=0):
    return ConsumerRecord("t", 3, 42, timestamp, timestamp_type, key, value, list(headers))


def formatter(**properties):
    return RecordFormatter({**FORMATTER_PROPERTIES, **{name.replace("_", "."): value
                                                       for name, value in properties.items()}})


# DefaultMessageFormatter.writeTo (Kafka 2.8, with KIP-431's print.partition,
# print.offset, print.headers, headers.separator and null.literal).
FORMATS = {
    "the value alone by default": (formatter(), record(), b"v\n"),
    "print.key: key, separator, value": (formatter(print_key="true"), record(), b"k\tv\n"),
    "a null key or value is null.literal": (
        formatter(print_key="true", null_literal="-"), record(key=None, value=None), b"-\t-\n"),
    "key.separator and line.separator": (
        formatter(print_key="true", key_separator=" => ", line_separator="\r\n"),
        record(), b"k => v\r\n"),
    "every field, in Kafka's order": (
        formatter(print_timestamp="true", print_partition="true", print_offset="true",
                  print_headers="true", print_key="true"),
        record(headers=[("a", b"1"), ("b", None)]),
        b"CreateTime:1700\tPartition:3\tOffset:42\ta:1,b:null\tk\tv\n"),
    "LogAppendTime": (formatter(print_timestamp="true"), record(timestamp_type=1),
                      b"LogAppendTime:1700\tv\n"),
    "no timestamp": (formatter(print_timestamp="true"), record(timestamp=-1),
                     b"NO_TIMESTAMP\tv\n"),
    "no headers": (formatter(print_headers="true"), record(), b"NO_HEADERS\tv\n"),
    "headers.separator": (formatter(print_headers="true", headers_separator="|"),
                          record(headers=[("a", b"1"), ("b", b"2")]), b"a:1|b:2\tv\n"),
    "print.value=false ends the line after the last field": (
        formatter(print_key="true", print_value="false"), record(), b"k\n"),
    "bytes are written as they are": (formatter(), record(value=b"\xff\x00"), b"\xff\x00\n"),
}


@pytest.mark.parametrize("record_formatter, message, expected", FORMATS.values(),
                         ids=FORMATS.keys())
def test_record_formatter(record_formatter, message, expected):
    assert record_formatter.format(message) == expected


@pytest.mark.parametrize("arguments", [
    ["produce", "t", "--property", "no.such=1"],
    ["produce", "t", "--property", "parse.key"],
    ["produce", "t", "--header", "novalue"],
    ["produce", "t", "--key-separator", ""],
    ["consume", "t", "--property", "print.everything=true"],
    ["consume", "t", "--group", "g", "--partition", "0"],
    ["consume", "t", "--group", "g", "--offset", "5"],
    ["consume", "t", "--max-messages", "-1"],
], ids=lambda arguments: " ".join(arguments))
def test_usage_errors_exit_2_before_any_client_is_made(arguments, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(arguments)
    assert exit_.value.code == 2
    assert "shmlog: error:" in capsys.readouterr().err


def test_the_command_loads_tqdm_only_when_a_terminal_shows_a_rate_line():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from shmlog import cli; cli.build_parser(); "
                               "print('tqdm' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "False"


def test_a_file_that_cannot_be_read_is_a_failure_before_any_client_is_made(tmp_path, capsys):
    assert cli.main(["produce", "t", str(tmp_path / "missing.txt"),
                     "--data-dir", str(tmp_path / "no-broker")]) == 1
    assert "cannot read" in capsys.readouterr().err
