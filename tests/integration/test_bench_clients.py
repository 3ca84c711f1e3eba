"""``perf/bench_clients.py --quick`` runs to the end and reports every figure: each
per-record and batch rate beside memcpy, its goal and the load of other processes,
the e2e latency percentiles for the whole run, its first second and after it, the
aggregate rates of 1, 2 and 4 producers and the appender's drain rate alone, the
same figures in its JSON file, and nothing left behind (no data directory, no
/dev/shm object of its broker).

Method: run the benchmark as a user would, a child process in a session of its own
(so a timeout kills the broker and clients it started too), with tiny record counts.
No figure's value is checked, only that each was measured over every record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import SHARED_MEMORY_DIRECTORY, unlink_shared_memory
from shmlog.server.broker import shared_memory_prefix

BENCHMARK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "perf", "bench_clients.py")
DEADLINE_S = 600
QUICK_RECORDS = 2_000               # what --quick sends per per-record figure
QUICK_BATCH_RECORDS = 20_000        # and per batch figure
QUICK_LATENCY_RECORDS = 1_500       # 1000 records/s for 1.5 s
RATE_LINES = ("send, acks=1, linger 0 ms", "send, acks=1, linger 5 ms",
              "send_batch, 1000 per call", "poll, record objects",
              "iteration (for record in consumer)", "poll_batch, columns")
LATENCY_LINES = ("whole run", "first second", "after the first second")
SCALE_PRODUCERS = (1, 2, 4)
SCALE_LINES = {"send": "send, acks=1, linger 5 ms", "send_batch": "send_batch, 1000 per call"}
DRAIN_LINES = {"after_idle": "drain, the partition idle before",
               "after_a_drain": "drain, right after another"}
PER_RECORD = ("send_linger_0", "send_linger_5", "poll", "iteration")
BATCH = ("send_batch", "poll_batch")


def run_quick(json_path) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, BENCHMARK, "--quick", "--json", str(json_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)          # the broker and clients too
        stdout, stderr = process.communicate(timeout=60)
        found = re.search(r"broker data directory (\S+)", stdout)
        if found:
            unlink_shared_memory(found.group(1))
            shutil.rmtree(found.group(1), ignore_errors=True)
        pytest.fail(f"the benchmark did not finish within {DEADLINE_S} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.timeout(DEADLINE_S + 120)
def test_a_quick_run_prints_every_figure_and_leaves_nothing_behind(tmp_path):
    json_path = tmp_path / "bench_clients.json"
    finished = run_quick(json_path)
    found = re.search(r"broker data directory (\S+)", finished.stdout)
    assert found, finished.stdout + finished.stderr
    data_dir = found.group(1)
    left = unlink_shared_memory(data_dir)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    lines = finished.stdout.splitlines()

    assert any(re.match(r"memcpy \(np\.copyto, 256 MiB\) [\d.]+ GB/s", line) for line in lines)
    for label in RATE_LINES:
        row = [line for line in lines if line.startswith(label)]
        assert len(row) == 1, (label, finished.stdout)
        # memcpy share, the other processes' cores, the goal and its verdict
        assert re.search(r"[\d.]+%\s+[\d.]+\s+(>=|>) \S+ .*: (met|below)", row[0]), row[0]
    assert re.search(r"goal p50 <= 50 us", finished.stdout)
    for label in LATENCY_LINES:
        row = [line for line in lines if line.startswith(label)]
        assert len(row) == 1, (label, finished.stdout)
        assert len(re.findall(r"\d+\.\d", row[0])) == 4 and row[0].endswith(("met", "below"))

    assert any(re.match(r"producer scaling on \d+ cores", line) for line in lines)
    for label in SCALE_LINES.values():
        for producers in SCALE_PRODUCERS:
            name = f"{producers} producer{'s' if producers > 1 else ''}, {label}"
            row = [line for line in lines if line.startswith(name)]
            assert len(row) == 1, (name, finished.stdout)
            # memcpy share, the mean producer's rate, the ratio to one, others
            assert re.search(r"[\d.]+%(\s+[\d.]+){3}$", row[0]), row[0]
    for label in DRAIN_LINES.values():
        row = [line for line in lines if line.startswith(label)]
        assert len(row) == 1 and re.search(r"[\d.]+%(\s+[\d.]+){2}$", row[0]), finished.stdout
    assert any(line.startswith("appender drain alone: 1 ring of") for line in lines)
    assert "WARNING" not in finished.stdout
    assert any(line.startswith("others: cores other processes kept busy") for line in lines)

    document = json.loads(json_path.read_text())
    assert document["memcpy_bytes_per_s"] > 0
    results = document["results"]
    for name in PER_RECORD:
        assert results[name]["records"] == QUICK_RECORDS, name
        assert results[name]["bytes"] == QUICK_RECORDS * 100, name
    for name in BATCH:
        assert results[name]["records"] == QUICK_BATCH_RECORDS, name
    for name in (*PER_RECORD, *BATCH, "e2e"):
        assert results[name]["other_cores"] >= 0, name
    e2e = results["e2e"]
    assert e2e["sent"] == e2e["received"] == e2e["whole"]["count"] == QUICK_LATENCY_RECORDS
    assert e2e["first_second"]["count"] > 0 and e2e["after_first_second"]["count"] > 0
    assert e2e["first_second"]["count"] + e2e["after_first_second"]["count"] == \
        QUICK_LATENCY_RECORDS
    for span in ("whole", "first_second", "after_first_second"):
        figures = e2e[span]
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["p999_us"] <= \
            figures["max_us"], span

    scaling = document["scaling"]["producer_scaling"]
    for mode, moved in (("send", QUICK_RECORDS), ("send_batch", QUICK_BATCH_RECORDS)):
        assert [run["producers"] for run in scaling[mode]] == list(SCALE_PRODUCERS), mode
        for run in scaling[mode]:
            assert run["records"] == moved and run["bytes"] == moved * 100, (mode, run)
            assert len(run["per_producer_records_per_s"]) == run["producers"], (mode, run)
            assert run["records_per_s"] > 0 and run["other_cores"] >= 0, (mode, run)
    drain = document["scaling"]["drain"]
    assert drain["rings"] == 1, drain
    for name in DRAIN_LINES:
        figures = drain[name]
        assert figures["records"] == QUICK_RECORDS, (name, figures)
        # 100-byte values in batches: the batches' bytes are more than the values'
        assert figures["batch_bytes"] > figures["bytes"] == QUICK_RECORDS * 100, (name, figures)
        assert figures["records_per_s"] > 0 and figures["other_cores"] >= 0, (name, figures)

    assert not os.path.exists(data_dir)
    assert left == [] and document["shared_memory_left_by_the_run"] == []
    assert not [name for name in os.listdir(SHARED_MEMORY_DIRECTORY)
                if name.startswith(shared_memory_prefix(data_dir))]
