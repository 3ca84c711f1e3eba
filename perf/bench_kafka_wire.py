"""The Kafka listener's costs: converting batches between Kafka's format and shmlog's,
a real Kafka client's produce and consume rates through the listener, and what an
idle client connection costs the broker.

Goal
----
Say what speaking Kafka's protocol costs beside the same run's memcpy bandwidth
(``bounds.memcpy_rate``): the conversion both ways (records/s and GB/s, each as a
fraction of memcpy), librdkafka's (confluent-kafka's) produce and consume rates of
100-byte records through the listener, and per connection the broker's resident
memory and descriptors. A benchmark never asserts.

Method
------
* Conversion: 1,000 records of 100 random bytes per batch; ``from_kafka`` of a Kafka
  batch built by kafka-python's builder, uncompressed, and ``to_kafka`` of a run of
  100 stored batches, each timed over repeats after one warm call.
* Client rates: a broker (``shmlog.Broker``, a process of its own) with
  ``listeners=PLAINTEXT://127.0.0.1:0``; a confluent-kafka producer in this process
  (idempotent, acks=all, linger 5 ms, 1 MB batches) sends ``--records`` values,
  timed from the first send until ``flush`` returns; then a consumer reads them all
  from offset 0 (``consume(10000)``), timed from its first poll.
* Connections: ``--connections`` TCP connections opened to the listener, each
  answered one ApiVersions request (so the broker holds them as served clients);
  the broker's RSS and open descriptors (``/proc``) before and after.

Every wait is bounded; the broker and its data directory are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

import harness  # noqa: F401 - before shmlog: this checkout's, here and in children

RECORD_SIZE = 100
BATCH_RECORDS = 1_000
RUN_BATCHES = 100
REPEATS = 20
WAIT_S = 120.0


def _conversion() -> dict:
    import numpy as np
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from shmlog.record.kafka_batches import from_kafka, to_kafka
    values = [os.urandom(RECORD_SIZE) for _ in range(BATCH_RECORDS)]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 22)
    for index, value in enumerate(values):
        builder.append(index, timestamp=0, key=None, value=value, headers=[])
    kafka = bytes(builder.build())
    stored = from_kafka(kafka)
    run = np.concatenate([stored] * RUN_BATCHES)
    to_kafka(run)
    started = time.perf_counter()
    for _ in range(REPEATS):
        from_kafka(kafka)
    inbound = (time.perf_counter() - started) / REPEATS
    started = time.perf_counter()
    for _ in range(REPEATS):
        to_kafka(run)
    outbound = (time.perf_counter() - started) / REPEATS / RUN_BATCHES
    return {"kafka_batch_bytes": len(kafka), "stored_batch_bytes": int(stored.size),
            "from_kafka_s": inbound, "to_kafka_s": outbound}


def _resources(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as status:
        rss = int(status.read().split("VmRSS:")[1].split()[0]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _clients(broker, address: str, records: int) -> dict:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from shmlog import Admin
    Admin(broker.data_dir).create_topic("wire", 1)
    values = [os.urandom(RECORD_SIZE) for _ in range(records)]
    producer = Producer({"bootstrap.servers": address, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": records + 1})
    producer.list_topics("wire", timeout=10)
    started = time.monotonic()
    for value in values:
        producer.produce("wire", value, partition=0)
    left = producer.flush(WAIT_S)
    produce_s = time.monotonic() - started
    consumer = Consumer({"bootstrap.servers": address, "group.id": "bench",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("wire", 0, 0)])
    read, started = 0, time.monotonic()
    while read < records and time.monotonic() - started < WAIT_S:
        read += sum(1 for message in consumer.consume(10_000, 1.0) if not message.error())
    consume_s = time.monotonic() - started
    consumer.close()
    return {"records": records, "unflushed": left, "produce_s": produce_s,
            "read": read, "consume_s": consume_s}


def _connections(broker, address: str, count: int) -> dict:
    host, port = address.rsplit(":", 1)
    pid = broker.process.pid
    before = _resources(pid)
    frame = struct.pack(">ihhih", 10, 18, 0, 1, 0)          # ApiVersions v0, no client id
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
            sock.sendall(frame)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            sock.recv(size, socket.MSG_WAITALL)
            sockets.append(sock)
        time.sleep(1.0)
        after = _resources(pid)
    finally:
        for sock in sockets:
            sock.close()
    return {"connections": count, "rss_before": before[0], "rss_after": after[0],
            "fds_before": before[1], "fds_after": after[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=500)
    arguments = parser.parse_args()
    from bounds import memcpy_rate

    from shmlog.protocol.control_client import request
    from shmlog.server.broker import Broker
    memcpy = memcpy_rate()
    conversion = _conversion()
    print(f"memcpy (np.copyto) {memcpy / 1e9:.2f} GB/s; load average "
          f"{os.getloadavg()[0]:.2f}")
    for name, seconds, size in (("Kafka -> stored (Produce)", conversion["from_kafka_s"],
                                 conversion["kafka_batch_bytes"]),
                                ("stored -> Kafka (Fetch)", conversion["to_kafka_s"],
                                 conversion["stored_batch_bytes"])):
        rate = size / seconds
        print(f"  {name:<26} {BATCH_RECORDS / seconds / 1e6:6.2f} M records/s  "
              f"{rate / 1e9:5.2f} GB/s  = {rate / memcpy:5.1%} of memcpy")
    directory = tempfile.mkdtemp(prefix="shmlog-bench-wire-")
    try:
        with Broker(os.path.join(directory, "data"),
                    listeners="PLAINTEXT://127.0.0.1:0") as broker:
            address = request(broker.data_dir, "stats")["broker"]["kafka_listeners"][0]
            clients = _clients(broker, address, arguments.records)
            print(f"librdkafka through the listener, {clients['records']:,} records of "
                  f"{RECORD_SIZE} B: produce (idempotent, acks=all, linger 5 ms) "
                  f"{clients['records'] / clients['produce_s']:,.0f} records/s "
                  f"({clients['unflushed']} unflushed); consume "
                  f"{clients['read'] / clients['consume_s']:,.0f} records/s "
                  f"({clients['read']:,} read)")
            connections = _connections(broker, address, arguments.connections)
            count = connections["connections"]
            print(f"{count} idle client connections: broker RSS "
                  f"{connections['rss_before'] / 2**20:.1f} -> "
                  f"{connections['rss_after'] / 2**20:.1f} MiB "
                  f"({(connections['rss_after'] - connections['rss_before']) / count / 1024:.1f}"
                  f" KiB each), descriptors {connections['fds_before']} -> "
                  f"{connections['fds_after']} (one each); the limits: "
                  f"max_connections_per_ip and the open-files limit")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
