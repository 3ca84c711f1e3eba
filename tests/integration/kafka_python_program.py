"""A small program written for kafka-python, kept as it would be written for it.

tests/integration/test_kafka_python_program.py copies it with only its ``kafka``
import lines pointed at ``shmlog.kafka`` and runs it against a real broker: the
issue's test that a kafka-python program needs only its imports changed. It
takes what a kafka-python program takes, the bootstrap servers, on its command
line (for shmlog: the broker's data directory), and a topic and group name.

It exits 0 after printing ``OK`` once every check passed; a failed check exits 1
naming it. Nothing in it knows about shmlog.
"""

import json
import sys
import threading

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

RECORDS = 30
WAIT_MS = 60_000


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def create_topic(admin, topic):
    admin.create_topics([NewTopic(name=topic, num_partitions=2, replication_factor=1,
                                  topic_configs={"retention.ms": "3600000"})])
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
        check(False, "creating the topic twice raises TopicAlreadyExistsError")
    except TopicAlreadyExistsError:
        pass
    admin.create_partitions({topic: NewPartitions(total_count=3)})
    check(topic in admin.list_topics(), "list_topics names the new topic")


def produce(bootstrap, topic):
    acknowledged, failed = [], []
    lock = threading.Lock()

    def on_send_success(metadata):
        with lock:
            acknowledged.append(metadata)

    def on_send_error(error):
        with lock:
            failed.append(error)

    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="example-producer",
                             key_serializer=str.encode,
                             value_serializer=lambda value: json.dumps(value).encode("utf-8"),
                             acks="all", retries=5, linger_ms=5, api_version=(2, 8),
                             request_timeout_ms=30_000)
    for number in range(RECORDS):
        producer.send(topic, key=f"user-{number % 5}", value={"number": number}) \
            .add_callback(on_send_success).add_errback(on_send_error)
    first = producer.send(topic, key="user-0", value={"number": RECORDS})
    metadata = first.get(timeout=30)
    check(metadata.topic == topic and metadata.offset >= 0, "get() gives the record's metadata")
    check(first.succeeded() and not first.failed() and first.exception is None,
          "a delivered future succeeded")
    producer.flush()
    with lock:
        check(len(acknowledged) == RECORDS, f"every callback ran once ({len(acknowledged)})")
        check(not failed, f"no errback ran ({failed})")
        check(all(entry.offset >= 0 for entry in acknowledged), "callbacks got metadata")
    check(producer.partitions_for(topic) == {0, 1, 2}, "partitions_for gives the partitions")
    producer.close()
    return RECORDS + 1


def consume(bootstrap, topic, group, expected):
    committed_async = threading.Event()
    outcome = []

    def on_commit(offsets, response):
        outcome.append((offsets, response))
        committed_async.set()

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             client_id="example-consumer", auto_offset_reset="earliest",
                             enable_auto_commit=False, key_deserializer=bytes.decode,
                             value_deserializer=lambda data: json.loads(data.decode("utf-8")),
                             consumer_timeout_ms=WAIT_MS, session_timeout_ms=10_000,
                             heartbeat_interval_ms=1_000, fetch_max_wait_ms=100)
    numbers = set()
    for message in consumer:
        check(isinstance(message.value, dict) and message.key.startswith("user-"),
              "records come deserialized")
        numbers.add(message.value["number"])
        if len(numbers) == expected:
            break
    check(numbers == set(range(expected)), f"every record was consumed once ({len(numbers)})")
    consumer.commit()
    check(consumer.partitions_for_topic(topic) == {0, 1, 2}, "partitions_for_topic")
    check(topic in consumer.topics(), "topics() names the topic")
    assignment = consumer.assignment()
    check(sum(consumer.highwater(partition) for partition in assignment) == expected,
          "the high watermarks add up to what was produced")
    check(sum(consumer.committed(partition) or 0 for partition in assignment) == expected,
          "commit() stored the positions")
    first = TopicPartition(topic, 0)
    consumer.pause(first)
    check(consumer.paused() == {first}, "paused() names the paused partition")
    consumer.resume(first)
    consumer.commit_async(offsets={first: OffsetAndMetadata(0, "rewound", -1)},
                          callback=on_commit)
    while not committed_async.is_set():
        consumer.poll(timeout_ms=100)
    offsets, response = outcome[0]
    check(not isinstance(response, Exception), f"commit_async succeeded ({response})")
    check(consumer.committed(first) == 0, "commit_async stored its offset")
    consumer.close()


def administer(admin, topic, group, expected):
    offsets = admin.list_consumer_group_offsets(group)
    check(set(offsets) == {TopicPartition(topic, partition) for partition in range(3)},
          "the group's offsets name every partition")
    check(offsets[TopicPartition(topic, 0)].offset == 0, "the async commit is listed")
    groups = admin.describe_consumer_groups([group])
    check(groups[0].group == group and groups[0].state == "Empty",
          f"the closed consumer's group is empty ({groups[0].state})")
    check(group in [group_id for group_id, _ in admin.list_consumer_groups()],
          "list_consumer_groups names the group")
    deleted = admin.delete_consumer_groups([group])
    check(deleted[0][0] == group and not deleted[0][1], f"the group was deleted ({deleted})")
    admin.delete_topics([topic])
    check(topic not in admin.list_topics(), "the topic was deleted")


def main():
    bootstrap, topic, group = sys.argv[1], sys.argv[2], sys.argv[3]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="example-admin")
    try:
        create_topic(admin, topic)
        expected = produce(bootstrap, topic)
        consume(bootstrap, topic, group, expected)
        administer(admin, topic, group, expected)
    except KafkaError as error:
        check(False, f"{type(error).__name__}: {error}")
    finally:
        admin.close()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
