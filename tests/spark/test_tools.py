"""The example pipeline (tools/spark_pipeline.py) runs in local mode and on the
standalone cluster of tools/spark_cluster.py, and its windowed counts agree with
the log lines it produced (the script checks them and exits 1 otherwise).

The standalone run (a minute of both cores: a master, two workers, a driver and two
executors) is behind ``-m slow``: the default run starts a standalone cluster of
tools/spark_cluster.py anyway, in test_spark_cluster's pipeline on three hosts.

Method: both run as the user would run them, in child processes (their own Spark
driver JVM), with bounded waits; the cluster script stops its daemons itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 600


def run(*command, **env):
    return subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, **env})


def test_the_example_pipeline_runs_in_local_mode():
    result = run(sys.executable, "tools/spark_pipeline.py", "--master", "local[2]",
                 "--lines", "3000")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "counts agree with the lines produced" in result.stdout


@pytest.mark.slow
def test_the_example_pipeline_runs_on_the_standalone_cluster(tmp_path):
    result = run(sys.executable, "tools/spark_cluster.py", "run", "--state",
                 str(tmp_path / "cluster"), "--", sys.executable, "tools/spark_pipeline.py",
                 "--lines", "2000")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "spark standalone cluster: spark://127.0.0.1:7077, 2 workers" in result.stdout
    assert "counts agree with the lines produced" in result.stdout
    executors = [name for index in (0, 1)
                 for name in os.listdir(tmp_path / "cluster" / f"work-{index}")]
    assert len(executors) == 2, "both workers ran an executor of the pipeline"
    assert not [name for name in os.listdir(tmp_path / "cluster") if name.endswith(".pid")], \
        "every daemon was stopped"
