"""The Kafka listener's settings: off unless set, a protocol not served yet refused by
name before anything is bound, and the boolean auto-creation setting. (Kafka's
listener syntax itself is ``tests/unit/test_wire_listeners.py``'s.)"""

from __future__ import annotations

import pytest

from shmlog.common.errors import InvalidConfigError, LocalProtocolError
from shmlog.config.broker import BrokerConfig
from shmlog.wire.kafka_listener import KafkaListener


@pytest.mark.parametrize("listeners", ["SASL_SSL://127.0.0.1:0", "SSL://127.0.0.1:0"])
def test_a_protocol_not_served_yet_is_refused_by_name(listeners):
    with pytest.raises(InvalidConfigError, match="serves PLAINTEXT listeners only"):
        KafkaListener(BrokerConfig.load(listeners=listeners))


def test_a_listener_advertises_its_bound_port(tmp_path):
    listener = KafkaListener(BrokerConfig.load(listeners="PLAINTEXT://127.0.0.1:0"))
    try:
        assert listener.advertised == tuple(listener.addresses[0])
        assert listener.endpoints == (f"PLAINTEXT://127.0.0.1:{listener.addresses[0][1]}",)
    finally:
        listener.stop()


def test_the_listener_is_off_unless_set_and_auto_creation_is_a_boolean():
    assert BrokerConfig.load().listeners is None
    assert BrokerConfig.load().auto_create_topics_enable is True
    assert BrokerConfig.load(auto_create_topics_enable="false").auto_create_topics_enable \
        is False
    with pytest.raises(LocalProtocolError, match="auto_create_topics_enable"):
        BrokerConfig.load(auto_create_topics_enable="maybe")
