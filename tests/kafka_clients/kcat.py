"""kcat (librdkafka's command-line client, Debian's package), one child process per
run: ``-P`` produces, ``-C`` consumes (``-G`` in a group), ``-L -J`` lists.

Rules
-----
* **Bytes, not lines.** Records go in on stdin split by delimiters kcat is given
  (``-D``, ``-K``) that occur in no key or value (else ValueError); records come
  out in a format with lengths (``%K %S``) so keys and values are read by length,
  whatever bytes they hold.
* **What kcat cannot say is refused, not faked**: a run takes one partition and
  one set of headers, so records are sent in runs of consecutive records that
  share them (order kept within a partition); kcat skips empty messages, cannot
  send a null value or set a timestamp (ValueError), and prints headers as
  ``n=v`` CSV, so a header must be text without ``,``, ``=`` or a line break.
* kcat reports no offsets: a delivered record's offset is ``None``; when a run
  fails (exit code not 0) each of its records carries kcat's stderr as the error.
* A group's members (:func:`group`) are ``kcat -G`` processes committing with
  librdkafka's auto-commit (every 100 ms, and at close), printing unbuffered (``-u``:
  the caller reads the output while they run), ended with SIGTERM (kcat then leaves
  its group).
"""

from __future__ import annotations

import json
import shutil

from . import (
    ClusterMetadata,
    Consumed,
    Delivery,
    check_consume_arguments,
    check_group_arguments,
    check_produce_arguments,
)
from .members import ChildMembers, Members
from .processes import run_bounded

NAME = "kcat"
CAN = frozenset({"idempotence", "assign", "groups"})
ASSIGNORS = frozenset({"range", "roundrobin", "cooperative-sticky"})
# Between records and between key and value on kcat's stdin (kcat's -D / -K escapes).
RECORD_DELIMITER = b"\x1e\x1d\x1e"
KEY_DELIMITER = b"\x1f\x1d\x1f"
# Each consumed record: a line of numbers, then key and value (by length), headers.
CONSUME_FORMAT = "%p %o %T %K %S\\n%k%s%h\\n"


def executable() -> str | None:
    return shutil.which("kcat") or shutil.which("kafkacat")


def missing() -> str | None:
    if executable() is None:
        return ("kcat is not installed (make test installs Debian's kcat package when "
                "run as root with apt-get)")
    return None


def escaped(delimiter: bytes) -> str:
    return "".join(f"\\x{byte:02x}" for byte in delimiter)


def check_record(record) -> None:
    if not record.value:
        raise ValueError("kcat skips an empty message and cannot send a null value")
    for part in (record.key or b"", record.value):
        if RECORD_DELIMITER in part or KEY_DELIMITER in part:
            raise ValueError("a key or value holds kcat's delimiters: kcat cannot send it")
    for name, value in record.headers:
        if any(mark in f"{name}{value.decode()}" for mark in ",=\n"):
            raise ValueError(f"header {name!r}: kcat prints headers as n=v CSV, so no "
                             "',', '=' or line break")


def runs(records):
    """Consecutive records sharing (partition, headers, whether keyed): one kcat run each."""
    group, shape = [], None
    for index, record in enumerate(records):
        this = (record.partition, record.headers, record.key is None)
        if group and this != shape:
            yield shape, group
            group = []
        shape = this
        group.append(index)
    if group:
        yield shape, group


def produce(bootstrap: str, topic: str, records, *, acks: str = "all",
            idempotence: bool = False, timeout_s: float = 30.0) -> list[Delivery]:
    check_produce_arguments(NAME, CAN, records, acks, idempotence)
    for record in records:
        check_record(record)
    deliveries: list[Delivery | None] = [None] * len(records)
    for (partition, headers, unkeyed), indexes in runs(records):
        argv = [executable(), "-b", bootstrap, "-P", "-t", topic, "-q",
                "-p", str(-1 if partition is None else partition),
                "-D", escaped(RECORD_DELIMITER), "-X", f"acks={acks}",
                "-X", f"enable.idempotence={str(idempotence).lower()}",
                "-X", f"message.timeout.ms={int(timeout_s * 1000)}"]
        if not unkeyed:
            argv += ["-K", escaped(KEY_DELIMITER)]
        for name, value in headers:
            argv += ["-H", f"{name}={value.decode()}"]
        stdin = b"".join((b"" if unkeyed else records[i].key + KEY_DELIMITER)
                         + records[i].value + RECORD_DELIMITER for i in indexes)
        done = run_bounded(f"kcat producing to {topic} at {bootstrap}", argv, timeout_s + 10,
                           stdin=stdin)
        error = None if done.returncode == 0 else \
            (done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}")
        for i in indexes:
            deliveries[i] = Delivery(partition, None, error)
    return deliveries


def consume(bootstrap: str, topic: str, count: int, *, offsets: dict[int, int] | None = None,
            group_id: str | None = None, timeout_s: float = 30.0) -> list[Consumed]:
    """Reads until ``count`` records or the bound: a run of kcat per assigned
    partition (``-o offset -c count -e``: it ends at the partition's end), or one
    group member (``-G``) stopped by ``-c`` or, with fewer records, by the bound."""
    check_consume_arguments(offsets, group_id)
    common = [executable(), "-b", bootstrap, "-q", "-f", CONSUME_FORMAT,
              "-X", "enable.auto.commit=false", "-X", "auto.offset.reset=earliest"]
    if offsets is None:
        argv = [*common, "-c", str(count), "-G", group_id, topic]
        return parse(run_until(f"kcat consuming {topic} in group {group_id}", argv,
                               timeout_s))
    found: list[Consumed] = []
    for partition, offset in offsets.items():
        if len(found) >= count:
            break
        argv = [*common, "-C", "-t", topic, "-p", str(partition), "-o", str(offset), "-e",
                "-c", str(count - len(found))]
        done = run_bounded(f"kcat consuming {topic} [{partition}]", argv, timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"kcat consuming {topic} [{partition}] at {bootstrap}: "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")
        found += parse(done.stdout)
    return found


def group(bootstrap: str, topic: str, *, group_id: str, members: int = 3,
          assignor: str = "range", timeout_s: float = 60.0) -> Members:
    check_group_arguments(NAME, ASSIGNORS, assignor)
    return ChildMembers([[executable(), "-b", bootstrap, "-q", "-u", "-f", CONSUME_FORMAT,
                          "-X", f"client.id=member-{index}",
                          "-X", f"partition.assignment.strategy={assignor}",
                          "-X", "auto.offset.reset=earliest", "-X", "enable.auto.commit=true",
                          "-X", "auto.commit.interval.ms=100", "-G", group_id, topic]
                         for index in range(members)], parse, timeout_s)


def run_until(what: str, argv: list[str], timeout_s: float) -> bytes:
    """A group member's output: what it printed once it stopped by itself, or by
    the bound (kcat in a group never ends at a partition's end by itself)."""
    return run_bounded(what, argv, timeout_s, stop_at_bound=True).stdout


def parse(output: bytes) -> list[Consumed]:
    """Records printed in CONSUME_FORMAT; a last one cut short (kcat stopped while
    printing it) is left out."""
    found, position = [], 0
    while position < len(output):
        line_end = output.find(b"\n", position)
        if line_end < 0:
            break
        partition, offset, timestamp, key_size, value_size = \
            (int(field) for field in output[position:line_end].split())
        position = line_end + 1
        key = None if key_size < 0 else output[position:position + key_size]
        position += max(key_size, 0)
        value = None if value_size < 0 else output[position:position + value_size]
        position += max(value_size, 0)
        headers_end = output.find(b"\n", position)
        if headers_end < 0 or position > len(output):
            break
        headers = tuple((name, text.encode()) for name, _, text in
                        (pair.partition("=") for pair in
                         output[position:headers_end].decode().split(",") if pair))
        position = headers_end + 1
        found.append(Consumed(partition, offset, key, value, headers, timestamp))
    return found


def metadata(bootstrap: str, topics=None, *, timeout_s: float = 30.0) -> ClusterMetadata:
    argv = [executable(), "-b", bootstrap, "-L", "-J", "-m", str(max(1, int(timeout_s)))]
    done = run_bounded(f"kcat listing {bootstrap}", argv, timeout_s + 10)
    if done.returncode != 0:
        raise TimeoutError(f"kcat had no metadata from {bootstrap} within {timeout_s} s: "
                           f"{done.stderr.decode(errors='replace')[-1000:]}")
    listing = json.loads(done.stdout)
    return ClusterMetadata(
        {broker["id"]: broker["name"] for broker in listing["brokers"]},
        {topic["topic"]: {p["partition"]: p["leader"] for p in topic["partitions"]}
         for topic in listing["topics"]
         if "error" not in topic and (not topics or topic["topic"] in topics)})
