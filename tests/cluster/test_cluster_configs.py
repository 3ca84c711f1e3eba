"""``Admin.describe_configs`` in a cluster: a topic's override shows as TOPIC (also
one set to Kafka's default: the config znode keeps it as given), the rest as
DEFAULT; a BROKER resource is the broker the client reaches, by its id,
with the ``[cluster]`` table's settings under Kafka's names and the ones its
settings set as BROKER. The slow variant: a broker whose ``min.insync.replicas``
is 2 shows it, as BROKER (Kafka's STATIC_BROKER_CONFIG), for a topic without its
own.

Method: the package's shared cluster (a topic made and deleted: nothing else is
changed there); the slow variant starts a one-broker cluster of its own (the
shared one keeps Kafka's default ``min.insync.replicas``).
"""

from __future__ import annotations

import pytest

from cluster import workload
from shmlog.client.admin import Admin, ConfigResource, ConfigResourceType, NewTopic
from shmlog.common.errors import InvalidReplicationFactorError, LocalProtocolError
from shmlog.storage.topic_config import ConfigSource


def test_config_sources_in_a_cluster(shared_cluster):
    admin = Admin(shared_cluster.data_dir(1), timeout_ms=workload.ADMIN_TIMEOUT_MS)
    admin.create_topics([NewTopic("configs-probe", 1, 1,
                                  topic_configs={"min.insync.replicas": "1",
                                                 "retention.ms": "60000"})])
    try:
        [topic] = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC,
                                                         "configs-probe")])
        assert (topic["retention.ms"].value, topic["retention.ms"].source) == \
            ("60000", ConfigSource.TOPIC)
        assert topic["min.insync.replicas"].source is ConfigSource.TOPIC, \
            "set to Kafka's default, it is still the topic's own (its config znode)"
        assert topic["segment.bytes"].source is ConfigSource.DEFAULT
        [broker] = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")])
        assert broker["broker.id"].value == "1"
        assert (broker["replica.lag.time.max.ms"].value,
                broker["replica.lag.time.max.ms"].source) == ("4000", ConfigSource.BROKER)
        assert broker["min.insync.replicas"].source is ConfigSource.DEFAULT
        with pytest.raises(LocalProtocolError, match="reaches broker 1"):
            admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "2")])
        with pytest.raises(InvalidReplicationFactorError):
            admin.create_topics([NewTopic("configs-wide", 1, shared_cluster.count + 1)])
    finally:
        admin.delete_topics(["configs-probe"])


@pytest.mark.slow
def test_a_brokers_min_insync_replicas_is_the_source_for_topics_without_one(
        zookeeper, tmp_path):
    cluster = workload.start_cluster(str(tmp_path), zookeeper,
                                     settings={"min.insync.replicas": 2}, brokers=1)
    try:
        admin = Admin(cluster.data_dir(1), timeout_ms=workload.ADMIN_TIMEOUT_MS)
        admin.create_topics([NewTopic("plain", 1, 1), NewTopic(
            "strict", 1, 1, topic_configs={"min.insync.replicas": "3"}), NewTopic(
            "lax", 1, 1, topic_configs={"min.insync.replicas": "1"})])
        plain, strict, lax = admin.describe_configs([ConfigResource("topic", "plain"),
                                                     ConfigResource("topic", "strict"),
                                                     ConfigResource("topic", "lax")])
        assert (lax["min.insync.replicas"].value, lax["min.insync.replicas"].source) == \
            ("1", ConfigSource.TOPIC), "the topic's own 1 wins over the broker's 2"
        assert (plain["min.insync.replicas"].value, plain["min.insync.replicas"].source) == \
            ("2", ConfigSource.BROKER)
        assert (strict["min.insync.replicas"].value,
                strict["min.insync.replicas"].source) == ("3", ConfigSource.TOPIC)
        [broker] = admin.describe_configs([ConfigResource("broker", "1")])
        assert (broker["min.insync.replicas"].value, broker["min.insync.replicas"].source) == \
            ("2", ConfigSource.BROKER)
    finally:
        workload.stop_cluster(cluster)
