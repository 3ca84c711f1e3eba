"""kcat (librdkafka's command-line client, from the distribution) against the Kafka
listener: it lists the broker and topics, produces keyed lines (plain and zstd), and
consumes them back with their offsets; shmlog's own consumer reads what it wrote.

Method: the module's broker; kcat runs as a child process, each run bounded by a
timeout (killed past it). Skips, saying why, where kcat is not installed (``make
test`` installs it as root with apt-get).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from shmlog import Admin, Consumer
from shmlog.client.consumer import TopicPartition

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
RUN_TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test "
                                                    "installs the kcat package as root)")


def kcat(address: str, *arguments: str, stdin: str | None = None) -> str:
    done = subprocess.run([KCAT, "-b", address, *arguments], input=stdin, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_kcat_lists_the_broker_and_topics(kafka_broker):
    data_dir, address = kafka_broker
    Admin(data_dir).create_topic("kcat-listed", 2)
    listing = json.loads(kcat(address, "-L", "-J"))
    host, port = address.rsplit(":", 1)
    assert [(broker["id"], broker["name"]) for broker in listing["brokers"]] == \
        [(0, f"{host}:{port}")]
    [topic] = [topic for topic in listing["topics"] if topic["topic"] == "kcat-listed"]
    assert [partition["leader"] for partition in topic["partitions"]] == [0, 0]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_kcat_produces_and_consumes_keyed_lines(kafka_broker, codec):
    data_dir, address = kafka_broker
    topic = f"kcat-{codec}"
    Admin(data_dir).create_topic(topic, 1)
    lines = "".join(f"key{index}:value {index}\n" for index in range(20))
    kcat(address, "-P", "-t", topic, "-p", "0", "-K:", "-z", codec, stdin=lines)
    read = kcat(address, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%o %k=%s\n")
    assert read.splitlines() == [f"{index} key{index}=value {index}" for index in range(20)]
    consumer = Consumer(bootstrap=data_dir)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        records = []
        for _ in range(50):
            for batch in consumer.poll(timeout_ms=200).values():
                records += batch
            if len(records) >= 20:
                break
    finally:
        consumer.close()
    assert [(record.key, record.value) for record in records] == \
        [(b"key%d" % index, b"value %d" % index) for index in range(20)]
