"""Observability against a real broker: its Prometheus endpoint (``--metrics-port``)
scraped over HTTP by a real client and parsed by prometheus-client's parser, with
values equal to what was produced and committed; ``shmlog status`` once (``--json``
parsed, the plain view's lines, no numba nor numpy loaded), redrawn with ``--watch``
for a bounded number of views, and ended by Ctrl-C (SIGINT) with status 130, also when
it was started with SIGINT ignored (as a shell starts a background command);
``Producer.metrics()`` and ``Consumer.metrics()`` counting what went through them.

Method: one broker process for the module (``Broker(..., metrics_port=0)``: a free
port, which the ``stats`` reply names), real producers and consumers in this
process, ``shmlog status`` as child processes. The broker samples its offsets once
a second, so a test waits (bounded) for the sample that covers what it produced;
nothing asserts on time. The broker's shared memory is removed at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import unlink_shared_memory
from shmlog import Admin, Broker, Consumer, Producer, TopicPartition
from shmlog.protocol.control_client import request

DEADLINE_S = 60
POLL_S = 0.1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("observability") / "data")
    try:
        with Broker(data_dir, metrics_port=0) as running:
            Admin(data_dir).create_topic("events", 2)
            yield running
    finally:
        unlink_shared_memory(data_dir)


def scrape(url: str) -> dict:
    """{(sample name, labels as sorted tuples): value}, read over HTTP and parsed."""
    with urllib.request.urlopen(url, timeout=DEADLINE_S) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape_until(url: str, key: tuple, value: float) -> dict:
    """Scrape until the sample ``key`` has ``value`` (the broker's next sample)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        samples = scrape(url)
        if samples.get(key) == value or time.monotonic() > deadline:
            return samples
        time.sleep(POLL_S)


def shmlog(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmlog", *arguments], capture_output=True,
                          text=True, timeout=DEADLINE_S)


def test_the_metrics_endpoint_serves_what_was_produced_and_committed(broker):
    url = request(broker.data_dir, "stats")["broker"]["metrics_url"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    with Producer(broker.data_dir) as producer:
        for number in range(100):
            producer.send("events", b"record %d" % number, partition=0)
        for number in range(50):
            producer.send("events", b"record %d" % number, partition=1)
        producer.flush(timeout=DEADLINE_S)
        Admin(broker.data_dir).alter_consumer_group_offsets("readers", {("events", 0): 60})
        events_0 = (("partition", "0"), ("topic", "events"))
        samples = scrape_until(url, ("shmlog_partition_appended_records_total", events_0), 100)
        ring = (("producer_id", str(producer.producer_id)), ("ring", producer.ring.name))
        assert samples[("shmlog_producer_ring_capacity_bytes", ring)] == producer.ring.capacity
        assert samples[("shmlog_producer_ring_entries_total", ring)] >= 1
    events_1 = (("partition", "1"), ("topic", "events"))
    assert samples[("shmlog_partition_appended_records_total", events_0)] == 100
    assert samples[("shmlog_partition_log_end_offset", events_0)] == 100
    assert samples[("shmlog_partition_high_watermark", events_1)] == 50
    assert samples[("shmlog_partition_size_bytes", events_0)] > 100 * len(b"record 99")
    assert samples[("shmlog_group_committed_offset", (("group", "readers"),) + events_0)] == 60
    assert samples[("shmlog_group_lag", (("group", "readers"),) + events_0)] == 40
    assert samples[("shmlog_appender_drain_seconds_count", ())] > 0
    assert samples[("shmlog_appender_entries_drained_total", ())] >= 2
    assert samples[("shmlog_producers", ())] == 1
    assert samples[("shmlog_stats_up", ())] == 1


def test_status_json_is_the_brokers_stats(broker):
    done = shmlog("status", "--data-dir", broker.data_dir, "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["broker"]["pid"] == broker.process.pid
    assert status["broker"]["data_dir"] == broker.data_dir
    assert status["broker"]["metrics_url"].startswith("http://127.0.0.1:")
    assert status["cluster"] is None and "cluster_status" not in status
    names = {(entry["topic"], entry["partition"]) for entry in status["partitions"]}
    assert {("events", 0), ("events", 1)} <= names


def test_status_prints_the_plain_view(broker):
    done = shmlog("status", "--data-dir", broker.data_dir)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"broker {broker.process.pid}  up ")
    assert lines[1].startswith("metrics http://127.0.0.1:")
    assert any(line.split()[:2] == ["events", "0"] for line in lines)
    assert any(line.startswith("cleaner: ") for line in lines)


def test_watch_redraws_a_bounded_number_of_views(broker):
    done = shmlog("status", "--data-dir", broker.data_dir, "--watch", "0.1", "--iterations", "3")
    assert done.returncode == 0, done.stderr
    assert sum(line.startswith("broker ") for line in done.stdout.splitlines()) == 3
    assert "\x1b[2J" not in done.stdout, "no screen clearing when not on a terminal"
    done = shmlog("status", "--data-dir", broker.data_dir, "--json", "--watch", "0.1",
                  "--iterations", "2")
    assert done.returncode == 0, done.stderr
    views = [json.loads(line) for line in done.stdout.splitlines()]
    assert [view["broker"]["pid"] for view in views] == [broker.process.pid] * 2


def ignore_sigint() -> None:
    """What a shell does to a command it starts in the background (``cmd &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", [None, ignore_sigint],
                         ids=["sigint-default", "sigint-ignored-by-the-parent"])
def test_ctrl_c_ends_a_watch_cleanly(broker, inherited):
    watching = subprocess.Popen([sys.executable, "-m", "shmlog", "status", "--data-dir",
                                 broker.data_dir, "--watch", "0.2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=inherited)
    try:
        assert watching.stdout.readline().startswith("broker ")   # it draws, then waits
        watching.send_signal(signal.SIGINT)
        assert watching.wait(timeout=DEADLINE_S) == 130      # 128 + SIGINT
        assert "Traceback" not in watching.stderr.read()
    finally:
        watching.kill()
        watching.wait(timeout=DEADLINE_S)
        watching.stdout.close()
        watching.stderr.close()


def test_the_clients_metrics_count_what_went_through_them(broker):
    Admin(broker.data_dir).create_topic("clients", 1)
    with Producer(broker.data_dir, linger_ms=0) as producer:
        for number in range(10):
            producer.send("clients", b"value %d" % number)
        producer.flush(timeout=DEADLINE_S)
        metrics = producer.metrics()
    sent = metrics["producer-metrics"]
    assert sent["record-send-total"] == 10
    assert sent["byte-total"] > 10 * len(b"value 0")
    assert 1 <= sent["request-total"] <= 10
    assert sent["record-send-rate"] > 0 and sent["byte-rate"] > 0
    assert (sent["record-error-total"], sent["requests-in-flight"]) == (0, 0)
    assert sent["buffer-available-bytes"] == sent["buffer-total-bytes"] == producer.ring.capacity
    assert metrics["producer-topic-metrics.clients"]["record-send-total"] == 10

    partition = TopicPartition("clients", 0)
    with Consumer(bootstrap=broker.data_dir, group_id="metered") as consumer:
        consumer.assign([partition])
        consumer.seek(partition, 0)
        assert consumer.metrics()["consumer-fetch-manager-metrics"]["records-lag-max"] == 10
        polled = sum(len(records) for records in consumer.poll(timeout_ms=DEADLINE_S * 1000)
                     .values())
        consumer.commit()
        metrics = consumer.metrics()
    fetched = metrics["consumer-fetch-manager-metrics"]
    assert fetched["records-consumed-total"] == polled == 10
    assert fetched["bytes-consumed-total"] > 10 * len(b"value 0")
    assert fetched["fetch-total"] >= 1 and fetched["records-lag-max"] == 0
    assert metrics["consumer-fetch-manager-metrics.clients"]["records-consumed-total"] == 10
    assert metrics["consumer-coordinator-metrics"] == {
        "commit-total": 1, "commit-rate": metrics["consumer-coordinator-metrics"]["commit-rate"],
        "assigned-partitions": 1}


LIGHTNESS_CHECK = """
import json, sys
from shmlog.cli import main
if main(["status", "--data-dir", sys.argv[1], "--json"]) != 0:
    sys.exit("shmlog status failed")
print(json.dumps(sorted(name for name in sys.modules
                        if name.split(".")[0] in ("numba", "numpy", "llvmlite"))))
"""


def test_status_loads_neither_numba_nor_numpy(broker):
    done = subprocess.run([sys.executable, "-c", LIGHTNESS_CHECK, broker.data_dir],
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
