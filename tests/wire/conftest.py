"""Fixtures of the Kafka listener's tests: a broker process with a listener on a
free loopback port, and its address."""

from __future__ import annotations

import pytest

from helpers import kafka_broker_process


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """(data directory, "host:port") of a broker serving Kafka on 127.0.0.1."""
    with kafka_broker_process(str(tmp_path_factory.mktemp("kafka-broker") / "data")) as broker:
        yield broker
