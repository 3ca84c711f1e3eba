"""Cluster configuration: the ``[cluster]`` table of a broker's TOML file.

Goal: a broker's cluster settings load from the forms Kafka users write (dotted
names) and ours (snake_case), default to Kafka 2.8's values, and every bad value is
an InvalidConfigError naming the setting; without the table a broker is today's.

Method: load real TOML files through ``BrokerConfig.load`` and tables through
``ClusterConfig.from_mapping``; round-trip the module docstring's example; build the
``shmlog`` parser to check the ``broker`` verb's flags.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from shmlog import cli
from shmlog.common.errors import InvalidConfigError, LocalProtocolError
from shmlog.config import cluster as cluster_config
from shmlog.config.broker import BrokerConfig
from shmlog.config.cluster import KAFKA_NAMES, ClusterConfig

REQUIRED = {"cluster.id": "c1", "broker.id": 1, "zookeeper.connect": "127.0.0.1:2181",
            "replication.endpoint": "tcp://127.0.0.2:19091",
            "security.inter.broker.protocol": "plaintext"}


def example_toml() -> str:
    """The example in cluster_config's docstring, dedented."""
    text = cluster_config.__doc__.split("An example (the unit tests load it)::")[1]
    lines = [line[4:] for line in text.strip("\n").splitlines()]
    return "\n".join(lines) + "\n"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_kafka_defaults():
    config = ClusterConfig.from_mapping(REQUIRED)
    # KafkaConfig.Defaults at 2.8.2.
    assert config.zookeeper_session_timeout_ms == 18_000
    assert config.zookeeper_connection_timeout_ms == 18_000     # unset: the session timeout
    assert config.replica_lag_time_max_ms == 30_000
    assert config.replica_fetch_wait_max_ms == 500
    assert config.replica_fetch_max_bytes == 1 << 20
    assert config.replica_fetch_response_max_bytes == 10 << 20
    assert config.replica_socket_timeout_ms == 30_000
    assert config.replica_high_watermark_checkpoint_interval_ms == 5_000
    assert config.default_replication_factor == 1
    assert config.min_insync_replicas == 1
    assert config.unclean_leader_election_enable is False
    assert config.controlled_shutdown_enable is True
    assert config.controlled_shutdown_max_retries == 3
    assert config.controlled_shutdown_retry_backoff_ms == 5_000
    assert config.auto_leader_rebalance_enable is True
    assert config.leader_imbalance_per_broker_percentage == 10
    assert config.leader_imbalance_check_interval_seconds == 300
    assert config.rack is None
    assert config.advertised_host == "127.0.0.2"                # the endpoint's host
    assert (config.replication_host, config.replication_port) == ("127.0.0.2", 19091)


def test_dotted_and_snake_case_names_are_the_same_settings():
    snake = {name.replace(".", "_"): value for name, value in REQUIRED.items()}
    assert ClusterConfig.from_mapping(snake) == ClusterConfig.from_mapping(REQUIRED)
    assert ClusterConfig.from_mapping({**REQUIRED, "rack": "r1"}) == \
        ClusterConfig.from_mapping({**REQUIRED, "broker.rack": "r1"})


def test_the_docstring_example_loads_and_round_trips(tmp_path):
    config = BrokerConfig.load(write(tmp_path, example_toml()), data_dir=str(tmp_path)).cluster
    assert config == ClusterConfig(
        cluster_id="shmlog-dev", broker_id=1, zookeeper_connect="127.0.0.1:2181/shmlog",
        replication_endpoint="tcp://127.0.0.1:19091", rack="r1", min_insync_replicas=2,
        default_replication_factor=3, replica_lag_time_max_ms=1500,
        curve_secret_key_file="/etc/shmlog/keys/broker-1.key_secret",
        curve_allowed_public_keys_dir="/etc/shmlog/keys")
    assert config.zookeeper_chroot == "/shmlog"
    assert config.zookeeper_hosts == "127.0.0.1:2181"
    again = BrokerConfig.load(write(tmp_path, config.to_toml()), data_dir=str(tmp_path)).cluster
    assert again == config
    assert tomllib.loads(config.to_toml())["cluster"] == config.as_mapping()


def test_bare_dotted_names_are_read_as_kafkas_names(tmp_path):
    # TOML nests bare dotted keys: zookeeper.connect is {"zookeeper": {"connect": ...}}.
    quoted = '[cluster]\n"cluster.id" = "c"\n"broker.id" = 2\n' \
             '"zookeeper.connect" = "h:2181"\n"zookeeper.session.timeout.ms" = 6000\n' \
             '"replication.endpoint" = "tcp://h:9000"\n' \
             '"security.inter.broker.protocol" = "plaintext"\n'
    bare = '[cluster]\ncluster.id = "c"\nbroker.id = 2\nzookeeper.connect = "h:2181"\n' \
           'zookeeper.session.timeout.ms = 6000\nreplication.endpoint = "tcp://h:9000"\n' \
           'security.inter.broker.protocol = "plaintext"\n'
    assert tomllib.loads(bare)["cluster"]["zookeeper"]["session"] == {"timeout": {"ms": 6000}}
    loaded = [BrokerConfig.load(write(tmp_path, text), data_dir=str(tmp_path)).cluster
              for text in (quoted, bare)]
    assert loaded[0] == loaded[1]
    assert loaded[0].zookeeper_session_timeout_ms == 6000
    with pytest.raises(InvalidConfigError, match=r"unknown cluster setting 'zookeeper.conect'"):
        BrokerConfig.load(write(tmp_path, bare.replace("connect", "conect")),
                          data_dir=str(tmp_path))


def test_broker_and_cluster_tables_together(tmp_path):
    path = write(tmp_path, '[broker]\npartitions_max = 64\n\n' + example_toml())
    config = BrokerConfig.load(path, data_dir=str(tmp_path))
    assert config.partitions_max == 64
    assert config.cluster.broker_id == 1
    flat = write(tmp_path, 'partitions_max = 64\n' + example_toml())
    assert BrokerConfig.load(flat, data_dir=str(tmp_path)) == config


def test_without_a_cluster_table_the_broker_is_single_host(tmp_path):
    assert BrokerConfig.load(write(tmp_path, "partitions_max = 64\n"),
                             data_dir=str(tmp_path)).cluster is None
    assert BrokerConfig(data_dir=str(tmp_path)).cluster is None


def test_cluster_given_as_an_override(tmp_path):
    config = ClusterConfig.from_mapping(REQUIRED)
    assert BrokerConfig.load(None, data_dir=str(tmp_path), cluster=config).cluster == config
    assert BrokerConfig.load(None, data_dir=str(tmp_path), cluster=REQUIRED).cluster == config


def test_cluster_settings_inside_the_broker_table_are_refused(tmp_path):
    path = write(tmp_path, '[broker]\npartitions_max = 64\n[broker.cluster]\n"broker.id" = 1\n')
    with pytest.raises(InvalidConfigError, match=r"top-level \[cluster\] table"):
        BrokerConfig.load(path, data_dir=str(tmp_path))


@pytest.mark.parametrize("key, value, message", [
    ("cluster.id", "", r"cluster.id must be"),
    ("cluster.id", "a b", r"cluster.id must be"),
    ("cluster.id", 7, r"cluster.id must be"),
    ("broker.id", -1, r"broker.id must be in \[0, "),
    ("broker.id", True, r"broker.id must be an integer"),
    ("broker.id", "1", r"broker.id must be an integer"),
    ("broker.id", 1.0, r"broker.id must be an integer"),
    ("zookeeper.connect", "", r"'' in '' is not host\[:port\]"),
    ("zookeeper.connect", "h1:2181,", r"'' in 'h1:2181,' is not host"),
    ("zookeeper.connect", "h1:99999", r"port 1..65535"),
    ("zookeeper.connect", "h1:0", r"port 1..65535"),
    ("zookeeper.connect", "h1:x", r"'h1:x'"),
    ("zookeeper.connect", "h1:2181/a//b", r"chroot .* got '/a//b'"),
    ("zookeeper.connect", "h1:2181/a/", r"chroot"),
    ("zookeeper.connect", "h1:2181/a/../b", r"chroot"),
    ("zookeeper.connect", 2181, r"must be a string"),
    ("replication.endpoint", "127.0.0.1:9000", r"tcp://host:port"),
    ("replication.endpoint", "tcp://127.0.0.1", r"tcp://host:port"),
    ("replication.endpoint", "ipc:///tmp/x", r"tcp://host:port"),
    ("replication.endpoint", "tcp://h:70000", r"port 1..65535"),
    ("replication.endpoint", "tcp://*:9000", r"wildcard '\*'"),
    ("replication.endpoint", "tcp://0.0.0.0:9000", r"wildcard '0.0.0.0'"),
    ("replication.endpoint", "tcp://[::]:9000", r"wildcard"),
    ("advertised.host", "0.0.0.0", r"advertised.host must be a routable"),
    ("advertised.host", "a host", r"advertised.host must be a routable"),
    ("advertised.host", "", r"advertised.host must be a non-empty string"),
    ("broker.rack", "", r"broker.rack must be"),
    ("broker.rack", 'r"1', r"broker.rack must be"),
    ("zookeeper.session.timeout.ms", 0, r"zookeeper.session.timeout.ms must be in \[1, "),
    ("zookeeper.connection.timeout.ms", 0, r"zookeeper.connection.timeout.ms must be in"),
    ("replica.lag.time.max.ms", 2**31, r"replica.lag.time.max.ms must be in"),
    ("replica.fetch.max.bytes", 0, r"replica.fetch.max.bytes must be in \[1, "),
    ("replica.fetch.response.max.bytes", -5, r"replica.fetch.response.max.bytes must be in"),
    ("replica.high.watermark.checkpoint.interval.ms", 0, r"checkpoint.interval.ms must be"),
    ("default.replication.factor", 0, r"default.replication.factor must be in \[1, "),
    ("min.insync.replicas", 0, r"min.insync.replicas must be in \[1, "),
    ("unclean.leader.election.enable", "false", r"must be True or False"),
    ("unclean.leader.election.enable", 0, r"must be True or False"),
    ("controlled.shutdown.enable", "true", r"must be True or False"),
    ("controlled.shutdown.max.retries", 0, r"controlled.shutdown.max.retries must be in \[1, "),
    ("controlled.shutdown.retry.backoff.ms", -1, r"retry.backoff.ms must be in \[0, "),
    ("auto.leader.rebalance.enable", 1, r"must be True or False"),
    ("leader.imbalance.per.broker.percentage", 101, r"percentage must be 0..100"),
    ("leader.imbalance.check.interval.seconds", 0, r"interval.seconds must be in \[1, "),
])
def test_bad_values_are_refused_naming_the_setting(key, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        ClusterConfig.from_mapping({**REQUIRED, key: value})


def test_kafka_cross_checks_of_the_fetch_wait():
    # KafkaConfig.validateValues: wait <= socket timeout, wait <= lag time.
    with pytest.raises(InvalidConfigError, match=r"replica.socket.timeout.ms \(400\) must be "
                                                 r"at least replica.fetch.wait.max.ms \(500\)"):
        ClusterConfig.from_mapping({**REQUIRED, "replica.socket.timeout.ms": 400})
    with pytest.raises(InvalidConfigError, match=r"replica.fetch.wait.max.ms \(500\) must be "
                                                 r"at most replica.lag.time.max.ms \(400\)"):
        ClusterConfig.from_mapping({**REQUIRED, "replica.lag.time.max.ms": 400})
    ClusterConfig.from_mapping({**REQUIRED, "replica.lag.time.max.ms": 500,
                                "replica.socket.timeout.ms": 500})


@pytest.mark.parametrize("connect, hosts, chroot", [
    ("h1", "h1", None),
    ("h1:2181,h2:2182,10.0.0.3:2181/shmlog", "h1:2181,h2:2182,10.0.0.3:2181", "/shmlog"),
    ("h1:2181/", "h1:2181", None),                   # ZooKeeper: "/" is no chroot
    ("[::1]:2181,[fe80::1]/a/b", "[::1]:2181,[fe80::1]", "/a/b"),
])
def test_zookeeper_connect_forms(connect, hosts, chroot):
    config = ClusterConfig.from_mapping({**REQUIRED, "zookeeper.connect": connect})
    assert (config.zookeeper_hosts, config.zookeeper_chroot) == (hosts, chroot)


def test_ipv6_replication_endpoint():
    config = ClusterConfig.from_mapping({**REQUIRED, "replication.endpoint": "tcp://[::1]:9000"})
    assert (config.replication_host, config.replication_port) == ("[::1]", 9000)


def test_unknown_missing_and_doubled_settings():
    with pytest.raises(InvalidConfigError, match=r"unknown cluster setting 'zookeeper.conect'"
                                                 r"; known: .*zookeeper.connect"):
        ClusterConfig.from_mapping({**REQUIRED, "zookeeper.conect": "h"})
    with pytest.raises(InvalidConfigError, match=r"must set broker.id, replication.endpoint"):
        ClusterConfig.from_mapping({"cluster.id": "c", "zookeeper.connect": "h"})
    with pytest.raises(InvalidConfigError, match=r"broker.id is given twice"):
        ClusterConfig.from_mapping({**REQUIRED, "broker_id": 2})
    with pytest.raises(InvalidConfigError, match=r"must be a table"):
        ClusterConfig.from_mapping("cluster.id=c")


def test_a_bad_cluster_table_in_a_file_is_refused_before_anything_runs(tmp_path):
    path = write(tmp_path, '[cluster]\n"broker.id" = 1\n')
    with pytest.raises(InvalidConfigError, match=r"must set cluster.id"):
        BrokerConfig.load(path, data_dir=str(tmp_path))
    assert issubclass(InvalidConfigError, LocalProtocolError)    # what load raises


def test_every_field_has_a_kafka_name_and_the_names_are_distinct():
    assert len(set(KAFKA_NAMES.values())) == len(KAFKA_NAMES)
    assert all(re.fullmatch(r"[a-z]+(\.[a-z]+)*", name) for name in KAFKA_NAMES.values())


def test_the_broker_verb_takes_a_config_file_and_no_cluster_flag():
    parser = cli.build_parser()
    arguments = parser.parse_args(["broker", "--config", "cluster.toml"])
    assert arguments.config == "cluster.toml"
    assert not hasattr(arguments, "cluster")
    with pytest.raises(SystemExit):
        parser.parse_args(["broker", "--cluster", "x"])
