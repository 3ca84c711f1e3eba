"""No cold start: a broker that answers, and a producer or consumer once made, have
every kernel of their data path loaded, so the first requests and records wait for
no compile (numba compiles, or loads from its disk cache, at a kernel's first call,
with the GIL held: tenths of a second to seconds per kernel).

Method: each process under test is fresh (``cold_start_child.py``, the same
``NUMBA_CACHE_DIR`` as the test) and reports, from inside, the kernel signatures it
gained after start: the broker from the moment its control socket is bound, a client
from the moment it is constructed. A real broker serves each kind of request that
runs kernels (topics created with every kind of config, batches appended in compiled
code and by Python, segment rolls, a cleaning, retention, group offsets committed
and read, a topic deleted), and a fresh producer and consumer exchange their first
records. Nothing may be gained. The first record's end-to-end latency is printed
beside the others' (run with ``-s`` to see it), never asserted: tests do not time.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time

import pytest

from shmlog import Admin, Consumer, Producer, TopicPartition
from shmlog.server.broker import WARM_UP_DIRECTORY

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cold_start_child.py")
REPLY_TIMEOUT_S = 300.0          # a cold numba cache compiles for a minute or more
WAIT_TIMEOUT_S = 60.0
WAIT_STEP_S = 0.05
FIRST_RECORDS = 100
# Timers the broker runs every few tenths of a second here (Kafka's defaults are minutes).
BROKER_SETTINGS = {"cleaner_backoff_ms": 200, "retention_check_interval_ms": 200,
                   "group_initial_rebalance_delay_ms": 0}


class Child:
    """A child of cold_start_child.py, spoken to in JSON lines."""

    def __init__(self, *arguments: str):
        tests = os.path.dirname(os.path.dirname(CHILD))
        repository = os.path.dirname(tests)
        self.process = subprocess.Popen(
            [sys.executable, CHILD, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [repository, os.environ.get("PYTHONPATH", "")])})

    def tell(self) -> None:
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def hear(self) -> dict:
        """The child's next report (bounded by REPLY_TIMEOUT_S)."""
        readable, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT_S)
        assert readable, f"{self.process.args[2]} said nothing for {REPLY_TIMEOUT_S} s"
        line = self.process.stdout.readline()
        assert line, f"{self.process.args[2]} exited with status {self.process.wait()}"
        return json.loads(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=WAIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def broker(data_dir):
    """A fresh broker process (ready when its control socket is bound)."""
    child = Child("broker", data_dir, json.dumps(BROKER_SETTINGS))
    try:
        assert child.hear()["ready"]
        yield child
    finally:
        child.stop()
        assert child.process.returncode == 0, "the broker did not stop cleanly"


def kernels_gained(child: Child) -> dict:
    child.tell()
    return child.hear()["gained"]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {WAIT_TIMEOUT_S} s"
        time.sleep(WAIT_STEP_S)


def read_all(data_dir: str, topic: str) -> list:
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        end = Admin(data_dir).list_offsets(topic)[0]["log_end_offset"]
        records = []
        while consumer.position(TopicPartition(topic, 0)) < end:
            for batch in consumer.poll(timeout_ms=100).values():
                records += batch
        return records


def test_a_started_broker_loads_no_kernel_while_it_serves(broker, data_dir):
    admin = Admin(data_dir)
    admin.create_topic("events", partitions=2)
    admin.create_topic("stamped", config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topic("compacted", config={"cleanup.policy": "compact", "segment.bytes": 4096,
                                            "index.interval.bytes": 0})
    admin.create_topic("retained", config={"segment.bytes": 4096, "retention.bytes": 0})
    with Producer(data_dir) as producer, Producer(data_dir, compression="zstd") as zstd:
        producer.send("events", b"first", partition=0).get(timeout=WAIT_TIMEOUT_S)
        zstd.send("events", b"inflated", partition=1).get(timeout=WAIT_TIMEOUT_S)
        producer.send("stamped", b"stamped").get(timeout=WAIT_TIMEOUT_S)
        for number in range(40):                     # rolls: ten segments each
            for topic in ("compacted", "retained"):
                producer.send(topic, bytes(300), key=b"key-%d" % (number % 3))
            producer.flush()
    wait_until(lambda: len(read_all(data_dir, "compacted")) < 40, "a cleaning")
    wait_until(lambda: admin.list_offsets("retained")[0]["log_start_offset"] > 0, "retention")
    with Consumer("events", bootstrap=data_dir, group_id="readers",
                  auto_offset_reset="earliest") as consumer:
        wait_until(lambda: consumer.poll(timeout_ms=100), "a fetch")
        consumer.commit()                            # makes __consumer_offsets
        assert consumer.committed(TopicPartition("events", 0)) is not None
    admin.delete_topic("events")
    assert kernels_gained(broker) == {}
    assert not os.path.exists(os.path.join(data_dir, WARM_UP_DIRECTORY)), \
        "the warm-up's scratch directory was left"


def test_after_compile_kernels_a_broker_compiles_nothing(data_dir):
    """Once ``python -m shmlog.devtools.compile_kernels`` (``make`` runs it) has filled
    numba's disk cache, a broker only loads: nothing at all is compiled while it
    starts (numba's typed containers, whose own methods are never cached, are made
    and changed by shmlog's cached kernels)."""
    filled = subprocess.run([sys.executable, "-m", "shmlog.devtools.compile_kernels"],
                            capture_output=True, text=True, timeout=REPLY_TIMEOUT_S)
    assert filled.returncode == 0, filled.stderr[-3000:]
    assert "kernels ready in" in filled.stdout
    child = Child("broker", data_dir, json.dumps(BROKER_SETTINGS))
    try:
        started = child.hear()
    finally:
        child.stop()
    assert started["ready"]
    assert started["compiled"] == [], "compiled while a broker started"


def test_the_first_records_of_fresh_clients_load_no_kernel(broker, data_dir):
    Admin(data_dir).create_topic("first")
    consumer = Child("consumer", data_dir, "first", str(FIRST_RECORDS))
    producer = Child("producer", data_dir, "first", str(FIRST_RECORDS))
    try:
        assert consumer.hear() == {"ready": True}
        assert producer.hear() == {"ready": True}
        producer.tell()
        sent, received = producer.hear(), consumer.hear()
    finally:
        for child in (producer, consumer):
            child.stop()
    latencies = received["latencies_us"]
    assert len(latencies) == FIRST_RECORDS
    print(f"\nend-to-end latency of a fresh producer's and consumer's first record: "
          f"{latencies[0]:.0f} us; of the next {FIRST_RECORDS - 1}: median "
          f"{statistics.median(latencies[1:]):.0f} us, largest {max(latencies[1:]):.0f} us")
    assert sent["gained"] == {}, \
        f"the producer loaded {sorted(sent['gained'])} after it was made"
    assert received["gained"] == {}, \
        f"the consumer loaded {sorted(received['gained'])} after it was made"
    assert kernels_gained(broker) == {}
