"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from helpers import unlink_shared_memory
from shmlog.server.broker import Broker


@pytest.fixture(scope="package")
def integration_broker(tmp_path_factory):
    """One broker for the tests that only add topics of their own names and groups
    (the console commands, the examples, the docs' snippets): its data directory. A
    group's first rebalance starts at once (no initial delay), so members join fast.
    A test that stops, restarts or reconfigures a broker starts its own."""
    data_dir = str(tmp_path_factory.mktemp("integration-broker") / "data")
    with Broker(data_dir, group_initial_rebalance_delay_ms=0):
        yield data_dir
    unlink_shared_memory(data_dir)
