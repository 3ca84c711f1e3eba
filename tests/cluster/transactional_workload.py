"""A transactional workload for Jepsen-style tests (one broker's, a cluster's):
producer processes that report every step before they take it, a read_committed
consumer reading all along, and the final logs, all fed to the history checker
(``history.History``, rules 6 and 7).

A producer process writes transactions of random sizes (1-8 records) over the
topic's partitions, aborts a quarter of them and commits the rest, saying so on its
stdout: ``R`` ready, ``S name partition value`` before a send, ``C? name`` before a
commit, ``C name`` once committed, ``X name`` once aborted, ``U name error`` when a
commit failed (it then exits), ``A value offset`` for each committed value. What a
killed producer was doing decides its transaction's end: never committing, it is
open (its successor's fencing aborts it); killed while committing, unknown.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from cluster.history import History, TransactionEnd
from shmlog import Consumer
from shmlog.client.consumer import TopicPartition
from shmlog.common import limits

TOPIC = "tx"
PARTITIONS = 3
WAIT_S = 60.0
POLL_MS = 100

# One transactional producer: reports every step before it takes it.
PRODUCER = r"""
import random, sys
from shmlog import Producer

data_dir, transactional_id, run, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
topic, timeout_ms = sys.argv[5], int(sys.argv[6])
chance = random.Random(seed)
def say(*words):
    print(*words, flush=True)
producer = Producer(data_dir, transactional_id=transactional_id, acks="all", linger_ms=1,
                    transaction_timeout_ms=timeout_ms)
producer.init_transactions()
say("R")
for number in range(10**9):
    name = f"{transactional_id}/{run}/{number}"
    producer.begin_transaction()
    futures = []
    for index in range(chance.randint(1, 8)):
        partition, value = chance.randrange(3), f"{name}/{index}"
        say("S", name, partition, value)
        futures.append((value, producer.send(topic, value.encode(), partition=partition)))
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

    def __init__(self, data_dir: str, transactional_id: str, run: int, history: History,
                 seed: int, topic: str = TOPIC,
                 timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS_DEFAULT):
        self.history = history
        self.committing: set[str] = set()
        self.process = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, data_dir, transactional_id, str(run),
             str(seed * 1000 + run), topic, str(timeout_ms)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._follow, daemon=True)
        self.reader.start()

    def _follow(self) -> None:
        for line in self.process.stdout:
            if not line.endswith("\n"):
                break         # cut short by a kill: its step was never taken (told first)
            kind, *words = line.split() or ["-"]
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


def read_committed_all_along(data_dir: str, history: History, stop: threading.Event,
                             topic: str = TOPIC) -> None:
    """A read_committed consumer reading ``topic`` until ``stop``, again after any error
    (the broker killed under it)."""
    while not stop.is_set():
        try:
            with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                          isolation_level="read_committed") as consumer:
                consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
                while not stop.is_set():
                    for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                        history.read_many(partition.partition,
                                          [(r.offset, r.value) for r in records],
                                          reader="read_committed", committed=True)
        except Exception:                     # noqa: BLE001 - the nemesis at work
            stop.wait(0.2)


def final_logs(data_dir: str, isolation_level: str, topic: str = TOPIC) -> dict[int, list]:
    """Every (offset, value) of ``topic`` a fresh consumer reads, by partition."""
    found = {p: [] for p in range(PARTITIONS)}
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                  isolation_level=isolation_level) as consumer:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(p) < ends[p] for p in partitions):
            assert time.monotonic() < deadline, "the final read did not reach the end"
            for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                found[partition.partition] += [(r.offset, r.value) for r in records]
    return found
