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
import threading
import time

import pytest

from cluster.history import History
from cluster.transactional_workload import (
    PARTITIONS,
    TOPIC,
    WAIT_S,
    ProducerProcess,
    final_logs,
    read_committed_all_along,
)
from helpers import RestartableBroker
from shmlog import Admin, Producer

PRODUCERS = 3
NEMESIS_S = 12.0
SEED = int(os.environ.get("SHMLOG_TEST_SEED", "98"))

@pytest.fixture
def brokers(data_dir):
    made = RestartableBroker(data_dir, liveness_check_interval_ms=200)
    try:
        with Admin(data_dir) as admin:
            admin.create_topic(TOPIC, PARTITIONS)
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
    reader = threading.Thread(target=read_committed_all_along, args=(data_dir, history, stop),
                              daemon=True)
    kills = {"producer": 0, "broker": 0}

    def start(transactional_id: str) -> None:
        nonlocal runs
        runs += 1
        producers[transactional_id] = ProducerProcess(data_dir, transactional_id, runs, history,
                                                      SEED)

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
    verdict = history.check(final_logs(data_dir, "read_uncommitted"),
                            committed_logs=final_logs(data_dir, "read_committed"))
    print(verdict, kills)
    verdict.assert_ok()
    assert kills["producer"] and kills["broker"], kills
    assert verdict.counts["transactions committed"] and verdict.counts["transactions aborted"]
    assert verdict.counts["reads"], "the read_committed consumer read nothing"
