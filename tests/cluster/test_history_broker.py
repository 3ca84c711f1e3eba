"""The history checker on a real broker: what producers and a consumer saw of a
single broker, and its partition logs read back from disk, pass the five rules.

Goal: the checker's recording maps onto the client API as cluster tests will use it
(a producer future's offset is an acknowledgement, a consumer record a read, a
partition directory a replica), and a correct broker is never accused.

Method: a real broker (``Broker``, a child process), producer threads sending
unique values with acks="all" (a single broker is its partitions' whole ISR), a
consumer reading everything back; after the broker stopped, ``read_replica`` reads
each partition's segment files as the final log.
"""

from __future__ import annotations

import os
import threading
import time

from cluster.history import History, read_replica
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import ShmlogError
from shmlog.server.broker import Broker
from shmlog.storage.log_manager import TOPICS_DIRECTORY

TOPIC = "history"
PARTITIONS = 2
THREADS = 3
SENDS_PER_THREAD = 300
WAIT_S = 60.0


def produce(data_dir: str, history: History, thread: int) -> None:
    with Producer(data_dir, acks="all", linger_ms=1) as producer:
        sent = []
        for index in range(SENDS_PER_THREAD):
            value = f"t{thread}-{index}".encode()
            partition = index % PARTITIONS
            history.send(value, partition, acks="all")
            sent.append((value, producer.send(TOPIC, value, partition=partition)))
        for value, future in sent:
            try:
                history.ack(value, future.get(timeout=WAIT_S).offset)
            except ShmlogError as error:
                history.fail(value, error)


def consume(data_dir: str, history: History) -> None:
    expected = THREADS * SENDS_PER_THREAD
    deadline = time.monotonic() + WAIT_S
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, partition) for partition in range(PARTITIONS)])
        while len(history.reads()) < expected:
            assert time.monotonic() < deadline, f"read {len(history.reads())} of {expected}"
            for partition, records in consumer.poll(timeout_ms=100).items():
                history.read_many(partition.partition,
                                  [(record.offset, record.value) for record in records],
                                  reader="consumer")


def test_a_correct_brokers_history_passes(data_dir):
    history = History()
    with Broker(data_dir):
        Admin(data_dir).create_topic(TOPIC, PARTITIONS)
        producers = [threading.Thread(target=produce, args=(data_dir, history, thread))
                     for thread in range(THREADS)]
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(WAIT_S)
            assert not producer.is_alive()
        consume(data_dir, history)
    sent_to = {partition: sum(1 for send in history.sends() if send.partition == partition)
               for partition in range(PARTITIONS)}
    replicas = {partition: read_replica(os.path.join(data_dir, TOPICS_DIRECTORY, TOPIC,
                                                     str(partition)), sent_to[partition])
                for partition in range(PARTITIONS)}
    final = {partition: replica.records for partition, replica in replicas.items()}
    verdict = history.check(final, {partition: {1: replica}
                                    for partition, replica in replicas.items()})
    print(verdict)
    verdict.assert_ok()
    assert verdict.counts["acked acks=all"] == THREADS * SENDS_PER_THREAD
    assert verdict.counts["final records"] == THREADS * SENDS_PER_THREAD
