"""kafkajs (Node), through ``node/kafkajs_client.js`` in a child process: the
request goes in as JSON on stdin, the answer comes back as JSON on stdout.

Rules
-----
* kafkajs is installed by ``make test`` (the Makefile's node-clients step: ``npm
  ci`` in ``node/``, from the committed lock file, version pinned); without node,
  or before that step, :func:`missing` says why and tests skip.
* The script stops itself at the request's timeout; the process is bounded a
  little past it (:data:`SLACK_S`) and killed past that.
* kafkajs reads only through a group: assigned reading (``offsets``) joins a group
  of its own and seeks, and keeps only the partitions and offsets asked for.
* kafkajs keeps headers in an object: a name given twice comes back as one array,
  so headers come back grouped by name (in order of first appearance).
* Each record is sent by a send of its own (kafkajs reports one base offset per
  partition, and not where its partitioner put a record); acks=0 reports none.
* A group's members (:func:`group`) are node processes (``kafkajs_client.js
  member``), each printing a line of JSON per record as it reads it and committing
  each record; closing its stdin ends it (it leaves its group). kafkajs has one
  assignor, its RoundRobinAssigner (Kafka's roundrobin).
"""

from __future__ import annotations

import base64
import json
import os
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

NAME = "kafkajs"
CAN = frozenset({"idempotence", "timestamps", "null values", "assign", "groups"})
ASSIGNORS = frozenset({"roundrobin"})
DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
SCRIPT = os.path.join(DIRECTORY, "kafkajs_client.js")
# Node's start and kafkajs' disconnect, on top of the request's own timeout.
SLACK_S = 20.0


def missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (kafkajs runs on Node.js; apt's nodejs and npm)"
    if not os.path.isdir(os.path.join(DIRECTORY, "node_modules", "kafkajs")):
        return (f"kafkajs is not installed in {DIRECTORY}/node_modules (make test's "
                "node-clients step runs npm ci there)")
    return None


def encoded(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def decoded(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def call(what: str, request: dict, timeout_s: float):
    request = {**request, "timeout_ms": int(timeout_s * 1000)}
    done = run_bounded(f"kafkajs {what}", ["node", SCRIPT], timeout_s + SLACK_S,
                       stdin=json.dumps(request).encode(), cwd=DIRECTORY)
    if done.returncode != 0:
        raise RuntimeError(f"kafkajs {what}: exit code {done.returncode}: "
                           f"{done.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(done.stdout)


def produce(bootstrap: str, topic: str, records, *, acks: str = "all",
            idempotence: bool = False, timeout_s: float = 30.0) -> list[Delivery]:
    check_produce_arguments(NAME, CAN, records, acks, idempotence)
    answer = call(f"producing to {topic} at {bootstrap}", {
        "action": "produce", "bootstrap": bootstrap, "topic": topic, "acks": acks,
        "idempotence": idempotence,
        "records": [{"key": encoded(r.key), "value": encoded(r.value),
                     "headers": [[name, encoded(value)] for name, value in r.headers],
                     "partition": r.partition, "timestamp_ms": r.timestamp_ms}
                    for r in records]}, timeout_s)
    return [Delivery(d["partition"], d["offset"], d["error"]) for d in answer]


def consume(bootstrap: str, topic: str, count: int, *, offsets: dict[int, int] | None = None,
            group_id: str | None = None, timeout_s: float = 30.0) -> list[Consumed]:
    check_consume_arguments(offsets, group_id)
    answer = call(f"consuming {topic} at {bootstrap}", {
        "action": "consume", "bootstrap": bootstrap, "topic": topic, "count": count,
        "offsets": None if offsets is None else {str(p): o for p, o in offsets.items()},
        "group_id": group_id}, timeout_s)
    return [consumed(m) for m in answer]


def consumed(m: dict) -> Consumed:
    return Consumed(m["partition"], m["offset"], decoded(m["key"]), decoded(m["value"]),
                    tuple((name, decoded(value)) for name, value in m["headers"]),
                    m["timestamp_ms"])


def group(bootstrap: str, topic: str, *, group_id: str, members: int = 3,
          assignor: str = "roundrobin", timeout_s: float = 60.0) -> Members:
    check_group_arguments(NAME, ASSIGNORS, assignor)
    request = {"bootstrap": bootstrap, "topic": topic, "group_id": group_id,
               "timeout_ms": int(timeout_s * 1000)}
    return ChildMembers([["node", SCRIPT, "member",
                          json.dumps({**request, "client_id": f"member-{index}"})]
                         for index in range(members)],
                        parse_lines, timeout_s, cwd=DIRECTORY, by_stdin=True)


def parse_lines(output: bytes) -> list[Consumed]:
    """A member's lines of JSON; a last line cut short is left out."""
    return [consumed(json.loads(line)) for line in output.split(b"\n")[:-1]]


def metadata(bootstrap: str, topics=None, *, timeout_s: float = 30.0) -> ClusterMetadata:
    try:
        answer = call(f"asking {bootstrap} for metadata",
                      {"action": "metadata", "bootstrap": bootstrap}, timeout_s)
    except RuntimeError as error:
        raise TimeoutError(f"kafkajs had no metadata from {bootstrap} within {timeout_s} s: "
                           f"{error}") from None
    return ClusterMetadata({node: address for node, address in answer["brokers"]},
                           {name: dict(partitions) for name, partitions in answer["topics"]
                            if not topics or name in topics})
