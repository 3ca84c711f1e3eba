"""The Kafka listener's settings: listeners parsed as Kafka writes them, each bad one
a typed error naming the setting; the boolean auto-creation setting."""

from __future__ import annotations

import pytest

from shmlog.common.errors import InvalidConfigError, LocalProtocolError
from shmlog.config.broker import BrokerConfig
from shmlog.wire.kafka_listener import parse_endpoints


def test_listeners_are_parsed():
    assert parse_endpoints("PLAINTEXT://127.0.0.1:9092, plaintext://:0", "listeners") == \
        [("127.0.0.1", 9092), ("0.0.0.0", 0)]
    assert parse_endpoints("PLAINTEXT://[::1]:9092", "listeners") == [("::1", 9092)]


@pytest.mark.parametrize("text", ["127.0.0.1:9092", "PLAINTEXT://127.0.0.1", "",
                                  "PLAINTEXT://host:99999", "PLAINTEXT://host:port"])
def test_a_malformed_listener_names_its_setting(text):
    with pytest.raises(InvalidConfigError, match="advertised_listeners"):
        parse_endpoints(text, "advertised_listeners")


def test_a_protocol_not_served_is_refused():
    with pytest.raises(InvalidConfigError, match="serves PLAINTEXT"):
        parse_endpoints("SASL_SSL://0.0.0.0:9093", "listeners")


def test_the_listener_is_off_unless_set_and_auto_creation_is_a_boolean():
    assert BrokerConfig.load().listeners is None
    assert BrokerConfig.load().auto_create_topics_enable is True
    assert BrokerConfig.load(auto_create_topics_enable="false").auto_create_topics_enable \
        is False
    with pytest.raises(LocalProtocolError, match="auto_create_topics_enable"):
        BrokerConfig.load(auto_create_topics_enable="maybe")
