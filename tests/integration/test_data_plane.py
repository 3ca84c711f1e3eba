"""The whole same-host path with real processes: three producer processes write
keyed and unkeyed records to four partitions through a real broker, and one
consumer process per partition reads them: every acknowledged record exactly once,
each producer's records in order within a partition. A producer killed with
SIGKILL mid-stream leaves nothing partial and keeps what was acknowledged.

Method: ``Broker`` (a child process), producer and consumer child processes that
report over pipes; every wait is bounded, every child reaped, /dev/shm cleaned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.server.broker import Broker, shared_memory_prefix

DEADLINE_S = 120
PER_PRODUCER = 3000

PRODUCER = textwrap.dedent("""
    import json, sys
    from shmlog.client.producer import Producer
    data_dir, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    acknowledged = []
    with Producer(data_dir, batch_size=4096, linger_ms=2) as producer:
        futures = []
        for number in range(count):
            key = b"key-%d" % (number % 13) if number % 2 else None
            futures.append(producer.send("events", b"%s:%d" % (name.encode(), number), key=key))
            if number % 500 == 499:
                for future in futures:
                    meta = future.get(timeout=60)
                    acknowledged.append([meta.partition, meta.offset])
                futures = []
                print(json.dumps({"acknowledged": number + 1}), flush=True)
        for future in futures:
            meta = future.get(timeout=60)
            acknowledged.append([meta.partition, meta.offset])
    print(json.dumps({"done": acknowledged}), flush=True)
""")

CONSUMER = textwrap.dedent("""
    import json, sys, time
    from shmlog.client.consumer import Consumer, TopicPartition
    data_dir, partition, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seen = []
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("events", partition)])
        deadline = time.monotonic() + 120
        while len(seen) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100).values():
                seen += [[r.offset, r.value.decode()] for r in records]
        time.sleep(0.2)
        for records in consumer.poll(timeout_ms=100).values():       # nothing more
            seen += [[r.offset, r.value.decode()] for r in records]
    print(json.dumps(seen), flush=True)
""")


@pytest.fixture
def data_dir(tmp_path):
    path = str(tmp_path / "data")
    children = []
    yield path, children
    for child in children:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdout, child.stdin):
            if stream:
                stream.close()
    unlink_shared_memory(path)


def spawn(children, script, *arguments):
    child = subprocess.Popen([sys.executable, "-c", script, *map(str, arguments)],
                             stdout=subprocess.PIPE, text=True)
    children.append(child)
    return child


def last_json(child):
    out, _ = child.communicate(timeout=DEADLINE_S)
    assert child.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_three_producers_four_partitions_four_consumers(data_dir):
    path, children = data_dir
    with Broker(path):
        Admin(path).create_topic("events", 4)
        producers = [spawn(children, PRODUCER, path, f"p{n}", PER_PRODUCER) for n in range(3)]
        acknowledged = [last_json(child)["done"] for child in producers]
        per_partition = [0] * 4
        for records in acknowledged:
            for partition, _ in records:
                per_partition[partition] += 1
        consumers = [spawn(children, CONSUMER, path, partition, per_partition[partition])
                     for partition in range(4)]
        seen = [last_json(child) for child in consumers]
    for partition, records in enumerate(seen):
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(records))), "dense offsets, each once"
        assert len(records) == per_partition[partition]
        for name in ("p0", "p1", "p2"):
            numbers = [int(value.split(":")[1]) for _, value in records
                       if value.startswith(name + ":")]
            assert numbers == sorted(numbers), f"{name}'s order in partition {partition}"
    delivered = {(partition, offset) for partition, records in enumerate(seen)
                 for offset, _ in records}
    assert delivered == {tuple(pair) for records in acknowledged for pair in records}


def test_a_producer_killed_mid_stream_keeps_what_was_acknowledged(data_dir):
    path, children = data_dir
    with Broker(path, liveness_check_interval_ms=100):
        Admin(path).create_topic("events", 4)
        victim = spawn(children, PRODUCER, path, "victim", 10**7)
        line = victim.stdout.readline()
        acknowledged = json.loads(line)["acknowledged"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        prefix = shared_memory_prefix(path) + "-producer"
        while any(name.startswith(prefix) for name in os.listdir("/dev/shm")):
            assert time.monotonic() < deadline, "the dead producer's ring was not reclaimed"
            time.sleep(0.05)
        consumers = [spawn(children, CONSUMER, path, partition, 1) for partition in range(4)]
        seen = [last_json(child) for child in consumers]
    numbers = [int(value.split(":")[1]) for records in seen for _, value in records]
    assert len(numbers) == len(set(numbers)), "nothing twice"
    assert set(range(acknowledged)) <= set(numbers), "every acknowledged record is there"
    for records in seen:
        # Batches went to the ring whole or not at all, and decoded cleanly; within a
        # partition the producer's order holds. (Across partitions, batches that were
        # still gathering when it died are simply missing.)
        in_partition = [int(value.split(":")[1]) for _, value in records]
        assert in_partition == sorted(in_partition)
