"""The nemesis: a bounded chaos run against a three-broker cluster in network
namespaces, judged afterwards by the history checker and the group's own records.

Goal (issue 15, "Nemesis"): under random kill -9, SIGSTOP/SIGCONT pauses (short,
and past the ZooKeeper session), partitions of a broker from its peers and of a
broker from ZooKeeper, acks=all idempotent producers lose no acknowledged write and
store none twice, the replicas end byte-identical, and a consumer group processes
every acknowledged record at least once without ever losing an acknowledged commit.

Method: ``netns.Topology`` (skipped, with the reason, without root, ``ip`` or
``nft``): ZooKeeper in namespace zk, broker i in namespace bi. A topic of three
partitions, RF 3, min.insync.replicas 2; one ``workload.LeaderFollowingProducer``
per partition (idempotent, acks=all, every send recorded in that partition's
``History``); a group of three member processes (``group_member_process.py``), one
attached to each broker, consuming and committing synchronously. The nemesis
(``nemesis.py``) plays a schedule drawn from a seed (printed first;
``SHMLOG_NEMESIS_SEED=<seed>`` plays it again) for ``DEFAULT_SECONDS`` (the
``slow`` soak: ``SOAK_SECONDS``; ``SHMLOG_NEMESIS_SECONDS`` overrides both). Then
everything is healed and, every wait bounded: each producer must be acknowledged
again, every ISR (the topic's and the offsets topic's) must be whole, every replica
caught up; every acknowledged (partition, offset) must be in some member's
processed records; ``workload.replica_verdict`` reads every replica's segment files
and runs the history checker per partition, with what the members read (from their
own broker's replica) as its reads; and each member's acknowledged commits must be
at or below what the coordinator returns once the members have left. The fault
schedule and the verdicts are printed, and put in the assertion message on failure.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from cluster.history import History, Outcome
from cluster.nemesis import ALL_FAULT_KINDS, HOLD_S, FaultKind, Nemesis, make_schedule
from cluster.test_groups_across_hosts import (
    BROKER_SETTINGS,
    CLUSTER_SETTINGS,
    ask,
    create_topic,
    read_member_log,
    settled,
    start_member,
)
from cluster.test_partitioned_follower import NamespacedZooKeeper, ip_command
from cluster.workload import (
    WAIT_S,
    LeaderFollowingProducer,
    replica_verdict,
    stop_cluster,
    wait_acked,
    wait_in_sync,
)
from shmlog.common.errors import ShmlogError
from shmlog.devtools.local_cluster import LocalCluster
from shmlog.groups import OFFSETS_TOPIC

TOPIC = "nemesis"
GROUP_ID = "nemesis-group"
PARTITIONS = 3
OFFSETS_PARTITIONS = BROKER_SETTINGS["offsets_topic_num_partitions"]
MEMBERS = {1: "b1", 2: "b2", 3: "b3"}
# Seconds of faults: the default run fits the suite's budget (a schedule plays every
# kind of fault once however short it is, about 25 s); the soak runs minutes.
DEFAULT_SECONDS = 20.0
SOAK_SECONDS = 600.0
SECONDS_VARIABLE = "SHMLOG_NEMESIS_SECONDS"
SEED_VARIABLE = "SHMLOG_NEMESIS_SEED"
# Every fault kind is in the default schedule (none is known to break the cluster).
DEFAULT_FAULTS = ALL_FAULT_KINDS
# Acknowledgements each producer gets before the faults, and again after the heal
# (the cluster must serve again, not merely hold its data).
ACKS_BEFORE = 50
ACKS_AFTER_HEAL = 50
# Setup (ZooKeeper, brokers, topic, group) and the checks after the heal take this
# long at most on a loaded machine, on top of the faults.
SETUP_AND_CHECKS_S = 480
# How long the member processes get to leave the group once told to stop.
MEMBER_STOP_TIMEOUT_S = 30.0


def run_seconds(default: float) -> float:
    return float(os.environ.get(SECONDS_VARIABLE) or default)


def run_seed() -> int:
    given = os.environ.get(SEED_VARIABLE)
    return int(given) if given else random.SystemRandom().randrange(2 ** 32)


def start_cluster(topology, directory: str, settings: dict = CLUSTER_SETTINGS,
                  broker_settings: dict = BROKER_SETTINGS) \
        -> tuple[LocalCluster, NamespacedZooKeeper]:
    """ZooKeeper in namespace zk and broker i in namespace bi, started."""
    zookeeper = NamespacedZooKeeper(topology, os.path.join(directory, "zookeeper"))
    connect = zookeeper.start()
    cluster = LocalCluster(
        os.path.join(directory, "cluster"), 3, zookeeper_connect=connect,
        settings=settings, broker_settings=broker_settings,
        hosts={broker_id: topology.address(member) for broker_id, member in MEMBERS.items()},
        launch_prefixes={broker_id: [ip_command(), "netns", "exec", topology.namespace(member)]
                         for broker_id, member in MEMBERS.items()},
        log_files=True)
    return cluster.start(), zookeeper


class Run:
    """One nemesis run's workload: producers, histories and group members."""

    def __init__(self, cluster: LocalCluster, directory: str):
        self.cluster, self.directory = cluster, directory
        self.histories = {partition: History() for partition in range(PARTITIONS)}
        self.producers = [LeaderFollowingProducer(cluster, TOPIC, self.histories[partition],
                                                  f"p{partition}", partition=partition)
                          for partition in range(PARTITIONS)]
        self.members: list[tuple] = []           # (broker id, process, log path)
        self.stop_path = os.path.join(directory, "stop")

    def start(self) -> None:
        """Topic, group and producers running, each producer acknowledged."""
        create_topic(self.cluster, TOPIC, PARTITIONS)
        for partition in range(PARTITIONS):
            wait_in_sync(self.cluster, TOPIC, tuple(MEMBERS), partition)
        ask(self.cluster, 1, "fetch_offsets", group_id=GROUP_ID)   # makes the offsets topic
        for broker_id in MEMBERS:
            self.members.append((broker_id, *start_member(
                self.cluster, broker_id, GROUP_ID, TOPIC, self.directory,
                f"member-{broker_id}")))
        for producer in self.producers:
            producer.start()
        for producer in self.producers:
            wait_acked(producer, ACKS_BEFORE)
        self.cluster.wait_for(lambda: settled(self.cluster, 1, GROUP_ID, len(self.members),
                                              PARTITIONS), WAIT_S, "the group to settle")

    def stop(self) -> None:
        """Stop the producers and the members (killed if they do not leave)."""
        for producer in self.producers:
            producer.stopping.set()
        for producer in self.producers:
            if producer.ident is not None:       # started
                producer.join(WAIT_S)
        open(self.stop_path, "a").close()
        deadline = time.monotonic() + MEMBER_STOP_TIMEOUT_S
        for _, process, _ in self.members:
            if process.poll() is None:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:
                    process.kill()
                    process.wait(timeout=WAIT_S)

    def acked(self) -> set[tuple[int, int]]:
        return {(partition, send.offset) for partition, history in self.histories.items()
                for send in history.sends() if send.outcome is Outcome.ACKED}

    def processed(self) -> set[tuple[int, int]]:
        return set().union(*(read_member_log(log)["processed"] for _, _, log in self.members))


def member_reads(log_path: str) -> dict[int, list[tuple[int, bytes | None]]]:
    """partition -> the (offset, value) pairs a member processed (its log's P lines)."""
    reads: dict[int, list] = {}
    with open(log_path) as lines:
        for line in lines:
            if not line.endswith("\n"):
                break                          # a line a kill cut short
            kind, *rest = line.split()
            if kind == "P":
                value = None if rest[2] == "-" else bytes.fromhex(rest[2])
                reads.setdefault(int(rest[0]), []).append((int(rest[1]), value))
    return reads


def check_after_heal(run: Run, nemesis: Nemesis) -> list[str]:
    """The checks after the heal (module docstring); what each found, for the output."""
    cluster = run.cluster
    nemesis.check_alive()
    for producer in run.producers:
        wait_acked(producer, producer.acked + ACKS_AFTER_HEAL)
    for producer in run.producers:
        producer.stop()
    for partition in range(PARTITIONS):
        wait_in_sync(cluster, TOPIC, tuple(MEMBERS), partition)
    for partition in range(OFFSETS_PARTITIONS):
        wait_in_sync(cluster, OFFSETS_TOPIC, tuple(MEMBERS), partition)
    acked = run.acked()
    try:
        cluster.wait_for(lambda: acked <= run.processed(), WAIT_S,
                         "the group to process every acknowledged record", interval_s=0.5)
    except ShmlogError:
        missing = sorted(acked - run.processed())
        raise AssertionError(f"{len(missing)} acknowledged records never processed by the "
                             f"group, e.g. {missing[:10]}") from None
    run.stop()
    # What the members read from their own broker's replica is a read like any other:
    # rule 4 holds it to the final log (no replica showed what a failover took back).
    for broker_id, _, log in run.members:
        for partition, reads in member_reads(log).items():
            run.histories[partition].read_many(partition, reads,
                                               reader=f"the member on broker {broker_id}")
    nemesis.check_alive()
    verdicts = []
    for partition in range(PARTITIONS):
        verdict = replica_verdict(cluster, TOPIC, run.histories[partition], partition)
        verdicts.append(f"{TOPIC}-{partition}: {verdict}")
        assert verdict.ok, "\n".join(verdicts)
    return verdicts + [check_commits(run, len(acked))]


def check_commits(run: Run, acked: int) -> str:
    """Every member's last acknowledged commit is at or below the group's committed
    offset (the members have left)."""
    committed = {entry[1]: entry[2] for entry in ask(
        run.cluster, 1, "fetch_offsets", group_id=GROUP_ID)["offsets"]}
    commits = 0
    for broker_id, _, log in run.members:
        for partition, offset in read_member_log(log)["commits"].items():
            commits += 1
            assert offset <= committed.get(partition, -1), \
                f"the member on broker {broker_id} had a commit of {TOPIC}-{partition} at " \
                f"{offset} acknowledged, but the group's committed offset is " \
                f"{committed.get(partition)}"
    return (f"group ok: {acked} acknowledged records all processed; the members' last "
            f"acknowledged commits ({commits}) are at or below the committed offsets "
            f"{dict(sorted(committed.items()))}")


def run_nemesis(topology, directory: str, duration_s: float, kinds) -> None:
    seed = run_seed()
    steps = make_schedule(seed, duration_s, tuple(MEMBERS), kinds)
    print(f"\nnemesis seed {seed} ({SEED_VARIABLE}={seed} plays it again), {duration_s:.0f} s "
          f"of faults, kinds: {', '.join(kind.value for kind in kinds)}")
    cluster, zookeeper = start_cluster(topology, directory)
    nemesis = Nemesis(cluster, topology, MEMBERS, zookeeper=zookeeper)
    run = Run(cluster, directory)
    try:
        run.start()
        try:
            nemesis.run(steps, duration_s)
        finally:
            nemesis.heal_all()
        print(nemesis.report())
        assert {entry.fault.kind for entry in nemesis.played} == set(kinds), \
            "the run did not play every kind of fault"
        verdicts = check_after_heal(run, nemesis)
        print("\n".join(verdicts))
    except Exception as error:
        try:
            nemesis.check_alive()             # a crashed broker explains most failures
            crashed = ""
        except AssertionError as crash:
            crashed = f"\n{crash}"
        raise AssertionError(f"nemesis seed {seed}: {type(error).__name__}: {error}{crashed}\n"
                             f"{nemesis.report()}") from error
    finally:
        run.stop()
        stop_cluster(cluster)


# --- the schedule: a pure function of the seed ---------------------------------------

def test_a_seed_gives_the_same_schedule_again():
    assert make_schedule(7, 300, (1, 2, 3)) == make_schedule(7, 300, (1, 2, 3))
    assert make_schedule(7, 300, (1, 2, 3)) != make_schedule(8, 300, (1, 2, 3))


def test_a_schedule_holds_bounded_faults_on_distinct_brokers():
    steps = make_schedule(11, 600, (1, 2, 3), (FaultKind.KILL, FaultKind.CUT_ZOOKEEPER))
    for step in steps:
        assert 1 <= len(step.faults) <= 2
        assert len({fault.target for fault in step.faults}) == len(step.faults)
        for fault in step.faults:
            assert fault.kind in (FaultKind.KILL, FaultKind.CUT_ZOOKEEPER)
            assert fault.target in (1, 2, 3)
            low, high = HOLD_S[fault.kind]
            assert low <= fault.hold_s <= high
    assert {len(step.faults) for step in steps} == {1, 2}


def test_a_step_kills_zookeeper_once_at_most():
    for seed in range(300):
        for step in make_schedule(seed, 120, (1, 2, 3)):
            assert sum(fault.kind is FaultKind.KILL_ZOOKEEPER for fault in step.faults) <= 1, \
                (seed, step)


def test_a_schedule_plans_just_enough_steps_for_its_length():
    steps = make_schedule(3, 120, (1, 2, 3))
    assert sum(step.length_s for step in steps) >= 120
    assert sum(step.length_s for step in steps[:-1]) < 120
    assert {fault.kind for step in steps for fault in step.faults} == set(ALL_FAULT_KINDS)


def test_a_short_schedule_still_plays_every_kind_of_fault():
    for seed in range(20):
        steps = make_schedule(seed, 1, (1, 2, 3))
        assert {fault.kind for step in steps for fault in step.faults} == set(ALL_FAULT_KINDS)


# --- the run ---------------------------------------------------------------------------

@pytest.mark.timeout(run_seconds(DEFAULT_SECONDS) + SETUP_AND_CHECKS_S)
def test_the_nemesis_finds_nothing(topology, tmp_path):
    run_nemesis(topology, str(tmp_path), run_seconds(DEFAULT_SECONDS), DEFAULT_FAULTS)


@pytest.mark.slow
@pytest.mark.timeout(run_seconds(SOAK_SECONDS) + SETUP_AND_CHECKS_S)
def test_the_nemesis_finds_nothing_soak(topology, tmp_path):
    run_nemesis(topology, str(tmp_path), run_seconds(SOAK_SECONDS), ALL_FAULT_KINDS)
