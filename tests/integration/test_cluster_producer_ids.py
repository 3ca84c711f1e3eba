"""Cluster-wide producer ids (``shmlog.cluster.producer_ids``) against a real ZooKeeper.

Goal: brokers of one cluster never hand out the same producer id (a new leader
would take one producer's batch for another's duplicate); the loop never waits for
ZooKeeper: the next block is drawn ahead on a thread, and a broker whose ZooKeeper
stops answering refuses at once (retriable) when its ids run out, and hands out ids
again once ZooKeeper answers.

Method: ClusterProducerIds over real ClusterZooKeeper sessions, on the session's
ZooKeeper with a chroot of the test's own, and on a ZooKeeper of the test's own
that it stops (SIGSTOP) and resumes. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from shmlog.cluster.producer_ids import ClusterProducerIds
from shmlog.cluster.zk import paths as zk_paths
from shmlog.cluster.zk.client import ClusterZooKeeper
from shmlog.common import limits
from shmlog.common.errors import ProducerIdsUnavailableError
from shmlog.devtools.zookeeper import ZooKeeperServer

TIMEOUT_S = 30.0
SESSION_TIMEOUT_MS = 2000


def allocate_waiting(ids: ClusterProducerIds) -> tuple[int, int]:
    """An id, retrying while the next block is being drawn; (id, refusals)."""
    deadline = time.monotonic() + TIMEOUT_S
    refusals = 0
    while True:
        try:
            return ids.allocate(), refusals
        except ProducerIdsUnavailableError:
            refusals += 1
            assert time.monotonic() < deadline, "no block drawn in time"
            time.sleep(0.001)


def test_brokers_of_one_cluster_never_hand_out_the_same_id(hosts):
    sessions = [ClusterZooKeeper(hosts, session_timeout_ms=SESSION_TIMEOUT_MS).start()
                for _ in range(3)]
    brokers = [ClusterProducerIds(session, broker_id)
               for broker_id, session in enumerate(sessions, start=1)]
    try:
        handed = []
        refusals = 0
        for _ in range(2 * zk_paths.PRODUCER_ID_BLOCK_SIZE + 10):
            for ids in brokers:
                producer_id, refused = allocate_waiting(ids)
                handed.append(producer_id)
                refusals += refused
        print(f"\n{len(handed)} ids, {refusals} refusals while a block was drawn")
        assert len(set(handed)) == len(handed)
        assert min(handed) == 0
    finally:
        for ids in brokers:
            ids.close()
        for session in sessions:
            session.close()


def test_a_broker_cut_from_zookeeper_refuses_at_once_and_recovers(tmp_path):
    with ZooKeeperServer(str(tmp_path / "zk"), tick_time_ms=500) as server:
        session = ClusterZooKeeper(server.connect_string,
                                   session_timeout_ms=SESSION_TIMEOUT_MS).start()
        ids = ClusterProducerIds(session, 1)
        try:
            first_block = zk_paths.PRODUCER_ID_BLOCK_SIZE
            handed = [ids.allocate()
                      for _ in range(first_block - limits.PRODUCER_ID_PREFETCH_REMAINING - 1)]
            os.kill(server.process.pid, signal.SIGSTOP)   # before the prefetch starts
            try:
                handed += [ids.allocate()
                           for _ in range(limits.PRODUCER_ID_PREFETCH_REMAINING + 1)]
                assert handed == list(range(first_block))
                with pytest.raises(ProducerIdsUnavailableError):
                    ids.allocate()           # returns at once: the loop never waits
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            producer_id, _ = allocate_waiting(ids)
            assert producer_id >= first_block
        finally:
            ids.close()
            session.close()
