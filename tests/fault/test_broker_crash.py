"""kill -9 the broker while a producer sends with acks=1, start a new one: every
acknowledged record is there exactly once, nothing is half-visible, and the
producer's ring is picked up by the new broker.

Method: a real broker (child process) is killed with SIGKILL in the middle of a
steady stream from a producer process; a second broker is started on the same data
directory; the producer (which re-registers its ring when acknowledgements stall)
finishes; a consumer then reads everything. Idempotent sequences keep a batch that
the dead broker appended but never released from being appended twice. Every wait
is bounded; every process is reaped and /dev/shm cleaned.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer
from shmlog.server.broker import Broker

DEADLINE_S = 120
RECORDS = 20_000

PRODUCER = textwrap.dedent("""
    import json, sys
    from shmlog.client.producer import Producer
    data_dir, count = sys.argv[1], int(sys.argv[2])
    with Producer(data_dir, batch_size=2048, linger_ms=1) as producer:
        futures = []
        for number in range(count):
            futures.append(producer.send("events", b"%d" % number, key=b"%d" % (number % 11)))
            if len(futures) == 200:
                for future in futures:
                    future.get(timeout=120)
                print(json.dumps({"acknowledged": number + 1}), flush=True)
                futures = []
        for future in futures:
            future.get(timeout=120)
    print(json.dumps({"acknowledged": count}), flush=True)
""")


def test_a_killed_broker_loses_nothing_acknowledged_and_duplicates_nothing(data_dir):
    first = Broker(data_dir).start()
    producer = None
    try:
        Admin(data_dir).create_topic("events", 3)
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, data_dir, str(RECORDS)],
                                    stdout=subprocess.PIPE, text=True)
        acknowledged = 0
        while acknowledged < RECORDS // 4:
            line = producer.stdout.readline()
            assert line, "the producer died"
            acknowledged = json.loads(line)["acknowledged"]
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=DEADLINE_S)
        with Broker(data_dir):
            out, _ = producer.communicate(timeout=DEADLINE_S)
            assert producer.returncode == 0
            assert json.loads(out.strip().splitlines()[-1])["acknowledged"] == RECORDS
            values = []
            with Consumer("events", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
                for _ in range(100_000):
                    for records in consumer.poll(timeout_ms=50).values():
                        values += [int(record.value) for record in records]
                    if len(values) >= RECORDS:
                        break
                assert consumer.poll(timeout_ms=200) == {}
        assert sorted(values) == list(range(RECORDS)), "each record exactly once"
    finally:
        first.stop()
        if producer is not None:
            producer.kill()
            producer.wait(timeout=30)
            producer.stdout.close()


def test_a_running_consumer_follows_a_restarted_broker(data_dir):
    from shmlog.client.consumer import TopicPartition
    from shmlog.client.producer import Producer
    partition = TopicPartition("events", 0)
    first = Broker(data_dir).start()
    try:
        Admin(data_dir).create_topic("events")
        with Producer(data_dir) as producer:
            producer.send("events", b"before", partition=0).get(timeout=30)
        with Consumer(bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            consumer.assign([partition])
            assert [r.value for r in consumer.poll(timeout_ms=5000)[partition]] == [b"before"]
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(timeout=DEADLINE_S)
            with Broker(data_dir):
                with Producer(data_dir) as producer:
                    producer.send("events", b"after", partition=0).get(timeout=30)
                records = consumer.poll(timeout_ms=10_000)
                assert [r.value for r in records[partition]] == [b"after"]
                assert records[partition][0].offset == 1
    finally:
        first.stop()
