"""The Kafka listener's settings: off unless set; a TLS or SASL listener refused
before anything is bound when its settings are missing, naming the broker setting;
every listener registered as NAME://host:port; the key's password never shown; and
the boolean auto-creation setting. (Kafka's listener syntax itself is
``tests/unit/test_wire_listeners.py``'s; TLS and SASL served, ``tests/wire/
test_kafka_security.py``'s.)"""

from __future__ import annotations

import pytest

from shmlog.common.errors import InvalidConfigError, LocalProtocolError
from shmlog.config.broker import BrokerConfig, broker_config_entries
from shmlog.wire.credentials import user_entry
from shmlog.wire.kafka_listener import KafkaListener


@pytest.mark.parametrize("listeners", ["SASL_SSL://127.0.0.1:0", "SSL://127.0.0.1:0"])
def test_a_tls_listener_without_its_certificate_is_refused_naming_the_setting(listeners):
    with pytest.raises(InvalidConfigError, match="ssl_certificate_location is required"):
        KafkaListener(BrokerConfig.load(listeners=listeners))


def test_a_sasl_listener_without_credentials_is_refused_naming_the_setting():
    with pytest.raises(InvalidConfigError, match="sasl_credentials_file is required"):
        KafkaListener(BrokerConfig.load(listeners="SASL_PLAINTEXT://127.0.0.1:0"))


def test_every_listener_is_registered_by_name_and_told_of_to_its_own_clients(tmp_path):
    users = tmp_path / "users.toml"
    users.write_text(user_entry("alice", "secret", iterations=4096))
    users.chmod(0o600)
    listener = KafkaListener(BrokerConfig.load(
        listeners="INSIDE://127.0.0.1:0,OUTSIDE://127.0.0.1:0",
        listener_security_protocol_map="INSIDE:PLAINTEXT,OUTSIDE:SASL_PLAINTEXT",
        advertised_listeners="OUTSIDE://broker-1.example.com:9093",
        sasl_credentials_file=str(users)))
    try:
        inside = listener.addresses[0][1]
        assert listener.endpoints == (f"INSIDE://127.0.0.1:{inside}",
                                      "OUTSIDE://broker-1.example.com:9093")
        assert listener.listener_name == "INSIDE"
        assert listener.by_listener == {"INSIDE": ("127.0.0.1", inside),
                                        "OUTSIDE": ("broker-1.example.com", 9093)}
    finally:
        listener.stop()


def test_a_listener_advertises_its_bound_port(tmp_path):
    listener = KafkaListener(BrokerConfig.load(listeners="PLAINTEXT://127.0.0.1:0"))
    try:
        assert listener.advertised == tuple(listener.addresses[0])
        assert listener.endpoints == (f"PLAINTEXT://127.0.0.1:{listener.addresses[0][1]}",)
    finally:
        listener.stop()


def test_the_key_password_is_never_shown():
    entries = broker_config_entries(BrokerConfig.load(ssl_key_password="hunter2"))
    assert entries["ssl_key_password"] == {"value": None, "source": "broker"}
    assert broker_config_entries(BrokerConfig.load())["ssl_key_password"] == \
        {"value": None, "source": "default"}


def test_the_listener_is_off_unless_set_and_auto_creation_is_a_boolean():
    assert BrokerConfig.load().listeners is None
    assert BrokerConfig.load().auto_create_topics_enable is True
    assert BrokerConfig.load(auto_create_topics_enable="false").auto_create_topics_enable \
        is False
    with pytest.raises(LocalProtocolError, match="auto_create_topics_enable"):
        BrokerConfig.load(auto_create_topics_enable="maybe")


def test_a_written_plaintext_listener_off_loopback_starts_with_a_warning(caplog):
    # The exposure rule (listeners.py): a protocol written for the listener is allowed
    # off loopback; the broker says so. (Bound for an instant, never served.)
    with caplog.at_level("WARNING", logger="shmlog.broker.kafka"):
        listener = KafkaListener(BrokerConfig.load(
            listeners="PLAINTEXT://0.0.0.0:0", advertised_listeners="PLAINTEXT://broker-1:9092"))
    listener.stop()
    assert any("serves other hosts with PLAINTEXT, as written (listeners)" in record.message
               for record in caplog.records)
