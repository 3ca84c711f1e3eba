"""Exactly once through a consume-transform-produce loop killed at random points: a process
reads "in" (read_committed), writes each record transformed to "out" and commits its
input offsets in the same transaction; it is killed with SIGKILL at seeded random points
of its progress and started again, each time fencing its predecessor's transaction; in a
second run every other kill takes the broker (and so the transaction coordinator) down
with it, SIGKILL too, and starts it again. Once the input is consumed, "out" read with
read_committed holds every input exactly once, in input order per partition, and the
group's committed offsets are the input's end.

Method: one broker process at a time, the loop in child processes (``python -c``), every
wait bounded, every child killed or ended before the test returns.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from helpers import RestartableBroker
from shmlog import Admin, Consumer, Producer
from shmlog.client.consumer import TopicPartition
from shmlog.common.errors import BrokerNotAvailableError
from shmlog.protocol.control_client import request

INPUTS_PER_PARTITION = 2000
PARTITIONS = 2
KILLS = 4
WAIT_S = 90.0
POLL_MS = 200
SEED = int(os.environ.get("SHMLOG_TEST_SEED", "30"))

# The loop: started again after every kill; it exits once every input is consumed.
LOOP = """
import sys
from shmlog import Consumer, Producer
from shmlog.client.consumer import TopicPartition
from shmlog.common.structs import OffsetAndMetadata

data_dir, ends = sys.argv[1], [int(end) for end in sys.argv[2:]]
partitions = [TopicPartition("in", number) for number in range(len(ends))]
consumer = Consumer(bootstrap=data_dir, group_id="transform", enable_auto_commit=False,
                    isolation_level="read_committed", max_poll_records=29)
consumer.assign(partitions)
for partition in partitions:
    consumer.seek(partition, consumer.committed(partition) or 0)
producer = Producer(data_dir, transactional_id="transform-1", linger_ms=1)
producer.init_transactions()
while any(consumer.position(p) < end for p, end in zip(partitions, ends)):
    found = consumer.poll(timeout_ms=200)
    if not found:
        continue
    producer.begin_transaction()
    offsets = {}
    for partition, records in found.items():
        for record in records:
            producer.send("out", record.value + b"!", partition=partition.partition)
        offsets[partition] = OffsetAndMetadata(records[-1].offset + 1, "")
    producer.send_offsets_to_transaction(offsets, "transform")
    producer.commit_transaction()
producer.close()
consumer.close()
"""


@pytest.fixture
def brokers(data_dir):
    made = RestartableBroker(data_dir, liveness_check_interval_ms=200)
    try:
        with Admin(data_dir) as admin:
            admin.create_topic("in", PARTITIONS)
            admin.create_topic("out", PARTITIONS)
        yield made
    finally:
        made.stop()


def _start(data_dir: str) -> subprocess.Popen:
    ends = [str(INPUTS_PER_PARTITION)] * PARTITIONS
    return subprocess.Popen([sys.executable, "-c", LOOP, data_dir, *ends],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _consumed(data_dir: str) -> int:
    """How many inputs the loop's transactions have committed as consumed (0 while
    no broker answers)."""
    try:
        offsets = request(data_dir, "fetch_offsets", group_id="transform")["offsets"]
    except BrokerNotAvailableError:
        return 0
    return sum(offset for topic, _, offset, _ in offsets if topic == "in")


def _out_records(data_dir: str, expected: int) -> dict[int, list[bytes]]:
    """Per partition, the values of "out" a read_committed consumer reads (until
    ``expected`` in all, or WAIT_S; then one more poll to see nothing else comes)."""
    found = {number: [] for number in range(PARTITIONS)}
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition("out", number) for number in range(PARTITIONS)])
        deadline = time.monotonic() + WAIT_S
        while sum(map(len, found.values())) < expected and time.monotonic() < deadline:
            for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                found[partition.partition] += [record.value for record in records]
        for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
            found[partition.partition] += [record.value for record in records]
    return found


@pytest.mark.parametrize("nemesis", ["the loop", "the loop and the broker"])
def test_a_killed_transform_loop_writes_each_input_exactly_once(brokers, nemesis):
    broker = brokers.data_dir
    inputs = {number: [f"in-{number}-{index}".encode() for index in range(INPUTS_PER_PARTITION)]
              for number in range(PARTITIONS)}
    with Producer(broker, linger_ms=5) as producer:
        for number, values in inputs.items():
            for value in values:
                producer.send("in", value, partition=number)
        producer.flush(WAIT_S)
    # Each kill lands once the committed input passes a random share of it, a random
    # moment later (within a transaction or between two): wherever the loop is then.
    chance = random.Random(SEED)
    shares = sorted(chance.uniform(0.05, 0.9) for _ in range(KILLS))
    killed = 0
    loop = _start(broker)
    try:
        for share in shares:
            deadline = time.monotonic() + WAIT_S
            while _consumed(broker) < share * PARTITIONS * INPUTS_PER_PARTITION:
                assert loop.poll() is None, loop.communicate()[0].decode(errors="replace")
                assert time.monotonic() < deadline, "the loop made no progress"
                time.sleep(0.005)
            time.sleep(chance.uniform(0.0, 0.05))
            if nemesis == "the loop and the broker" and killed % 2 == 0:
                brokers.kill_and_start()          # mid-transaction, or mid-commit
            loop.send_signal(signal.SIGKILL)
            loop.wait(WAIT_S)
            killed += 1
            loop = _start(broker)
        output, _ = loop.communicate(timeout=WAIT_S * 2)
        assert loop.returncode == 0, output.decode(errors="replace")
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait(WAIT_S)
    assert killed == KILLS
    found = _out_records(broker, PARTITIONS * INPUTS_PER_PARTITION)
    for number, values in inputs.items():
        assert found[number] == [value + b"!" for value in values], \
            f"out-{number}: {len(found[number])} records for {len(values)} inputs"
    with Consumer(bootstrap=broker, group_id="transform") as consumer:
        for number in range(PARTITIONS):
            assert consumer.committed(TopicPartition("in", number)) == INPUTS_PER_PARTITION
