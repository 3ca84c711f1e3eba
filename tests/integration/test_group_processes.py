"""Consumer groups across processes: four members share a 12-partition topic.

What is shown:

* every partition is owned by exactly one member once the group is stable, and no
  partition is ever processed by two members in the same generation;
* with commits after processing and no failures, every record is processed exactly
  once (while one generation stands: a member that misses its session on a loaded
  machine makes a new one, and then at least once);
* after ``kill -9`` of one member, its partitions move to the others (how soon is
  measured by perf/bench_groups.py, not asserted), and every record is processed at
  least once;
* a broker restart keeps the committed offsets, and members resume from them.

Method: a real broker process and four member processes (``MEMBER`` below). A
member's "processing" is appending a line per record (generation, partition,
offset) to its own file before it commits; the file outlives a kill. A member whose
commit is fenced or not answered goes on polling, as a Kafka application must (what
it processed since its last stored commit is processed again). Every wait is
bounded; every process is stopped (or killed) and /dev/shm is cleaned up.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import pytest

from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.client.reader import warm_kernels
from shmlog.common.errors import GroupIdNotFoundError
from shmlog.devtools.local_cluster import poll_until
from shmlog.server.broker import Broker, request, shared_memory_prefix
from shmlog.shm import shared_memory

PARTITIONS = 12
MEMBERS = 4
SESSION_TIMEOUT_MS = 2_000
WAIT_S = 60

MEMBER = r"""
import json, os, sys, time
from shmlog.client.consumer import Consumer, ConsumerRebalanceListener
from shmlog.common.errors import BrokerNotAvailableError, CommitFailedError

data_dir, group, out_path, stop_path, strategy = sys.argv[1:6]
out = open(out_path, "a", buffering=1)

class Listener(ConsumerRebalanceListener):
    def on_partitions_assigned(self, assigned):
        out.write(json.dumps({"event": "assigned", "pid": os.getpid(),
                              "generation": consumer.group_metadata().generation_id,
                              "assignment": sorted(p for _, p in consumer.assignment())}) + "\n")

consumer = Consumer(bootstrap=data_dir, group_id=group, auto_offset_reset="earliest",
                    enable_auto_commit=False, session_timeout_ms=int(sys.argv[6]),
                    heartbeat_interval_ms=200, partition_assignment_strategy=[strategy])
consumer.subscribe(["events"], listener=Listener())
while not os.path.exists(stop_path):
    polled = consumer.poll(timeout_ms=100)
    generation = consumer.group_metadata().generation_id
    for partition, records in polled.items():
        for record in records:
            out.write(json.dumps({"event": "record", "pid": os.getpid(),
                                  "generation": generation, "partition": partition.partition,
                                  "offset": record.offset}) + "\n")
    if polled:
        try:
            consumer.commit()        # after processing: at least once
        except (CommitFailedError, BrokerNotAvailableError):
            # Fenced (a rebalance went on without us), or no answer in time (the
            # commit may not have been stored): what was processed since the last
            # stored commit is processed again by whoever owns the partitions next.
            # The next poll rejoins if need be, as a Kafka application does.
            pass
consumer.close()
"""


@pytest.fixture
def cluster(tmp_path):
    # Fill numba's disk cache with the consumer's kernels once, here, so that four
    # members starting together load them instead of compiling them four times
    # over on a small machine (each loads them before it joins: reader.warm_kernels).
    warm_kernels()
    data_dir = str(tmp_path / "data")
    broker = Broker(data_dir, group_initial_rebalance_delay_ms=1_000,
                    group_min_session_timeout_ms=500).start()
    members: list[subprocess.Popen] = []
    state = {"broker": broker, "members": members, "data_dir": data_dir, "tmp": tmp_path}
    try:
        Admin(data_dir).create_topic("events", partitions=PARTITIONS)
        yield state
    finally:
        (tmp_path / "stop").touch()
        for member in members:
            try:
                member.wait(timeout=30)
            except subprocess.TimeoutExpired:
                member.kill()
                member.wait(timeout=30)
        state["broker"].stop()
        for name in os.listdir("/dev/shm"):
            if name.startswith(shared_memory_prefix(data_dir)):
                shared_memory.unlink(name)


def start_member(state, index: int, strategy: str = "range") -> subprocess.Popen:
    member = subprocess.Popen([sys.executable, "-c", MEMBER, state["data_dir"], "workers",
                               str(state["tmp"] / f"member-{index}.jsonl"),
                               str(state["tmp"] / "stop"), strategy, str(SESSION_TIMEOUT_MS)])
    state["members"].append(member)
    return member


def produce(data_dir: str, count: int, start: int) -> set[tuple[int, int]]:
    """``count`` keyed records; returns their (partition, offset)."""
    with Producer(data_dir) as producer:
        futures = [producer.send("events", f"v{start + index}".encode(),
                                 key=f"k{start + index}".encode()) for index in range(count)]
        producer.flush(timeout=60)
        return {(future.get(timeout=60).partition, future.get(timeout=60).offset)
                for future in futures}


def events(state) -> list[dict]:
    found = []
    for path in state["tmp"].glob("member-*.jsonl"):
        with open(path) as source:
            for line in source:
                if line.endswith("\n"):          # a killed member may leave half a line
                    found.append(json.loads(line))
    return found


def processed(state) -> collections.Counter:
    return collections.Counter((event["partition"], event["offset"]) for event in events(state)
                               if event["event"] == "record")


def wait_for(condition, what: str, timeout_s: float = WAIT_S):
    return poll_until(condition, timeout_s, what, interval_s=0.05)


def stable_owners(data_dir: str, members: int):
    """The group's assignment once it is stable with ``members`` members, every
    partition owned once; else None."""
    try:
        described = request(data_dir, "describe_group", group_id="workers")
    except GroupIdNotFoundError:
        return None                            # nobody joined yet
    if described["state"] != "Stable" or len(described["members"]) != members:
        return None
    owned = [partition for member in described["members"]
             for _, partition in member["assignment"]]
    return described if sorted(owned) == list(range(PARTITIONS)) else None


def check_one_owner_per_generation(state) -> None:
    """No partition is processed by two members, nor assigned to two, in a generation."""
    owners = collections.defaultdict(set)
    for event in events(state):
        if event["event"] == "record":
            owners[(event["generation"], event["partition"])].add(event["pid"])
        else:
            for partition in event["assignment"]:
                owners[(event["generation"], partition)].add(event["pid"])
    shared = {key: pids for key, pids in owners.items() if len(pids) > 1}
    assert not shared, f"(generation, partition) owned by several members: {shared}"


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_four_members_share_the_topic_and_survive_a_kill(cluster, strategy):
    data_dir = cluster["data_dir"]
    for index in range(MEMBERS):
        start_member(cluster, index, strategy)
    described = wait_for(lambda: stable_owners(data_dir, MEMBERS), "a stable group of four")
    assert sorted(len(member["assignment"]) for member in described["members"]) == [3, 3, 3, 3]

    produced = produce(data_dir, 6_000, 0)
    wait_for(lambda: set(processed(cluster)) >= produced, "every record processed")
    counts = processed(cluster)
    # Exactly once while the generation stands; a member that missed its session on
    # a loaded machine starts a new one, and then a record may be processed again.
    if request(data_dir, "describe_group", group_id="workers")["generation"] \
            == described["generation"]:
        assert all(counts[record] == 1 for record in produced), \
            "exactly once within one generation"

    victim = cluster["members"][0]
    victim_partitions = {partition for member in described["members"]
                         for _, partition in member["assignment"]
                         if member["client_id"] == f"shmlog-{victim.pid}"}
    assert len(victim_partitions) == 3
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    described = wait_for(lambda: stable_owners(data_dir, MEMBERS - 1), "the group of three",
                         timeout_s=SESSION_TIMEOUT_MS / 1000 + 30)
    survivors = {member["client_id"] for member in described["members"]}
    assert f"shmlog-{victim.pid}" not in survivors

    more = produce(data_dir, 3_000, 6_000)
    wait_for(lambda: set(processed(cluster)) >= produced | more, "records after the kill")
    check_one_owner_per_generation(cluster)

    (cluster["tmp"] / "stop").touch()
    for member in cluster["members"][1:]:
        assert member.wait(timeout=30) == 0
    described = request(data_dir, "describe_group", group_id="workers")
    assert described["state"] == "Empty"
    assert all(entry["lag"] == 0 for entry in described["partitions"]), described


def test_committed_offsets_survive_a_broker_restart(cluster):
    data_dir = cluster["data_dir"]
    start_member(cluster, 0)
    wait_for(lambda: stable_owners(data_dir, 1), "the member's group")
    first = produce(data_dir, 1_200, 0)
    wait_for(lambda: set(processed(cluster)) >= first, "the first records processed")
    (cluster["tmp"] / "stop").touch()
    assert cluster["members"].pop().wait(timeout=30) == 0
    (cluster["tmp"] / "stop").unlink()
    committed = {entry["partition"]: entry["committed"] for entry in
                 request(data_dir, "describe_group", group_id="workers")["partitions"]}
    assert sum(committed.values()) == len(first)

    cluster["broker"].stop()
    cluster["broker"] = Broker(data_dir, group_initial_rebalance_delay_ms=1_000,
                               group_min_session_timeout_ms=500).start()
    after = {entry["partition"]: entry["committed"] for entry in
             request(data_dir, "describe_group", group_id="workers")["partitions"]}
    assert after == committed, "offsets were read back from __consumer_offsets"

    second = produce(data_dir, 600, 1_200)
    start_member(cluster, 1)
    wait_for(lambda: set(processed(cluster)) >= first | second, "the new records processed")
    counts = processed(cluster)
    assert all(counts[record] == 1 for record in first | second), \
        "the new member resumed at the committed offsets"
