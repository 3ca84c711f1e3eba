"""Fixtures of the cluster tests: network namespaces (``netns``) for partition tests.

``topology`` gives each test its own namespaces (``shmlog-<pid>-{hub,b1,b2,b3,zk}``,
see ``netns.py``), removed at teardown; the test is skipped, with the reason, when
namespaces or nftables cannot be used here (not root, no ``ip`` or ``nft``). The
first test that asks also removes the namespaces killed test runs left behind.
"""

from __future__ import annotations

import pytest

from cluster import netns


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
