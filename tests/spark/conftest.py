"""A real local Spark (``local[2]``), started once for the session, and a real
broker per test on a temporary data directory."""

from __future__ import annotations

import os

import pytest

from shmlog.server.broker import Broker, shared_memory_prefix
from shmlog.shm import shared_memory


@pytest.fixture(scope="session")
def spark():
    from shmlog.spark import session
    running = session("local[2]", "shmlog-tests")
    running.sparkContext.setLogLevel("ERROR")
    yield running
    running.stop()


@pytest.fixture
def broker(tmp_path):
    path = str(tmp_path / "data")
    with Broker(path, retention_check_interval_ms=200):
        yield path
    for name in os.listdir("/dev/shm"):
        if name.startswith(shared_memory_prefix(path)):
            shared_memory.unlink(name)
