"""Fixtures of the cluster tests: network namespaces (``shmlog.devtools.netns``) for
partition tests.

``topology`` gives each test its own namespaces (``shmlog-<pid>-{hub,b1,b2,b3,zk}``,
see ``shmlog/devtools/netns.py``), removed at teardown; the test is skipped, with the reason, when
namespaces or nftables cannot be used here (not root, no ``ip`` or ``nft``). The
first test that asks also removes the namespaces killed test runs left behind.
"""

from __future__ import annotations

import pytest

from shmlog.devtools import netns


@pytest.fixture(scope="session")
def netns_unavailable_reason():
    """Why namespaces cannot be used here (None when they can); asked once, and the
    dead test runs' namespaces are swept when they can."""
    reason = netns.unavailable_reason()
    if reason is None:
        netns.sweep_dead_namespaces()
    return reason


@pytest.fixture
def topology(netns_unavailable_reason):
    """A created :class:`netns.Topology` (members b1, b2, b3, zk), torn down after."""
    if netns_unavailable_reason:
        pytest.skip(netns_unavailable_reason)
    with netns.Topology() as created:
        yield created


@pytest.fixture(scope="package")
def shared_cluster(zookeeper, tmp_path_factory):
    """Three brokers (``workload.SETTINGS``, output in log files) shared by the fault
    tests that leave it whole (each repairs it first: see ``fault_cluster``): a
    cluster costs seconds of CPU to start. Stopped after the last test of this
    package, so the rest of the suite does not share the machine with it."""
    from cluster import workload
    cluster = workload.start_cluster(str(tmp_path_factory.mktemp("faults")), zookeeper,
                                     log_files=True)
    try:
        yield cluster
    finally:
        workload.stop_cluster(cluster)


@pytest.fixture
def fault_cluster(shared_cluster):
    """The shared cluster with every broker running: a paused one resumed, a killed
    one restarted (a test that failed half-way left it so)."""
    for broker_id in range(1, shared_cluster.count + 1):
        if broker_id in shared_cluster.paused:
            shared_cluster.resume(broker_id)
        if broker_id not in shared_cluster.brokers:
            shared_cluster.start_broker(broker_id)
    return shared_cluster
