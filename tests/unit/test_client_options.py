"""kafka-python's client options and names, checked without a broker: the
``bootstrap_servers`` alias, the Kafka options a client takes and ignores, those
it refuses with ``UnsupportedKafkaOptionError`` naming the option and why, unknown
keywords, the serializer call, config sources, and the ``shmlog.kafka`` names.

Method: plain calls of ``settings``, ``client_options`` and ``config``, table
style; clients constructed against a data directory where no broker runs, so an
error before ``BrokerNotAvailableError`` proves the check came first (as
test_client_settings.py does).
"""

from __future__ import annotations

import pytest

from shmlog.client import options as client_options
from shmlog.client.admin import Admin, ConfigResource, ConfigResourceType
from shmlog.client.consumer import Consumer
from shmlog.client.producer import Producer
from shmlog.common import settings
from shmlog.common.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    LocalProtocolError,
    ShmlogError,
    UnsupportedKafkaOptionError,
)
from shmlog.config.broker import BrokerConfig, broker_config_entries
from shmlog.storage.topic_config import ConfigSource, TopicConfig, config_sources


@pytest.fixture
def nowhere(tmp_path):
    """A data directory without a broker (nor a directory)."""
    return str(tmp_path / "no-broker")


# -- bootstrap_servers ------------------------------------------------------------------
@pytest.mark.parametrize("bootstrap, servers, expected", [
    (None, None, None),
    ("/data", None, "/data"),
    (None, "/data", "/data"),
    (None, ["/data"], "/data"),
    (None, ("/data",), "/data"),
    ("/data", "/data/", "/data"),            # the same directory twice is no conflict
])
def test_bootstrap_servers_is_an_alias_of_bootstrap(bootstrap, servers, expected):
    assert settings.bootstrap(bootstrap, servers) == expected


@pytest.mark.parametrize("bootstrap, servers, named", [
    ("/a", "/b", "name different brokers"),
    (None, ["/a", "/b"], "one broker data directory"),
    (None, [], "one broker data directory"),
    (None, 9092, "bootstrap_servers must be"),
    (None, "localhost:9092", "looks like host:port"),
    (None, ["[::1]:9092"], "looks like host:port"),
])
def test_bootstrap_servers_mistakes_are_typed_errors(bootstrap, servers, named):
    with pytest.raises(InvalidConfigError, match=named.replace("[", r"\[")):
        settings.bootstrap(bootstrap, servers)


# -- Kafka options ---------------------------------------------------------------------
@pytest.mark.parametrize("client, options", [
    ("Producer", {"retries": 5, "api_version": (2, 8), "request_timeout_ms": 30_000,
                  "max_in_flight_requests_per_connection": 5}),
    ("Producer", {"security_protocol": "PLAINTEXT", "sasl_mechanism": None,
                  "compression_type": "zstd"}),
    ("Consumer", {"fetch_min_bytes": 1, "fetch_max_wait_ms": 100, "check_crcs": True,
                  "max_partition_fetch_bytes": 1 << 20}),
    ("Admin", {"api_version": (2, 8), "ssl_context": None, "retry_backoff_ms": 100}),
])
def test_harmless_kafka_options_are_taken(client, options):
    client_options.check_kafka_options(client, options, ())


@pytest.mark.parametrize("client, option, value, why", [
    ("Producer", "partitioner", lambda key, all_, available: 0, "partitioner is Kafka's default"),
    ("Producer", "compression_type", "gzip", "zstd only"),
    ("Consumer", "group_instance_id", "static-1", "static group membership"),
    ("Admin", "security_protocol", "SSL", "file permissions"),
    ("Producer", "sasl_mechanism", "PLAIN", "file permissions"),
    ("Consumer", "ssl_cafile", "/etc/ca.pem", "file permissions"),
])
def test_unsupported_kafka_options_name_the_option_and_why(client, option, value, why):
    with pytest.raises(UnsupportedKafkaOptionError, match=why) as raised:
        client_options.check_kafka_options(client, {option: value}, ())
    assert option in str(raised.value)
    assert isinstance(raised.value, InvalidConfigError)      # kafka: KafkaConfigurationError


def test_an_option_of_another_client_is_unknown():
    """``retries`` means something to a producer only."""
    with pytest.raises(InvalidConfigError, match="Consumer has no option 'retries'"):
        client_options.check_kafka_options("Consumer", {"retries": 3}, ("group_id",))


@pytest.mark.parametrize("make", [
    lambda where: Producer(where, sasl_mechanism="PLAIN"),
    lambda where: Consumer(bootstrap_servers=where, group_instance_id="static-1"),
    lambda where: Admin(where, security_protocol="SASL_SSL"),
])
def test_clients_refuse_unsupported_options_before_asking_a_broker(nowhere, make):
    with pytest.raises(UnsupportedKafkaOptionError):
        make(nowhere)


@pytest.mark.parametrize("make, named", [
    (lambda where: Producer(where, lingerms=5), "Producer has no option 'lingerms'"),
    (lambda where: Consumer(bootstrap=where, group=5), "Consumer has no option 'group'"),
    (lambda where: Admin(where, timeout=5), "Admin has no option 'timeout'"),
])
def test_unknown_keywords_are_typed_errors_naming_them(nowhere, make, named):
    with pytest.raises(InvalidConfigError, match=named) as raised:
        make(nowhere)
    assert not isinstance(raised.value, UnsupportedKafkaOptionError)


@pytest.mark.parametrize("make", [
    lambda where: Producer(bootstrap_servers=[where], retries=3, api_version=(2, 8),
                           client_id="p", key_serializer=str.encode),
    lambda where: Consumer(bootstrap_servers=where, fetch_min_bytes=1, client_id="c",
                           value_deserializer=bytes.decode),
    lambda where: Admin(bootstrap_servers=where, request_timeout_ms=100,
                        client_id="a").list_topics(),
])
def test_kafka_shaped_settings_pass_to_the_broker_request(nowhere, make):
    """Valid kafka-python settings get as far as asking the broker."""
    with pytest.raises(BrokerNotAvailableError):
        make(nowhere)


def test_producer_compression_and_compression_type_must_agree(nowhere):
    with pytest.raises(InvalidConfigError, match="disagree"):
        Producer(nowhere, compression="none", compression_type="zstd")


def test_producer_buffer_memory_is_its_ring_size(nowhere):
    """kafka-python's buffer_memory is the ring's size: checked as ring_size is, and
    the two must agree."""
    with pytest.raises(InvalidConfigError, match="disagree"):
        Producer(nowhere, ring_size=1 << 20, buffer_memory=1 << 21)
    with pytest.raises(InvalidConfigError, match="buffer_memory: ring capacity must be a power"):
        Producer(nowhere, buffer_memory=32_000_000)
    with pytest.raises(BrokerNotAvailableError):          # valid: it asks the broker
        Producer(nowhere, ring_size=1 << 20, buffer_memory=1 << 20)


def test_admin_timeout_and_request_timeout_must_agree(nowhere):
    with pytest.raises(InvalidConfigError, match="disagree"):
        Admin(nowhere, timeout_ms=5, request_timeout_ms=6)
    assert Admin(nowhere, request_timeout_ms=1234).timeout_ms == 1234


# -- serializers -----------------------------------------------------------------------
class Upper:
    def serialize(self, topic, value):
        return f"{topic}:{value}".upper().encode()


@pytest.mark.parametrize("given, value, expected", [
    (str.encode, "k", b"k"),
    (Upper(), "k", b"T:K"),                              # an object gets the topic too
    (lambda value: value, None, None),                   # None goes through the function
])
def test_serializers_are_called_as_kafka_python_calls_them(given, value, expected):
    assert client_options.serializer(given, "key_serializer")("t", value) == expected


def test_no_serializer_is_none_and_a_non_callable_is_refused():
    assert client_options.serializer(None, "key_serializer") is None
    with pytest.raises(InvalidConfigError, match="value_deserializer"):
        client_options.deserializer("json", "value_deserializer")


# -- config sources (Kafka's DescribeConfigs resolution) --------------------------------
@pytest.mark.parametrize("overrides, broker, name, value, source", [
    ({}, {}, "retention.ms", 7 * 24 * 3600 * 1000, ConfigSource.DEFAULT),
    ({"retention.ms": "1000"}, {}, "retention.ms", 1000, ConfigSource.TOPIC),
    ({}, {"min.insync.replicas": 2}, "min.insync.replicas", 2, ConfigSource.BROKER),
    ({"min.insync.replicas": 3}, {"min.insync.replicas": 2}, "min.insync.replicas", 3,
     ConfigSource.TOPIC),
    # A topic stores only what differs from Kafka's default: set to it, it is the default.
    ({"retention.ms": str(7 * 24 * 3600 * 1000)}, {}, "retention.ms", 7 * 24 * 3600 * 1000,
     ConfigSource.DEFAULT),
])
def test_config_sources_topic_then_broker_then_default(overrides, broker, name, value, source):
    entries = config_sources(TopicConfig.from_overrides(overrides), broker)
    assert entries[name] == {"value": value, "source": source.value}
    assert set(entries) == set(TopicConfig().as_dict())


def test_broker_config_entries_say_what_the_file_set():
    entries = broker_config_entries(BrokerConfig(data_dir="/tmp/x", partitions_max=64))
    assert entries["partitions_max"] == {"value": 64, "source": "broker"}
    assert entries["retention_check_interval_ms"]["source"] == "default"
    assert "cluster" not in entries


def test_config_resource_takes_kafka_python_type_names():
    assert ConfigResource("topic", "t").resource_type is ConfigResourceType.TOPIC
    assert ConfigResource(ConfigResourceType.BROKER, "0").resource_type == 4
    with pytest.raises(LocalProtocolError):
        ConfigResource("group", "g")


# -- shmlog.kafka ----------------------------------------------------------------------
def test_kafka_errors_are_shmlog_errors_under_kafka_names():
    from shmlog.common import errors
    from shmlog.kafka import errors as kafka_errors
    assert kafka_errors.KafkaError is ShmlogError
    assert kafka_errors.TopicAlreadyExistsError is errors.TopicExistsError
    assert kafka_errors.NoBrokersAvailable is errors.BrokerNotAvailableError
    assert kafka_errors.KafkaTimeoutError is errors.ClientTimeoutError
    assert issubclass(UnsupportedKafkaOptionError, kafka_errors.KafkaConfigurationError)
    for name in kafka_errors.__all__:
        assert issubclass(getattr(kafka_errors, name), ShmlogError), name


def test_kafka_names_import_as_kafka_python_programs_import_them():
    from shmlog.kafka import (
        KafkaAdminClient,
        KafkaConsumer,
        KafkaProducer,
        OffsetAndMetadata,
        TopicPartition,
    )
    from shmlog.kafka.admin import ConfigResourceType, NewPartitions, NewTopic
    from shmlog.kafka.structs import OffsetAndMetadata as StructsOffsetAndMetadata
    assert issubclass(KafkaProducer, Producer) and issubclass(KafkaConsumer, Consumer)
    assert issubclass(KafkaAdminClient, Admin)
    assert OffsetAndMetadata is StructsOffsetAndMetadata
    assert OffsetAndMetadata(5, "", -1) == (5, "", -1)
    assert TopicPartition("t", 0) == ("t", 0)
    assert NewTopic("t", 3, 1).num_partitions == 3 and NewPartitions(4).total_count == 4
    assert ConfigResourceType.TOPIC == 2
