"""``Admin.describe_configs`` in a cluster: a topic without its own
``min.insync.replicas`` shows the broker's (source BROKER, Kafka's
STATIC_BROKER_CONFIG), one with an override shows it (TOPIC); a BROKER resource is
the broker the client reaches, by its id, with the ``[cluster]`` table's settings
under Kafka's names.

Method: a one-broker cluster of its own (``min.insync.replicas`` = 2 in its
settings, which the shared cluster does not have) on the session's ZooKeeper.
"""

from __future__ import annotations

import pytest

from cluster import workload
from shmlog.admin import Admin, ConfigResource, ConfigResourceType, NewTopic
from shmlog.config import ConfigSource
from shmlog.errors import InvalidReplicationFactorError, LocalProtocolError


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    started = workload.start_cluster(str(tmp_path_factory.mktemp("configs")), zookeeper,
                                     settings={"min.insync.replicas": 2}, brokers=1)
    try:
        yield started
    finally:
        workload.stop_cluster(started)


def test_config_sources_in_a_cluster(cluster):
    admin = Admin(cluster.data_dir(1), timeout_ms=workload.ADMIN_TIMEOUT_MS)
    admin.create_topics([NewTopic("plain", 1, 1),
                         NewTopic("strict", 1, 1, topic_configs={"min.insync.replicas": "3"})])
    plain, strict = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "plain"),
                                            ConfigResource(ConfigResourceType.TOPIC, "strict")])
    assert (plain["min.insync.replicas"].value, plain["min.insync.replicas"].source) == \
        ("2", ConfigSource.BROKER)
    assert (strict["min.insync.replicas"].value, strict["min.insync.replicas"].source) == \
        ("3", ConfigSource.TOPIC)
    assert plain["retention.ms"].source is ConfigSource.DEFAULT
    [broker] = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")])
    assert (broker["min.insync.replicas"].value, broker["min.insync.replicas"].source) == \
        ("2", ConfigSource.BROKER)
    assert broker["broker.id"].value == "1"
    with pytest.raises(LocalProtocolError, match="reaches broker 1"):
        admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "2")])
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topics([NewTopic("wide", 1, 3)])
    admin.delete_topics(["plain", "strict"])
