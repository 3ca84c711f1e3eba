"""The ``shmlog`` command against a real broker: ``shmlog broker`` says when it
serves and when it stops (naming the signal), ``shmlog perf e2e`` works with the
default data directory, ``shmlog perf consume`` ends on a topic shorter than
``--records``, and the verbs that only ask the broker something (``topics``,
``groups``, ``transactions``) run without loading numba or numpy (they cost most of
a second of start-up; what a process imported is checked, not how long it took).

Method: run ``python -m shmlog`` as child processes, as a user would from a shell,
on a temporary data directory; every wait is bounded and the brokers' shared
memory is removed afterwards.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from shmlog import Admin, Broker, Producer
from shmlog.protocol.control_client import request

DEADLINE_S = 120


def shmlog(*arguments, **environment):
    return subprocess.run([sys.executable, "-m", "shmlog", *arguments], capture_output=True,
                          text=True, timeout=DEADLINE_S, env={**os.environ, **environment})


def test_the_broker_says_when_it_serves_and_when_it_stops(data_dir):
    broker = subprocess.Popen([sys.executable, "-m", "shmlog", "broker", "--data-dir", data_dir],
                              stderr=subprocess.PIPE, text=True)
    lines: queue.SimpleQueue = queue.SimpleQueue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in broker.stderr],
                              daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=DEADLINE_S)
        assert "serving" in first and data_dir in first, first
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=DEADLINE_S) == 0
        reader.join(timeout=DEADLINE_S)
    finally:
        broker.kill()
        broker.wait(timeout=DEADLINE_S)
    rest = "".join(_drain(lines))
    assert "stopping on SIGTERM" in rest, rest


def _drain(lines: queue.SimpleQueue) -> list[str]:
    drained = []
    while not lines.empty():
        drained.append(lines.get_nowait())
    return drained


@pytest.fixture
def short_topic(data_dir):
    """A broker serving ``events``, one partition holding 10 records."""
    with Broker(data_dir):
        Admin(data_dir).create_topic("events", 1)
        with Producer(data_dir) as producer:
            for number in range(10):
                producer.send("events", b"%d" % number, partition=0)
        yield data_dir


def test_perf_consume_stops_at_the_end_of_a_short_topic(short_topic):
    consumed = shmlog("perf", "consume", "events", "--data-dir", short_topic,
                      "--records", "1000", "--timeout-ms", "500")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.startswith("10 records in"), consumed.stdout


def test_perf_e2e_uses_the_default_data_directory(short_topic):
    latency = shmlog("perf", "e2e", "events", "--rate", "1000", "--seconds", "0.5",
                     SHMLOG_DATA_DIR=short_topic)
    assert latency.returncode == 0, latency.stderr
    assert latency.stdout.startswith("500 records at 1,000/s: latency p50"), latency.stdout


# Every topics and groups verb, as the command line gives them (DATA is the data dir).
ADMINISTRATION_VERBS = [
    ["topics", "create", "events", "--partitions", "2", "--config", "retention.ms=60000"],
    ["topics", "list"], ["topics", "describe", "events"],
    ["topics", "alter", "events", "--config", "retention.ms=120000", "--partitions", "3"],
    ["groups", "list"], ["groups", "describe", "readers"],
    ["groups", "reset-offsets", "readers", "--topic", "events", "--to-earliest", "--execute"],
    ["groups", "delete", "readers"], ["offsets", "events"], ["log-dirs"],
    ["delete-records", "--topic", "events", "--partition", "0", "--offset", "0"],
    ["groups", "describe", "--all-groups", "--state"],
    ["transactions", "list"], ["transactions", "describe", "--transactional-id", "payments"],
    ["transactions", "describe-producers", "--topic", "events", "--partition", "0"],
    ["transactions", "find-hanging", "--max-transaction-timeout", "1"],
    ["topics", "delete", "events"],
]
HEAVY_MODULES = ("numba", "numpy", "llvmlite")
COMMAND_LINE_RUNNER = """
import json, sys
from shmlog.cli import main
for arguments in json.loads(sys.argv[1]):
    if main([*arguments, "--data-dir", sys.argv[2]]) != 0:
        sys.exit(f"shmlog {' '.join(arguments)} failed")
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in sys.argv[3:])))
"""


def test_the_topics_and_groups_verbs_load_neither_numba_nor_numpy(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("committed")
        Admin(data_dir).alter_consumer_group_offsets("readers", {("committed", 0): 0})
        request(data_dir, "init_transactions", transactional_id="payments",
                transaction_timeout_ms=60_000)
        done = subprocess.run([sys.executable, "-c", COMMAND_LINE_RUNNER,
                               json.dumps(ADMINISTRATION_VERBS), data_dir, *HEAVY_MODULES],
                              capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []

