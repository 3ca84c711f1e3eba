"""The metrics endpoint under many connections, and the broker at its open-files limit:
one thread serves every connection, connections beyond the cap are closed at once,
idle ones time out, and periodic work refused by the limit is logged once and
recovers (issue 27, row 3).

Method: a real broker process with ``--metrics-port 0`` whose soft open-files limit
the test lowers with ``prlimit`` (as ``test_process_limits`` does), real TCP
connections that send nothing, real scrapes over HTTP, a real producer and
consumer. Threads are counted in ``/proc/PID/task``, its descriptors in
``/proc/PID/fd``; what it logs is read from its output file. Every wait is bounded;
nothing asserts on time.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shmlog import Admin, Broker, Consumer, Producer, TopicPartition
from shmlog.common import limits
from shmlog.protocol.control_client import request

WAIT_S = 60
POLL_S = 0.05
# Descriptors the broker may open beyond those it holds and the metrics connections:
# a ring being mapped, a file being reserved, the producer's and consumer's requests.
SLACK = 32
REFUSED = "refused by a limit (RLIMIT_NOFILE)"
RECOVERED = "periodic work runs again"


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def descriptors(pid: int) -> list[int]:
    return sorted(int(name) for name in os.listdir(f"/proc/{pid}/fd"))


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT_S} s: {what}")
        time.sleep(POLL_S)
    return found


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=WAIT_S) as response:
        text = response.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def idle_connections(url: str, count: int, *, wait: bool = True) -> list[socket.socket]:
    """``count`` connections to the endpoint of ``url`` that send nothing; not
    ``wait``: connecting (non-blocking), whether or not the server accepts them."""
    host, port = url.split("/")[2].rsplit(":", 1)
    if wait:
        return [socket.create_connection((host, int(port)), timeout=WAIT_S)
                for _ in range(count)]
    connections = []
    for _ in range(count):
        connection = socket.socket()
        connection.setblocking(False)
        connection.connect_ex((host, int(port)))
        connections.append(connection)
    return connections


def produce_and_consume(data_dir: str, value: bytes) -> None:
    with Producer(data_dir) as producer:
        offset = producer.send("events", value, partition=0).get(WAIT_S).offset
    consumer = Consumer(bootstrap=data_dir, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition("events", 0)])
        consumer.seek(TopicPartition("events", 0), offset)
        records = wait_for(lambda: consumer.poll(timeout_ms=200).get(
            TopicPartition("events", 0)), f"the record at {offset}")
        assert records[0].value == value
    finally:
        consumer.close()


def log_lines(path: str, text: str) -> list[str]:
    with open(path, errors="replace") as output:
        return [line for line in output if text in line]


@pytest.fixture
def broker(data_dir, tmp_path):
    output = str(tmp_path / "broker.log")
    with Broker(data_dir, metrics_port=0, liveness_check_interval_ms=50,
                output=output) as running:
        running.log = output
        running.url = request(data_dir, "stats")["broker"]["metrics_url"]
        Admin(data_dir).create_topic("events", 1)
        assert scrape(running.url)["shmlog_stats_up"] == 1   # its ZeroMQ client made
        yield running


def test_idle_connections_beyond_the_cap_take_no_thread_and_time_out(broker):
    pid = broker.process.pid
    before = threads(pid)
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE,
                     (descriptors(pid)[-1] + 1 + limits.METRICS_CONNECTIONS_MAX + SLACK, hard))
    idle = idle_connections(broker.url, 3 * limits.METRICS_CONNECTIONS_MAX)
    try:
        # Accepted in order: the last ones are beyond the cap, and closed at once.
        assert idle[-1].recv(1) == b""
        assert threads(pid) <= before + 2          # not one per connection
        produce_and_consume(broker.data_dir, b"while idle connections are held")
        for connection in idle:                    # the broker ends every one of them
            assert connection.recv(1) == b""
        assert scrape(broker.url)["shmlog_stats_up"] == 1
    finally:
        for connection in idle:
            connection.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    assert threads(pid) <= before + 2
    assert broker.process.poll() is None


def test_periodic_work_at_the_open_files_limit_is_logged_once_and_recovers(broker):
    pid = broker.process.pid
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (descriptors(pid)[-1] + 1 + 4, hard))
    idle = idle_connections(broker.url, 32, wait=False)   # take the descriptors left
    try:
        wait_for(lambda: log_lines(broker.log, REFUSED), "the limit logged")
        time.sleep(20 * 0.05)                      # twenty liveness checks, refused
        assert broker.process.poll() is None
    finally:
        for connection in idle:
            connection.close()
    wait_for(lambda: len(log_lines(broker.log, RECOVERED)) == len(log_lines(broker.log, REFUSED)),
             "the periodic work running again")
    with open(broker.log, errors="replace") as output:
        text = output.read()
    first_run = text[:text.index(RECOVERED)]
    assert first_run.count(REFUSED) == 1           # once, not at every check
    [line] = [line for line in first_run.splitlines() if REFUSED in line]
    assert "ulimit -n" in line and "check_liveness" in line
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    produce_and_consume(broker.data_dir, b"after the limit")
    assert scrape(broker.url)["shmlog_stats_up"] == 1
    assert broker.process.poll() is None

