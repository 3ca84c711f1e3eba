"""A cluster whose Kafka listeners are SASL_SSL: each broker registers its listener
by name (``SASL_SSL://host:port``) and every broker tells clients all of them at
those addresses, so librdkafka logs in to each and produces to a replicated topic's
leader, wherever it is, and reads the records back.

Method: two brokers on the session's ZooKeeper (``workload.start_cluster``), each
``LocalCluster`` listener SASL_SSL, one certificate for 127.0.0.1 and 127.0.0.2 made
with the ``openssl`` command (skipped, saying so, where it is absent), one
credentials file; librdkafka's AdminClient asks each broker alone. Every wait is
bounded.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from cluster import workload
from cluster.workload import WAIT_S
from helpers import tls_and_users
from shmlog import Admin

USER, PASSWORD = "cluster-user", "cluster secret"


@pytest.fixture(scope="module")
def secured_cluster(zookeeper, tmp_path_factory):
    directory = tmp_path_factory.mktemp("sasl-ssl-cluster")
    certificate, key, users = tls_and_users(directory, "shmlog-test",
                                            "IP:127.0.0.1,IP:127.0.0.2", USER, PASSWORD, WAIT_S)
    cluster = workload.start_cluster(
        str(directory / "cluster"), zookeeper, brokers=2, kafka_security_protocol="SASL_SSL",
        broker_settings={"ssl_certificate_location": str(certificate),
                         "ssl_key_location": str(key), "sasl_credentials_file": str(users)})
    try:
        yield cluster, str(certificate)
    finally:
        workload.stop_cluster(cluster)


def options(cluster, certificate: str, broker_id: int | None = None) -> dict:
    servers = cluster.kafka_address(broker_id) if broker_id else cluster.bootstrap_servers
    return {"bootstrap.servers": servers, "security.protocol": "SASL_SSL",
            "ssl.ca.location": certificate, "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER, "sasl.password": PASSWORD}


def test_every_broker_tells_clients_every_sasl_ssl_listener(secured_cluster):
    cluster, certificate = secured_cluster
    expected = {broker_id: cluster.kafka_address(broker_id) for broker_id in (1, 2)}
    for broker_id in (1, 2):
        deadline = time.monotonic() + WAIT_S
        while True:                    # until the broker's view holds both registrations
            listing = AdminClient(options(cluster, certificate, broker_id)).list_topics(
                timeout=WAIT_S)
            found = {broker.id: f"{broker.host}:{broker.port}"
                     for broker in listing.brokers.values()}
            if found == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found == expected


def test_librdkafka_produces_to_a_replicated_topic_and_reads_it_back(secured_cluster):
    cluster, certificate = secured_cluster
    Admin(cluster.data_dir(1), timeout_ms=int(WAIT_S * 1000)).create_topic(
        "sasl-ssl-replicated", 2, replication_factor=2)
    producer = Producer({**options(cluster, certificate), "acks": "all",
                         "message.timeout.ms": int(WAIT_S * 1000)})
    failures = []
    for number in range(4):
        producer.produce("sasl-ssl-replicated", f"record-{number}".encode(),
                         partition=number % 2,
                         on_delivery=lambda error, _: error and failures.append(error))
    assert producer.flush(WAIT_S) == 0 and not failures, failures
    consumer = Consumer({**options(cluster, certificate), "group.id": "sasl-ssl-cluster",
                         "enable.auto.commit": False})
    found = []
    try:
        consumer.assign([TopicPartition("sasl-ssl-replicated", partition, 0)
                         for partition in (0, 1)])
        deadline = time.monotonic() + WAIT_S
        while len(found) < 4 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message.value())
    finally:
        consumer.close()
    assert sorted(found) == [f"record-{number}".encode() for number in range(4)]
