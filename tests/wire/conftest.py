"""Fixtures of the Kafka listener's tests: a broker process with a listener on a
free loopback port, and its address."""

from __future__ import annotations

import pytest

from helpers import kafka_listener_address, unlink_shared_memory
from shmlog.server.broker import Broker


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """(data directory, "host:port") of a broker serving Kafka on 127.0.0.1."""
    data_dir = str(tmp_path_factory.mktemp("kafka-broker") / "data")
    with Broker(data_dir, listeners="PLAINTEXT://127.0.0.1:0"):
        yield data_dir, kafka_listener_address(data_dir)
    unlink_shared_memory(data_dir)
