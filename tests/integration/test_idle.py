"""The default idle strategy: an idle broker and an idle consumer sleep (they cost
almost no CPU), and a consumer asleep in a long poll gets what is produced
meanwhile (the doorbell's no-lost-wakeup property is shown in
test_wakeup_processes.py).

Method: a real broker in a child process; CPU time is read from /proc (the broker)
and ``time.process_time`` (this process, which runs the consumer) over a few idle
seconds. A spinning loop would use one CPU-second per second; the bound is a
fraction of that. Every wait is bounded.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.server.broker import Broker, shared_memory_prefix
from shmlog.shm import shared_memory

IDLE_S = 3.0
CPU_BOUND_S = 0.5 * IDLE_S / 3          # a sixth of one CPU while idle


@pytest.fixture
def broker(tmp_path):
    path = str(tmp_path / "data")
    with Broker(path) as running:
        Admin(path).create_topic("idle", partitions=2)
        yield path, running.process.pid
    for name in os.listdir("/dev/shm"):
        if name.startswith(shared_memory_prefix(path)):
            shared_memory.unlink(name)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as source:
        fields = source.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_broker_and_an_idle_consumer_sleep(broker):
    data_dir, broker_pid = broker
    with Producer(data_dir) as producer:          # some work first, then silence
        producer.send("idle", b"x", partition=0).get(timeout=30)
    with Consumer("idle", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        assert sum(map(len, consumer.poll(timeout_ms=10_000).values())) == 1
        broker_before, consumer_before = cpu_seconds(broker_pid), time.process_time()
        started = time.monotonic()
        assert consumer.poll(timeout_ms=int(IDLE_S * 1000)) == {}
        assert time.monotonic() - started >= IDLE_S * 0.99, "the poll waited its timeout"
        consumer_cpu = time.process_time() - consumer_before
        broker_cpu = cpu_seconds(broker_pid) - broker_before
    assert consumer_cpu < CPU_BOUND_S, f"an idle consumer used {consumer_cpu:.2f} CPU-s"
    assert broker_cpu < CPU_BOUND_S, f"an idle broker used {broker_cpu:.2f} CPU-s"


def test_a_consumer_asleep_in_a_long_poll_gets_new_records(broker):
    data_dir, _ = broker
    with Consumer(bootstrap=data_dir) as consumer:
        consumer.assign([TopicPartition("idle", 1)])
        consumer.seek_to_end(TopicPartition("idle", 1))

        def produce_later():
            time.sleep(0.5)                       # long enough for the poll to sleep
            with Producer(data_dir, linger_ms=0) as producer:
                producer.send("idle", b"wake up", partition=1).get(timeout=30)

        sender = threading.Thread(target=produce_later)
        sender.start()
        try:
            polled = consumer.poll(timeout_ms=60_000)
        finally:
            sender.join(timeout=60)
    assert [record.value for record in polled[TopicPartition("idle", 1)]] == [b"wake up"]
