"""The locality rules of Spark on a cluster (``shmlog.spark.locality``): which
broker a task reads through, which hosts a range prefers, and when a read counts
as local; and the plan that carries them (``plan``, ``bulk_plan``'s shape).

Method: plain values, table-style, one rule per test; no Spark, no broker (the
Spark and cluster runs are in test_spark_cluster.py).
"""

from __future__ import annotations

import pytest

from shmlog.client.consumer import TopicPartition
from shmlog.spark.locality import (
    TASK_BOOTSTRAP_ENVIRONMENT,
    ReadLocality,
    partition_hosts,
    placement_locality,
    preferred_hosts,
    read_locality,
    task_bootstrap,
)
from shmlog.spark.options import ReadOptions
from shmlog.spark.source import plan

HOSTS = {1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.4"}


@pytest.mark.parametrize("environment, expected", [
    ({}, "/driver"),                                          # one host: the option
    ({TASK_BOOTSTRAP_ENVIRONMENT: ""}, "/driver"),            # set but empty: the option
    ({TASK_BOOTSTRAP_ENVIRONMENT: "/here"}, "/here"),         # the worker's broker wins
])
def test_a_task_reads_through_its_hosts_broker_else_the_option(environment, expected):
    assert task_bootstrap("/driver", environment) == expected


@pytest.mark.parametrize("leader, isr, expected", [
    (1, [1, 2], ["127.0.0.2", "127.0.0.3"]),              # the leader's host first
    (2, [1, 2], ["127.0.0.3", "127.0.0.2"]),
    (3, [3], ["127.0.0.4"]),                               # a shrunk ISR: the leader only
    (1, [1, 4], ["127.0.0.2"]),                            # broker 4 is not registered (dead)
    (-1, [2], ["127.0.0.3"]),                              # no leader: the ISR still holds it
])
def test_a_range_prefers_the_hosts_of_the_in_sync_replicas(leader, isr, expected):
    """Kafka's Spark source prefers one executor by a hash (consumer reuse); our data
    is on the replica hosts, so those are preferred."""
    assert preferred_hosts(leader, isr, HOSTS) == expected


def test_a_host_named_by_two_brokers_is_preferred_once():
    assert preferred_hosts(1, [1, 2], {1: "a", 2: "a"}) == ["a"]


@pytest.mark.parametrize("broker_id, role, isr, expected", [
    (1, "leader", [1, 2], ReadLocality.LOCAL),
    (2, "follower", [1, 2], ReadLocality.LOCAL),           # an in-sync follower
    (2, "follower", [1], ReadLocality.REMOTE),             # out of sync: its copy trails
    (3, "observer", [1, 2], ReadLocality.REMOTE),          # not a replica: a host copy
    (3, "offline", [], ReadLocality.REMOTE),
    (None, None, [], ReadLocality.LOCAL),                  # no cluster: the only copy
])
def test_a_read_is_local_on_the_leader_or_an_in_sync_follower(broker_id, role, isr, expected):
    assert read_locality(broker_id, role, isr) is expected


@pytest.mark.parametrize("task_host, preferred, expected", [
    ("127.0.0.2", ["127.0.0.2", "127.0.0.3"], ReadLocality.LOCAL),    # the leader's host
    ("127.0.0.3", ["127.0.0.2", "127.0.0.3"], ReadLocality.LOCAL),    # an in-sync follower's
    ("127.0.0.4", ["127.0.0.2", "127.0.0.3"], ReadLocality.REMOTE),   # the observer's host
    ("127.0.0.3", ["127.0.0.2"], ReadLocality.REMOTE),                # a shrunk ISR
])
def test_a_task_on_a_host_of_an_in_sync_replica_reads_locally(task_host, preferred, expected):
    """The bulk reader's rule (``BulkSource.isLocal``), by the executor's host."""
    assert placement_locality(task_host, preferred) is expected


@pytest.mark.parametrize("leader, replicas, isr", [
    (1, [1, 2], [1, 2]),            # the pipeline's layout: RF 2 of 3, the ISR full
    (2, [2, 3], [3, 2]),
    (1, [1, 2], [1]),               # broker 2 fell out of the ISR
    (3, [1, 2, 3], [3, 1, 2]),      # every broker a replica
])
def test_a_task_reading_through_its_hosts_broker_counts_as_its_host_says(leader, replicas, isr):
    """The broker's answer (by its role) equals the host's (by the preferred hosts),
    for a task on every host: what the pipeline tool checks of every
    ``format("shmlog")`` task, whichever host Spark put it on."""
    preferred = preferred_hosts(leader, isr, HOSTS)
    for broker_id, host in HOSTS.items():
        role = "leader" if broker_id == leader else \
            "follower" if broker_id in replicas else "observer"
        assert read_locality(broker_id, role, isr) is placement_locality(host, preferred), \
            (broker_id, role)


def test_partition_hosts_come_from_the_registrations_and_the_described_isr():
    metadata = {"brokers": {str(broker_id): {"host": host} for broker_id, host in HOSTS.items()}}
    described = {"logs": {"partitions": [
        {"partition": 0, "leader": 1, "isr": [1, 2]},
        {"partition": 1, "leader": 3, "isr": [3, 1]}]}}
    assert partition_hosts(metadata, described) == {
        ("logs", 0): ["127.0.0.2", "127.0.0.3"], ("logs", 1): ["127.0.0.4", "127.0.0.2"]}


def test_a_broker_outside_a_cluster_names_no_hosts():
    assert partition_hosts({"topics": []}, {"logs": {"partitions": []}}) == {}


def test_every_piece_of_a_partition_carries_its_hosts():
    options = ReadOptions.parse({"subscribe": "logs", "maxRecordsPerPartition": "10"})
    starts = {TopicPartition("logs", 0): 0, TopicPartition("logs", 1): 5}
    ends = {TopicPartition("logs", 0): 25, TopicPartition("logs", 1): 5}
    pieces = plan(starts, ends, options, {("logs", 0): ["127.0.0.2", "127.0.0.3"]})
    assert [(piece.start, piece.end) for piece in pieces] == [(0, 8), (8, 17), (17, 25)]
    assert {piece.hosts for piece in pieces} == {("127.0.0.2", "127.0.0.3")}
    assert plan(starts, ends, options)[0].hosts == ()      # one host: none named
