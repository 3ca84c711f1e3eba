"""Transactions under the nemesis: a Jepsen-style transactional workload against a
three-broker cluster in network namespaces, judged by the history checker.

Goal (issue 30, "a Jepsen-style transactional workload"): under kill -9 of brokers
(the transaction coordinators and the partitions' leaders among them) and of
producers, SIGSTOP/SIGCONT pauses, partitions of a broker from its peers or from
ZooKeeper and ZooKeeper's own death, a read_committed consumer never sees an aborted
record, a committed transaction is in the log on all its partitions or on none, no
acknowledged record is lost or stored twice, and every replica ends the same.

Method: ``netns.Topology`` (skipped, with the reason, without root, ``ip`` or
``nft``): ZooKeeper in namespace zk, broker i in namespace bi
(``test_nemesis.start_cluster``'s layout). A topic of three partitions, RF 3,
min.insync.replicas 2; ``__transaction_state`` of three partitions. Three
transactional producer processes (``transactional_workload``: random transaction
sizes over the three partitions, a quarter aborted, acks=all, a 10 s transaction
timeout), each attached to a broker; a supervisor starts a producer again, on a
running broker, whenever one dies with its broker or fails, and kills one now and
then. A read_committed consumer on broker 1 reads all along. The nemesis plays a
schedule drawn from a seed (printed; ``SHMLOG_NEMESIS_SEED`` plays it again) for
``DEFAULT_SECONDS`` (``SHMLOG_NEMESIS_SECONDS`` overrides). Then, everything healed
and every wait bounded: the ISRs whole, a fresh producer of each transactional id
fences what its last run left open, every broker's read_committed end reaches its
log end (no transaction left open), every broker's replica reads the same in both
isolation levels, and the history checker judges broker 1's logs with every read
the consumer made.
"""

from __future__ import annotations

import random
import threading

import pytest

from cluster.history import History, TransactionEnd
from cluster.nemesis import ALL_FAULT_KINDS, Nemesis, make_schedule
from cluster.test_groups_across_hosts import create_topic
from cluster.test_nemesis import MEMBERS, SEED_VARIABLE, run_seconds, run_seed, start_cluster
from cluster.transactional_workload import (
    PARTITIONS,
    TOPIC,
    ProducerProcess,
    final_logs,
    read_committed_all_along,
)
from cluster.workload import SETTINGS, WAIT_S, stop_cluster, wait_in_sync
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import ShmlogError
from shmlog.common.internal_topics import TRANSACTION_STATE_TOPIC
from shmlog.devtools.local_cluster import LocalCluster

DEFAULT_SECONDS = 20.0
PRODUCERS = 3
STATE_PARTITIONS = 3
TRANSACTION_TIMEOUT_MS = 10_000
BROKER_SETTINGS = {"transaction_state_log_num_partitions": STATE_PARTITIONS,
                   "offsets_topic_num_partitions": 3}
CLUSTER_SETTINGS = {**SETTINGS, "forward.request.timeout.ms": 3000,
                    "forward.delivery.timeout.ms": 10_000}
# How often the supervisor looks at the producers, and the chance it kills one then.
SUPERVISE_S = 0.5
PRODUCER_KILL_CHANCE = 0.05
SETUP_AND_CHECKS_S = 480


class Workload:
    """The producers (started again as they die) and the read_committed reader."""

    def __init__(self, cluster: LocalCluster, seed: int):
        self.cluster = cluster
        self.seed = seed
        self.chance = random.Random(seed)
        self.history = History()
        self.producers: dict[str, ProducerProcess] = {}
        self.runs = 0
        self.kills = 0
        self.stop = threading.Event()
        self.reader = threading.Thread(target=read_committed_all_along, daemon=True,
                                       args=(cluster.data_dir(1), self.history, self.stop))
        self.supervisor = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> None:
        for number in range(PRODUCERS):
            self._start(f"p{number}", number % 3 + 1)
        self.reader.start()
        self.supervisor.start()

    def _start(self, transactional_id: str, broker_id: int) -> None:
        self.runs += 1
        self.producers[transactional_id] = ProducerProcess(
            self.cluster.data_dir(broker_id), transactional_id, self.runs, self.history,
            self.seed, timeout_ms=TRANSACTION_TIMEOUT_MS)

    def _supervise(self) -> None:
        while not self.stop.wait(SUPERVISE_S):
            running = sorted(set(self.cluster.brokers) - self.cluster.paused)
            for transactional_id, producer in sorted(self.producers.items()):
                killed = self.chance.random() < PRODUCER_KILL_CHANCE
                if producer.process.poll() is None and not killed:
                    continue
                producer.kill()
                self.kills += killed
                if running and not self.stop.is_set():
                    self._start(transactional_id, self.chance.choice(running))

    def finish(self) -> None:
        self.stop.set()
        self.supervisor.join(WAIT_S)
        for producer in self.producers.values():
            producer.kill()
        self.reader.join(WAIT_S)


def committed(history: History) -> int:
    return sum(end is TransactionEnd.COMMITTED for _, end in history.transactions().values())


def open_transactions_ended(cluster: LocalCluster, broker_id: int) -> bool:
    """Whether the broker's replicas show no transaction open: the read_committed
    end (the LSO) is the log end in every partition."""
    partitions = [TopicPartition(TOPIC, partition) for partition in range(PARTITIONS)]
    try:
        ends = {}
        for isolation_level in ("read_committed", "read_uncommitted"):
            with Consumer(bootstrap=cluster.data_dir(broker_id),
                          isolation_level=isolation_level) as consumer:
                ends[isolation_level] = consumer.end_offsets(partitions)
    except ShmlogError:
        return False
    return ends["read_committed"] == ends["read_uncommitted"]


def run_transactions_nemesis(topology, directory: str, duration_s: float) -> None:
    seed = run_seed()
    steps = make_schedule(seed, duration_s, tuple(MEMBERS), ALL_FAULT_KINDS)
    print(f"\ntransactions nemesis seed {seed} ({SEED_VARIABLE}={seed} plays it again), "
          f"{duration_s:.0f} s of faults")
    cluster, zookeeper = start_cluster(topology, directory, CLUSTER_SETTINGS, BROKER_SETTINGS)
    nemesis = Nemesis(cluster, topology, MEMBERS, zookeeper=zookeeper)
    workload = Workload(cluster, seed)
    try:
        create_topic(cluster, TOPIC, PARTITIONS)
        for partition in range(PARTITIONS):
            wait_in_sync(cluster, TOPIC, tuple(MEMBERS), partition)
        with Producer(cluster.data_dir(1), transactional_id="warm-up") as warm_up:
            warm_up.init_transactions()           # makes __transaction_state
        workload.start()
        cluster.wait_for(lambda: committed(workload.history) >= 10, WAIT_S,
                         "transactions before the faults", interval_s=0.2)
        try:
            nemesis.run(steps, duration_s)
        finally:
            nemesis.heal_all()
            workload.finish()
        print(nemesis.report())
        nemesis.check_alive()
        for topic, partitions in ((TOPIC, PARTITIONS), (TRANSACTION_STATE_TOPIC,
                                                        STATE_PARTITIONS)):
            for partition in range(partitions):
                wait_in_sync(cluster, topic, tuple(MEMBERS), partition)
        # A fresh producer of each id fences (and aborts) what its last run left open.
        for transactional_id in sorted(workload.producers):
            with Producer(cluster.data_dir(1), transactional_id=transactional_id) as fencer:
                fencer.init_transactions()
        for broker_id in MEMBERS:
            cluster.wait_for(lambda broker_id=broker_id: open_transactions_ended(
                cluster, broker_id), WAIT_S, f"no transaction open on broker {broker_id}",
                interval_s=0.5)
        logs = {broker_id: (final_logs(cluster.data_dir(broker_id), "read_uncommitted"),
                            final_logs(cluster.data_dir(broker_id), "read_committed"))
                for broker_id in MEMBERS}
        for broker_id in MEMBERS:
            assert logs[broker_id] == logs[1], f"broker {broker_id}'s replicas differ from 1's"
        verdict = workload.history.check(logs[1][0], committed_logs=logs[1][1])
        print(verdict, f"producer runs {workload.runs}, killed by the test {workload.kills}")
        verdict.assert_ok()
        assert verdict.counts["transactions committed"] and \
            verdict.counts["transactions aborted"], verdict.counts
        assert verdict.counts["reads"], "the read_committed consumer read nothing"
    except Exception as error:
        raise AssertionError(f"transactions nemesis seed {seed}: {type(error).__name__}: "
                             f"{error}\n{nemesis.report()}") from error
    finally:
        workload.finish()
        stop_cluster(cluster)              # ZooKeeper goes with the topology


@pytest.mark.timeout(run_seconds(DEFAULT_SECONDS) + SETUP_AND_CHECKS_S)
def test_transactions_hold_under_the_nemesis(topology, tmp_path):
    run_transactions_nemesis(topology, str(tmp_path), run_seconds(DEFAULT_SECONDS))
