"""A Jepsen-style transactional workload on one host: transactional producers
(processes, one per transactional id) write transactions of random sizes over three
partitions and commit or abort them, a read_committed consumer reads all along, and a
nemesis kills producers and the broker (the transaction coordinator with it) with
SIGKILL at seeded random moments, starting each again. The history checker
(tests/cluster/history.py) then holds the log to its rules: one value per offset, no
acknowledged value lost, no duplicates, reads kept, read_committed never sees an
aborted value, and every transaction is in the committed log all or none (all once
committed).

Method: one broker process at a time; producers as ``python -c`` children that report
each step on their stdout before taking it (a transaction begun, a value sent, a
commit started and done, an abort done, the acknowledged offsets); what a killed
producer was doing decides its transaction's end (never committing: open, aborted by
its successor's fencing; killed while committing: unknown). At the end a fresh
producer of each transactional id fences whatever was left open, and the final logs
are read with read_uncommitted and read_committed. Every wait bounded; every process
killed or ended before the test returns.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from cluster.history import History, TransactionEnd
from helpers import RestartableBroker
from shmlog import Admin, Consumer, Producer
from shmlog.client.consumer import TopicPartition

PARTITIONS = 3
PRODUCERS = 3
NEMESIS_S = 12.0
WAIT_S = 60.0
POLL_MS = 100
SEED = int(os.environ.get("SHMLOG_TEST_SEED", "98"))

# One transactional producer: reports every step before it takes it.
PRODUCER = r"""
import random, sys
from shmlog import Producer

data_dir, transactional_id, run, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
chance = random.Random(seed)
def say(*words):
    print(*words, flush=True)
producer = Producer(data_dir, transactional_id=transactional_id, acks="all", linger_ms=1)
producer.init_transactions()
say("R")
for number in range(10**9):
    name = f"{transactional_id}/{run}/{number}"
    producer.begin_transaction()
    futures = []
    for index in range(chance.randint(1, 8)):
        partition, value = chance.randrange(3), f"{name}/{index}"
        say("S", name, partition, value)
        futures.append((value, producer.send("tx", value.encode(), partition=partition)))
    if chance.random() < 0.25:
        producer.abort_transaction()
        say("X", name)
        continue
    say("C?", name)
    try:
        producer.commit_transaction()
    except Exception as error:
        say("U", name, type(error).__name__)
        raise
    say("C", name)
    for value, future in futures:
        say("A", value, future.get(10).offset)
"""


class ProducerProcess:
    """One run of a transactional producer, its reports fed into the history."""

    def __init__(self, data_dir: str, transactional_id: str, run: int, history: History):
        self.history = history
        self.committing: set[str] = set()
        self.process = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, data_dir, transactional_id, str(run),
             str(SEED * 1000 + run)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        self.reader = threading.Thread(target=self._follow, daemon=True)
        self.reader.start()

    def _follow(self) -> None:
        for line in self.process.stdout:
            kind, *words = line.split()
            if kind == "S":
                self.history.send(words[2].encode(), int(words[1]), acks="all",
                                  transaction=words[0])
            elif kind == "C?":
                self.committing.add(words[0])
            elif kind == "C":
                self.committing.discard(words[0])
                self.history.end(words[0], TransactionEnd.COMMITTED)
            elif kind == "X":
                self.history.end(words[0], TransactionEnd.ABORTED)
            elif kind == "A":
                self.history.ack(words[0].encode(), int(words[1]))

    def kill(self) -> None:
        """Kill it (if alive) and settle what its reports leave undecided."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT_S)
        self.reader.join(WAIT_S)
        for name in self.committing:          # killed (or failed) while committing
            self.history.end(name, TransactionEnd.UNKNOWN)
        self.committing.clear()


def _read_committed_all_along(data_dir: str, history: History, stop: threading.Event) -> None:
    """A read_committed consumer reading "tx" until ``stop``, again after any error (the
    broker killed under it)."""
    while not stop.is_set():
        try:
            with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                          isolation_level="read_committed") as consumer:
                consumer.assign([TopicPartition("tx", p) for p in range(PARTITIONS)])
                while not stop.is_set():
                    for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                        history.read_many(partition.partition,
                                          [(r.offset, r.value) for r in records],
                                          reader="read_committed", committed=True)
        except Exception:                     # noqa: BLE001 - the nemesis at work
            stop.wait(0.2)


def _final_logs(data_dir: str, isolation_level: str) -> dict[int, list]:
    """Every (offset, value) of "tx" a fresh consumer reads, by partition."""
    found = {p: [] for p in range(PARTITIONS)}
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                  isolation_level=isolation_level) as consumer:
        partitions = [TopicPartition("tx", p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(p) < ends[p] for p in partitions):
            assert time.monotonic() < deadline, "the final read did not reach the end"
            for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                found[partition.partition] += [(r.offset, r.value) for r in records]
    return found


@pytest.fixture
def brokers(data_dir):
    made = RestartableBroker(data_dir, liveness_check_interval_ms=200)
    try:
        with Admin(data_dir) as admin:
            admin.create_topic("tx", PARTITIONS)
        yield made
    finally:
        made.stop()


def test_transactions_hold_under_killed_producers_and_brokers(brokers):
    data_dir = brokers.data_dir
    history = History()
    chance = random.Random(SEED)
    runs = 0
    producers = {}
    stop = threading.Event()
    reader = threading.Thread(target=_read_committed_all_along, args=(data_dir, history, stop),
                              daemon=True)
    kills = {"producer": 0, "broker": 0}

    def start(transactional_id: str) -> None:
        nonlocal runs
        runs += 1
        producers[transactional_id] = ProducerProcess(data_dir, transactional_id, runs, history)

    try:
        for number in range(PRODUCERS):
            start(f"p{number}")
        reader.start()
        deadline = time.monotonic() + NEMESIS_S
        while time.monotonic() < deadline:
            time.sleep(chance.uniform(0.3, 1.2))
            if chance.random() < 0.3:
                brokers.kill_and_start()
                kills["broker"] += 1
            else:
                victim = chance.choice(sorted(producers))
                producers[victim].kill()
                start(victim)
                kills["producer"] += 1
            for transactional_id, producer in sorted(producers.items()):
                if producer.process.poll() is not None:      # failed with its broker
                    producer.kill()
                    start(transactional_id)
    finally:
        stop.set()
        for producer in producers.values():
            producer.kill()
        reader.join(WAIT_S)
    # A fresh producer of each id fences (and aborts) what its last run left open.
    for transactional_id in sorted(producers):
        with Producer(data_dir, transactional_id=transactional_id) as fencer:
            fencer.init_transactions()
    verdict = history.check(_final_logs(data_dir, "read_uncommitted"),
                            committed_logs=_final_logs(data_dir, "read_committed"))
    print(verdict, kills)
    verdict.assert_ok()
    assert kills["producer"] and kills["broker"], kills
    assert verdict.counts["transactions committed"] and verdict.counts["transactions aborted"]
    assert verdict.counts["reads"], "the read_committed consumer read nothing"
