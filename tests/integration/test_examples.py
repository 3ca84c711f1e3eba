"""Every script of examples/ runs as a user would run it, against a real broker,
and prints what it says it does; the group example, run twice, starts the second
time where the first committed.

Method: the package's shared broker (``integration_broker``: a group's first
rebalance without Kafka's initial delay, so the group example joins at once); each example runs as
``python examples/NAME.py DATA_DIR`` in a subprocess, bounded. A new example must
be added to EXPECTED, or the listing test fails: none is left out of the run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 120
# Each example run once and a line its output must have; group_consumer.py is run
# twice by a test of its own.
EXPECTED = {
    "produce_numpy.py": "received 10000 readings",
    "admin.py": "deleted audit",
}


@pytest.fixture
def broker(integration_broker):
    return integration_broker


def run_example(name: str, data_dir: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), data_dir],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_run():
    assert sorted(path.name for path in EXAMPLES.glob("*.py")) == \
        sorted([*EXPECTED, "group_consumer.py"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_runs(name, broker):
    assert EXPECTED[name] in run_example(name, broker)


def test_the_group_example_goes_on_from_its_committed_offsets(broker):
    first = run_example("group_consumer.py", broker)
    second = run_example("group_consumer.py", broker)
    assert "read 30 records" in first and "read 30 records" in second
    committed = [ast.literal_eval(output.split("by partition: ", 1)[1]) for output in
                 (first, second)]
    for partition, offset in committed[1].items():
        assert offset >= committed[0][partition]
    assert sum(committed[1].values()) == sum(committed[0].values()) + 30
