"""The broker's ``stats`` request in-process, and what is made of it: appends counted
per partition and broker-wide (records and bytes, across a roll), a producer's ring
fill, drain passes in the histogram, a group's lag and consumption from its
commits, the cleaner's progress; the Prometheus families of the same reply (as a
scrape exposes and a Prometheus parser reads them, cluster families too); the plain
lines of ``shmlog status``.

Method: a ``BrokerCore`` on a temporary data directory, driven as ``serve`` drives
it (``handle`` a request frame, ``drain``), with appends through the partition host
(the appender), a real ring in /dev/shm registered as a producer's, and commits
through the group coordinator. The stats service's sampler is called directly
where a test needs a sample (the loop calls it once a second). Nothing asserts on
time.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import ask, values_batch
from shmlog.cli.status import status_lines
from shmlog.common import limits
from shmlog.common.errors import LocalProtocolError, ShmlogError
from shmlog.record.records import encode_batch
from shmlog.ring import Ring
from shmlog.server.broker import BrokerConfig, BrokerCore
from shmlog.server.prometheus import MetricsServer, StatsCollector, metric_families
from shmlog.shm import ring_layout as R

CLEANING_WAIT_S = 120.0     # a cold numba cache compiles the cleaner's kernels
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": 4096,
             "min.cleanable.dirty.ratio": 0.01, "min.compaction.lag.ms": 0}


@pytest.fixture
def core(data_dir):
    core = BrokerCore(BrokerConfig(data_dir=data_dir, offsets_topic_num_partitions=1))
    try:
        core.topics.create_topic("events", 2)
        core.run_once()
        yield core
    finally:
        core.close()


def partition(stats: dict, topic: str, number: int) -> dict:
    return next(entry for entry in stats["partitions"]
                if (entry["topic"], entry["partition"]) == (topic, number))


def test_appends_are_counted_per_partition_and_in_all(core):
    core.stats.sample()
    core.host.append("events", 0, values_batch(10, 1))
    core.host.append("events", 0, values_batch(5, 2))
    core.host.append("events", 1, values_batch(3, 3))
    core.stats.sample()
    stats = ask(core, "stats")
    first = partition(stats, "events", 0)
    assert (first["log_start_offset"], first["log_end_offset"], first["high_watermark"]) == \
        (0, 15, 15)
    assert first["segments"] == 1
    assert first["records_total"] == 15
    assert first["bytes_total"] == first["size_bytes"] > 0
    assert first["records_per_s"] > 0 and first["bytes_per_s"] > 0
    assert stats["totals"]["produced_records"] == 18
    assert stats["totals"]["produced_bytes"] == \
        first["size_bytes"] + partition(stats, "events", 1)["size_bytes"]
    assert stats["broker"]["pid"] == os.getpid()
    assert stats["broker"]["uptime_s"] >= 0


def test_samples_follow_partitions_added_deleted_and_created_again(core):
    """A sample visits only the rows that moved; the set of partitions changing in
    between (a topic grown, deleted, created again on the freed rows) is still
    counted right: new partitions from their log start, gone ones forgotten."""
    core.stats.sample()
    core.host.append("events", 1, values_batch(4, 1))
    core.topics.create_topic("later", 1)
    core.host.append("later", 0, values_batch(6, 2))
    core.stats.sample()
    core.stats.sample()                                       # nothing moved: nothing added
    stats = ask(core, "stats")
    assert partition(stats, "events", 0)["records_total"] == 0
    assert partition(stats, "events", 1)["records_total"] == 4
    assert partition(stats, "later", 0)["records_total"] == 6
    assert stats["totals"]["produced_records"] == 10
    ask(core, "delete_topic", name="later")
    ask(core, "create_topic", name="later", partitions=2)
    core.host.append("later", 1, values_batch(3, 3))
    core.stats.sample()
    stats = ask(core, "stats")
    assert [partition(stats, "later", number)["records_total"] for number in (0, 1)] == [0, 3]
    assert stats["totals"]["produced_records"] == 13


def test_bytes_appended_across_a_roll_are_counted(core):
    core.topics.create_topic("small", 1, {"segment.bytes": 4096})
    core.stats.sample()
    for seed in range(8):
        core.host.append("small", 0, values_batch(10, seed, size=100))
    core.stats.sample()
    entry = partition(ask(core, "stats"), "small", 0)
    assert entry["segments"] > 1, "the appends rolled the segment"
    assert entry["records_total"] == 80
    assert entry["bytes_total"] == entry["size_bytes"]


def test_a_producer_ring_shows_its_fill_until_drained(core):
    name = f"{core.prefix}-producer-{os.getpid()}-stats"
    ring = Ring.create(name, R.CAPACITY_MIN)
    try:
        ask(core, "register_producer", ring=name)
        ring.put(core.host.appender.destination("events", 0), encode_batch([b"x" * 100]),
                 timeout_ms=0)
        [producer] = ask(core, "stats")["producers"]
        assert (producer["ring"], producer["pid"], producer["acks_all"]) == \
            (name, os.getpid(), False)
        assert producer["used_bytes"] == producer["bytes_total"] > 100
        assert producer["fill"] == producer["used_bytes"] / producer["capacity_bytes"]
        assert producer["entries_total"] == 1
        passes = ask(core, "stats")["appender"]["drain_seconds"]["count"]
        core.host.drain()
        stats = ask(core, "stats")
        assert stats["producers"][0]["used_bytes"] == 0
        assert stats["appender"]["drain_seconds"]["count"] == passes + 1
        assert stats["appender"]["entries_drained"] >= 1
        assert stats["totals"]["producers"] == 1
    finally:
        ask(core, "unregister_producer", ring=name)
        ring.unlink()
        ring.close()


def test_a_groups_lag_and_consumption_come_from_its_commits(core):
    core.host.append("events", 0, values_batch(20, 1))
    ask(core, "commit_offsets", group_id="readers", offsets=[["events", 0, 5, ""]])
    core.stats.sample()
    ask(core, "commit_offsets", group_id="readers", offsets=[["events", 0, 12, ""]])
    core.stats.sample()
    stats = ask(core, "stats")
    [group] = stats["groups"]
    assert (group["group_id"], group["members"], group["lag"]) == ("readers", 0, 8)
    [entry] = group["partitions"]
    assert (entry["topic"], entry["partition"], entry["committed"], entry["log_end_offset"],
            entry["lag"]) == ("events", 0, 12, 20, 8)
    assert entry["records_per_s"] > 0 and entry["bytes_per_s_estimated"] > 0
    assert stats["totals"]["consumed_records"] == 7
    offsets = [entry for entry in stats["partitions"] if entry["internal"]]
    assert [entry["topic"] for entry in offsets] == ["__consumer_offsets"]


def test_the_cleaners_progress_is_shown(core):
    core.topics.create_topic("compacted", 1, COMPACTED)
    for seed in range(10):
        core.host.append("compacted", 0, values_batch(10, seed, size=100))
    assert core.host.start_cleaning()
    assert ask(core, "stats")["cleaner"]["cleaning"] == ["compacted", 0]
    deadline = time.monotonic() + CLEANING_WAIT_S
    while not core.host.swap_cleaned():
        assert time.monotonic() < deadline, "the cleaning did not finish"
        time.sleep(0.01)
    cleaner = ask(core, "stats")["cleaner"]
    assert (cleaner["cleanings"], cleaner["failures"], cleaner["cleaning"]) == (1, 0, None)
    assert 0 < cleaner["bytes_after"] < cleaner["bytes_before"]
    assert cleaner["last_seconds"] >= 0
    [entry] = cleaner["partitions"]
    assert entry["clean_offset"] > 0
    assert entry["dirty_records"] == 100 - entry["clean_offset"]


def scrape(stats: dict) -> dict:
    """{(sample name, labels as sorted tuples): value} of one stats reply, exposed as
    prometheus-client exposes it and parsed back by its parser."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(lambda: stats))
    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_prometheus_families_carry_the_stats_numbers(core):
    core.stats.sample()
    core.host.append("events", 1, values_batch(7, 1))
    ask(core, "commit_offsets", group_id="readers", offsets=[["events", 1, 2, ""]])
    core.host.drain_soon()
    core.host.drain()
    core.stats.sample()
    stats = ask(core, "stats")
    samples = scrape(stats)
    events_1 = (("partition", "1"), ("topic", "events"))
    assert samples[("shmlog_partition_log_end_offset", events_1)] == 7
    assert samples[("shmlog_partition_high_watermark", events_1)] == 7
    assert samples[("shmlog_partition_appended_records_total", events_1)] == 7
    assert samples[("shmlog_partition_size_bytes", events_1)] == \
        partition(stats, "events", 1)["size_bytes"]
    assert samples[("shmlog_produced_records_total", ())] == 7 + 1   # and the commit's record
    assert samples[("shmlog_group_lag", (("group", "readers"),) + events_1)] == 5
    assert samples[("shmlog_group_committed_offset", (("group", "readers"),) + events_1)] == 2
    drain = stats["appender"]["drain_seconds"]
    assert samples[("shmlog_appender_drain_seconds_count", ())] == drain["count"] > 0
    assert samples[("shmlog_appender_drain_seconds_bucket", (("le", "+Inf"),))] == drain["count"]
    assert samples[("shmlog_broker_uptime_seconds", ())] >= 0
    assert samples[("shmlog_stats_up", ())] == 1
    assert not any(name.startswith("shmlog_cluster_") for name, _ in samples)


def test_a_cluster_members_families():
    stats = {"broker": {"started_ms": 1_700_000_000_000, "uptime_s": 5.0},
             "totals": {"produced_records": 0, "produced_bytes": 0, "consumed_records": 0,
                        "producers": 0},
             "partitions": [], "producers": [], "groups": [],
             "appender": {"drain_seconds": {"buckets": [[0.001, 0], ["+Inf", 0]], "count": 0,
                                            "sum": 0.0}, "entries_drained": 0,
                          "appends_refused_storage": 0},
             "cleaner": {"cleanings": 0, "failures": 0, "bytes_before": 0, "bytes_after": 0,
                         "last_seconds": None, "cleaning": None, "partitions": []},
             "cluster": {"broker_id": 2, "controller": True, "live_brokers": [1, 2, 3],
                         "leader_count": 4, "under_replicated_partitions": 1,
                         "offline_partitions": 2, "isr_shrinks": 3, "isr_expands": 5}}
    samples = scrape(stats)
    assert samples[("shmlog_cluster_leader_count", ())] == 4
    assert samples[("shmlog_cluster_under_replicated_partitions", ())] == 1
    assert samples[("shmlog_cluster_offline_partitions", ())] == 2
    assert samples[("shmlog_cluster_controller", ())] == 1
    assert samples[("shmlog_cluster_live_brokers", ())] == 3
    assert samples[("shmlog_cluster_isr_shrinks_total", ())] == 3
    assert samples[("shmlog_cluster_isr_expands_total", ())] == 5
    assert samples[("shmlog_broker_start_time_seconds", ())] == 1_700_000_000
    assert all(family.name.startswith("shmlog_") for family in metric_families(stats))


def test_the_status_view_lines(core):
    core.host.append("events", 0, values_batch(4, 1))
    ask(core, "commit_offsets", group_id="readers", offsets=[["events", 0, 1, ""]])
    lines = status_lines(ask(core, "stats"))
    assert lines[0].startswith(f"broker {os.getpid()}  up ")
    assert lines[1] == "metrics off (shmlog broker --metrics-port N)"
    assert lines[2] == "kafka off (shmlog broker --listeners PLAINTEXT://127.0.0.1:9092)"
    assert re.fullmatch(r"appender: \d+ entries in \d+ drain passes, p50 (-|<= [\d.]+ (us|ms|s)), "
                        r"p99 (-|<= [\d.]+ (us|ms|s))", lines[4]), lines[4]
    header = next(index for index, line in enumerate(lines) if line.startswith("TOPIC"))
    assert lines[header].split() == ["TOPIC", "PARTITION", "START", "END", "HW", "LSO", "SIZE",
                                     "SEGMENTS", "RECORDS/S", "BYTES/S"]
    assert lines[header + 1].split()[:5] == ["events", "0", "0", "4", "4"]
    assert lines[header + 2].split()[:5] == ["events", "1", "0", "0", "0"]
    assert any(line.startswith("__consumer_offsets (internal): 1 partitions") for line in lines)
    assert "producers: none registered" in lines
    group = next(line for line in lines if line.startswith("readers"))
    assert group.split()[:8] == ["readers", "Empty", "0", "events", "0", "1", "4", "3"]
    assert any(line.startswith("cleaner: idle, 0 cleanings") for line in lines)


def test_the_metrics_settings_are_checked():
    assert BrokerConfig.load(metrics_port=0).metrics_address == "127.0.0.1"
    assert BrokerConfig.load().metrics_port is None                  # off unless asked
    for port in (-1, 65_536):
        with pytest.raises(LocalProtocolError, match="metrics_port"):
            BrokerConfig.load(metrics_port=port)


def test_a_scrape_the_broker_does_not_answer_says_so(data_dir):
    server = MetricsServer(data_dir, 0, "127.0.0.1")            # no broker runs there
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=30) as response:
            text = response.read().decode()
        [family] = text_string_to_metric_families(text)
        assert (family.name, [sample.value for sample in family.samples]) == \
            ("shmlog_stats_up", [0])
    finally:
        server.stop()


def test_scrapes_share_a_render_for_a_while_and_only_get_renders(data_dir):
    """Scrapers in a loop cannot make the broker's loop answer stats continuously:
    one render per limits.METRICS_SCRAPE_CACHE_S and set of headers."""
    asked = []
    server = MetricsServer(data_dir, 0, "127.0.0.1")
    try:
        server.registry = CollectorRegistry(auto_describe=False)

        def read_stats():
            asked.append(1)
            raise ShmlogError("no broker here")             # a scrape of stats_up 0

        server.registry.register(StatsCollector(read_stats))
        cache_s = limits.METRICS_SCRAPE_CACHE_S
        first = server.scrape("", "", (), 100.0)
        assert server.scrape("", "", (), 100.0 + cache_s / 2) is first and len(asked) == 1
        assert server.scrape("", "gzip", (), 100.0 + cache_s / 2)[1][-1] == \
            ("Content-Encoding", "gzip")                     # other headers: their render
        server.scrape("", "", (), 100.0 + cache_s)
        assert len(asked) == 3
        assert server.respond("POST", "/metrics", {})[0] == "405 Method Not Allowed"
        assert server.respond("GET", "/favicon.ico", {}) == ("200 OK", [], b"")
    finally:
        server.stop()
