"""``perf/bench_scale.py`` at two tiny points of each section runs to the end and
reports every figure: each partitions figure with its growth and goal, each
producers point with its rates and the producer past ``producers_max`` refused, the
same figures in its JSON file, and nothing left behind (no data directory, no
/dev/shm object of its brokers).

Method: run the benchmark as a user would, a child process in a session of its own
(so a timeout kills the brokers and clients it started too), at 10 and 20
partitions and 2 and 3 producers with short waits. No figure's value is checked,
only that each was measured.
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
    os.path.abspath(__file__)))), "perf", "bench_scale.py")
DEADLINE_S = 600
PARTITIONS = (10, 20)
PRODUCERS = (2, 3)
ROWS = ("create, one topic", "create, topics of 10", "create, topics of 10, one per request",
        "first record to all",
        "first record, per partition", "RSS added, idle partitions",
        "RSS added beyond data, 1 rec each", "open files added, idle", "open files added",
        "segment files", "mappings added, idle", "mappings added", "idle CPU, % of a core",
        "restart to serving")
STEPS = ("create", "first_records", "idle", "restart", "create_topics_of_ten",
         "create_topics_one_by_one")


def run(json_path) -> tuple[subprocess.CompletedProcess, list[str]]:
    process = subprocess.Popen(
        [sys.executable, BENCHMARK, "--partitions", ",".join(map(str, PARTITIONS)),
         "--producers", ",".join(map(str, PRODUCERS)), "--idle-seconds", "1",
         "--producer-seconds", "0.5", "--json", str(json_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)          # the brokers and clients too
        stdout, stderr = process.communicate(timeout=60)
    data_dirs = re.findall(r"broker data directory (\S+)", stdout)
    for data_dir in data_dirs:
        unlink_shared_memory(data_dir)
        if os.path.exists(data_dir):
            shutil.rmtree(data_dir, ignore_errors=True)
            pytest.fail(f"{data_dir} was left behind:\n{stdout}\n{stderr}")
    if process.returncode is None or process.returncode < 0:
        pytest.fail(f"the benchmark did not finish within {DEADLINE_S} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), \
        data_dirs


@pytest.mark.timeout(DEADLINE_S + 120)
def test_a_small_run_prints_every_figure_and_leaves_nothing_behind(tmp_path):
    json_path = tmp_path / "bench_scale.json"
    finished, data_dirs = run(json_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert len(data_dirs) == 3 * len(PARTITIONS) + len(PRODUCERS)
    lines = finished.stdout.splitlines()
    for label in ROWS:
        # "open files added" must not match "open files added, idle"
        row = [line for line in lines
               if line.startswith(label) and not line[len(label):].startswith(",")]
        assert len(row) == 1, (label, finished.stdout)
        assert "error" not in row[0], row[0]
    for count in PRODUCERS:
        row = [line for line in lines if re.match(rf"\s+{count}\s+\d", line)]
        assert len(row) == 1 and row[0].endswith("refused"), finished.stdout
    assert "one producer past producers_max: TooManyProducersError" in finished.stdout
    assert any(line.startswith("others: cores other processes kept busy") for line in lines)

    document = json.loads(json_path.read_text())
    for point in document["partitions"]:
        for step in STEPS:
            assert "error" not in point[step], (step, point[step])
        assert point["shared_memory_left"] == []
    for point, count in zip(document["producers"], PRODUCERS):
        assert len(point["rates"]) == count and min(point["rates"]) > 0, point
        assert point["past_the_limit"]["refused"] and point["shared_memory_left"] == []
    for data_dir in data_dirs:
        assert not [name for name in os.listdir(SHARED_MEMORY_DIRECTORY)
                    if name.startswith(shared_memory_prefix(data_dir))]
