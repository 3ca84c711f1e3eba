"""Transactions across hosts: the coordinator of a transactional id is the leader of its
``__transaction_state`` partition, its states are replicated with acks=all, its
markers go to every partition's leader, and a partition's leader verifies a
transaction's first batch with the coordinator (KIP-890).

Method: a real ZooKeeper and three real brokers on 127.0.0.x (LocalCluster; the
transaction state and offsets topics made with 3 partitions and 3 replicas, the data
topics with 3 replicas and min.insync.replicas 2, their leaders spread over the three
brokers). The producers and consumers talk to their local broker, which forwards what
another broker leads. What each test claims is read back through read_committed and
read_uncommitted consumers on other brokers than the producer's, and from every
replica. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time

import pytest

from cluster.test_groups_across_hosts import create_topic
from cluster.workload import SETTINGS, stop_cluster, wait_in_sync
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, OffsetAndMetadata, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import ProducerFencedError, ShmlogError, TransactionStillOngoingError
from shmlog.common.internal_topics import TRANSACTION_STATE_TOPIC
from shmlog.devtools.local_cluster import LocalCluster
from shmlog.groups import offsets_partition
from shmlog.protocol.control_client import request

STATE_PARTITIONS = 3
BROKER_SETTINGS = {"transaction_state_log_num_partitions": STATE_PARTITIONS,
                   "offsets_topic_num_partitions": 3,
                   "group_initial_rebalance_delay_ms": 300}
CLUSTER_SETTINGS = {**SETTINGS, "forward.request.timeout.ms": 3000,
                    "forward.delivery.timeout.ms": 10_000}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = LocalCluster(str(tmp_path_factory.mktemp("transactions-across-hosts")), 3,
                           zookeeper_connect=zookeeper.connect_string,
                           settings=CLUSTER_SETTINGS, broker_settings=BROKER_SETTINGS,
                           log_files=True).start()
    try:
        yield running
    finally:
        stop_cluster(running)


def send_spread(producer, topic: str, prefix: bytes, count: int = 30) -> list:
    """``count`` records, ``prefix`` + n, to partition n % 3: their futures."""
    return [producer.send(topic, prefix + b"%d" % n, partition=n % 3) for n in range(count)]


def appended(futures: list) -> None:
    """Every send appended (an abort says nothing of a refused one)."""
    for future in futures:
        future.get(timeout=WAIT_S)


def leaders(cluster: LocalCluster, topic: str) -> list[int]:
    return [entry["leader"] for entry in
            Admin(cluster.data_dir(1)).describe_topic(topic)["partitions"]]


def read_all(data_dir: str, topic: str, partitions: int, isolation_level: str) -> dict:
    """{partition: [values]} a consumer on ``data_dir`` reads up to its end offsets (the
    LSO with read_committed)."""
    tps = [TopicPartition(topic, partition) for partition in range(partitions)]
    with Consumer(bootstrap=data_dir, auto_offset_reset="earliest",
                  isolation_level=isolation_level) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        values = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{data_dir}: reading {topic}"
            for tp, records in consumer.poll(timeout_ms=200).items():
                values[tp.partition] += [record.value for record in records]
    return values


def wait_until_stable(cluster: LocalCluster, broker_id: int, topic: str, partitions: int,
                      at_least: list[int]) -> None:
    """Until broker ``broker_id``'s replicas show an LSO at or past ``at_least``."""
    tps = [TopicPartition(topic, partition) for partition in range(partitions)]

    def stable():
        with Consumer(bootstrap=cluster.data_dir(broker_id),
                      isolation_level="read_committed") as consumer:
            ends = consumer.end_offsets(tps)
        return all(ends[tp] >= at_least[tp.partition] for tp in tps)
    cluster.wait_for(stable, WAIT_S, f"the LSO of {topic} on broker {broker_id}",
                     interval_s=0.1)


def test_a_transaction_across_three_leaders_commits_and_aborts_atomically(cluster):
    topic = "txn-across"
    create_topic(cluster, topic, 3)
    assert sorted(set(leaders(cluster, topic))) == [1, 2, 3], "one partition per leader"
    with Producer(cluster.data_dir(1), transactional_id="across", acks="all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        send_spread(producer, topic, b"c")
        producer.commit_transaction()
        producer.begin_transaction()
        futures = send_spread(producer, topic, b"a")
        producer.flush()
        appended(futures)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"last", partition=0)
        producer.commit_transaction()
    committed = {partition: [b"c%d" % n for n in range(partition, 30, 3)]
                 for partition in range(3)}
    committed[0].append(b"last")
    # Each partition: 10 committed, a COMMIT marker, 10 aborted, an ABORT marker, one
    # more and its COMMIT marker.
    for broker_id in cluster.brokers:
        wait_until_stable(cluster, broker_id, topic, 3, [23, 22, 22])
        assert read_all(cluster.data_dir(broker_id), topic, 3, "read_committed") == committed
        uncommitted = read_all(cluster.data_dir(broker_id), topic, 3, "read_uncommitted")
        for partition in range(3):
            assert uncommitted[partition][:10] == committed[partition][:10]
            assert uncommitted[partition][10:20] == \
                [b"a%d" % n for n in range(partition, 30, 3)]


def test_the_coordinator_is_the_state_partition_leader_and_fences_zombies(cluster):
    topic = "txn-zombies"
    create_topic(cluster, topic, 3)
    transactional_id = "zombie"
    partition = offsets_partition(transactional_id, STATE_PARTITIONS)
    with Producer(cluster.data_dir(2), transactional_id=transactional_id) as old:
        old.init_transactions()
        coordinator = leaders(cluster, TRANSACTION_STATE_TOPIC)[partition]
        old.begin_transaction()
        old.send(topic, b"zombie", partition=1).get(timeout=WAIT_S)
        # A new producer of the id, through another broker: the old one's open
        # transaction is aborted, and the old one fenced.
        through = next(broker_id for broker_id in cluster.brokers if broker_id != 2)
        with Producer(cluster.data_dir(through), transactional_id=transactional_id) as new:
            new.init_transactions()
            new.begin_transaction()
            new.send(topic, b"fresh", partition=1)
            new.commit_transaction()
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
    described = request(cluster.data_dir(3), "describe_transactions",
                        transactional_ids=[transactional_id])
    assert [entry["state"] for entry in described["transactions"]] == ["CompleteCommit"]
    assert coordinator in cluster.brokers
    for broker_id in cluster.brokers:
        wait_until_stable(cluster, broker_id, topic, 3, [0, 4, 0])
        assert read_all(cluster.data_dir(broker_id), topic, 3,
                        "read_committed")[1] == [b"fresh"]


def coordinator_of(cluster: LocalCluster, transactional_id: str) -> int:
    """The leader of the id's __transaction_state partition, as every running broker
    sees it."""
    partition = offsets_partition(transactional_id, STATE_PARTITIONS)

    def agreed():
        try:
            seen = {Admin(cluster.data_dir(broker_id)).describe_topic(TRANSACTION_STATE_TOPIC)
                    ["partitions"][partition]["leader"] for broker_id in cluster.brokers}
        except ShmlogError:
            return None
        leader = seen.pop() if len(seen) == 1 else None
        return leader if leader in cluster.brokers else None
    return cluster.wait_for(agreed, WAIT_S, f"the coordinator of {transactional_id}",
                            interval_s=0.1)


def all_or_none(values: dict, prefix: bytes, count: int) -> bool:
    """Whether a transaction's ``count`` records (``prefix`` + n, spread over the
    partitions by n % 3) are all in ``values`` or none are; asserts no partial."""
    seen = sorted(value for partition in values.values() for value in partition
                  if value.startswith(prefix + b"-"))
    assert seen in ([], sorted(prefix + b"-%d" % n for n in range(count))), \
        f"transaction {prefix!r} is partly visible: {len(seen)} of {count} records"
    return bool(seen)


@pytest.mark.parametrize("moment", ["ongoing", "committing"])
def test_a_coordinator_killed_mid_transaction_leaves_it_whole(cluster, moment):
    """SIGKILL of the coordinator's broker while a transaction is open (its records
    acknowledged), or while its commit is under way: the producer's commit goes on
    against the new coordinator (it retries), and read_committed consumers on every
    broker see each transaction whole or not at all; a commit that returned is
    whole."""
    topic = f"txn-failover-{moment}"
    create_topic(cluster, topic, 3)
    transactional_id = f"failover-{moment}"
    # The producer's broker is not the coordinator's, so it lives on.
    with Producer(cluster.data_dir(1), transactional_id=transactional_id) as producer:
        producer.init_transactions()
        coordinator = coordinator_of(cluster, transactional_id)
        home = next(broker_id for broker_id in cluster.brokers if broker_id != coordinator)
    with Producer(cluster.data_dir(home), transactional_id=transactional_id,
                  acks="all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        send_spread(producer, topic, b"before-")
        producer.commit_transaction()
        producer.begin_transaction()
        appended(send_spread(producer, topic, b"during-"))
        committed = {}
        if moment == "ongoing":
            cluster.kill(coordinator)
            producer.commit_transaction()          # against the new coordinator
            committed["during"] = True
        else:
            outcome = []
            worker = threading.Thread(target=lambda: outcome.append(_commit(producer)))
            worker.start()
            cluster.kill(coordinator)
            worker.join(WAIT_S)
            assert not worker.is_alive(), "the commit did not end within the wait"
            committed["during"] = outcome == [None]
        # The next transaction goes through the new coordinator.
        producer.begin_transaction() if committed["during"] else producer.abort_transaction()
        if not committed["during"]:
            producer.begin_transaction()
        send_spread(producer, topic, b"after-")
        producer.commit_transaction()
    survivors = sorted(cluster.brokers)
    new_coordinator = coordinator_of(cluster, transactional_id)
    assert new_coordinator != coordinator and new_coordinator in survivors
    cluster.start_broker(coordinator)
    committed_reads(cluster, topic, lambda values: all_or_none(values, b"before", 30)
                    and all_or_none(values, b"after", 30)
                    and all_or_none(values, b"during", 30) == committed["during"],
                    "every transaction whole")


def committed_reads(cluster: LocalCluster, topic: str, condition, what: str) -> dict:
    """For every broker, wait until what a read_committed consumer there reads of
    ``topic`` ({partition: [values]}) meets ``condition``: {broker id: values}."""
    seen = {}
    for broker_id in sorted(cluster.brokers):
        def read(broker_id=broker_id):
            try:
                values = read_all(cluster.data_dir(broker_id), topic, 3, "read_committed")
            except ShmlogError:
                return None
            return values if condition(values) else None
        seen[broker_id] = cluster.wait_for(read, WAIT_S, f"{what} on broker {broker_id}",
                                           interval_s=0.5)
    return seen


def test_a_commit_returns_only_once_every_partition_has_its_marker(cluster):
    """SIGSTOP of a partition's leader (neither the coordinator nor the producer's
    broker) while a transaction commits: its marker cannot be written there, so the
    commit waits for it (retried there, or at the partition's next leader). Were the
    commit answered sooner, the producer's next transaction, at the same epoch, would
    find the first one still open in that partition and its batch would join it
    unverified: aborted, its record would become visible with the late COMMIT marker."""
    topic = "txn-late-marker"
    create_topic(cluster, topic, 3)
    transactional_id = "late-marker"
    with Producer(cluster.data_dir(1), transactional_id=transactional_id) as producer:
        producer.init_transactions()
    coordinator = coordinator_of(cluster, transactional_id)
    home = next(broker_id for broker_id in sorted(cluster.brokers) if broker_id != coordinator)
    paused = next(broker_id for broker_id in sorted(cluster.brokers)
                  if broker_id not in (coordinator, home))
    partition = leaders(cluster, topic).index(paused)
    outcome = []

    def commit_then_abort_the_next(producer):
        outcome.append(_commit(producer))
        try:
            producer.begin_transaction()
            producer.send(topic, b"aborted", partition=partition)
            producer.flush()
            producer.abort_transaction()
        except ShmlogError as error:       # e.g. the first one still decided as COMMIT
            outcome.append(error)
        else:
            outcome.append("aborted")

    with Producer(cluster.data_dir(home), transactional_id=transactional_id,
                  acks="all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        appended(send_spread(producer, topic, b"committed-"))
        cluster.pause(paused)
        worker = threading.Thread(target=commit_then_abort_the_next, args=(producer,))
        try:
            worker.start()
            # Longer than one attempt at the marker (forward.request.timeout.ms).
            time.sleep(CLUSTER_SETTINGS["forward.request.timeout.ms"] / 1000 + 1.5)
        finally:
            cluster.resume(paused)
        worker.join(WAIT_S)
        assert not worker.is_alive(), "the transactions did not end within the wait"
    assert outcome == [None, "aborted"], outcome
    for partition_ in range(3):       # the paused broker back (its session expired)
        wait_in_sync(cluster, topic, tuple(sorted(cluster.brokers)), partition_)
    # Every committed record, once each replica has its marker (one may lag).
    reads = committed_reads(cluster, topic, lambda values: sum(
        value.startswith(b"committed-") for part in values.values() for value in part) == 30,
        "the commit visible")
    for broker_id, values in reads.items():
        assert b"aborted" not in values[partition], \
            f"broker {broker_id}: the aborted transaction's record is visible"


def _commit(producer) -> Exception | None:
    try:
        producer.commit_transaction()
    except ShmlogError as error:
        return error
    return None


def test_offsets_sent_to_a_transaction_commit_with_it_across_hosts(cluster):
    """A consume-transform-produce step across hosts: the group's coordinator, the
    transaction's coordinator and the output's leaders are different brokers. The
    offsets committed in an aborted transaction never count; in a committed one they
    count exactly when its output is visible."""
    source, sink, group_id = "ctp-in", "ctp-out", "ctp-group"
    create_topic(cluster, source, 3)
    create_topic(cluster, sink, 3)
    with Producer(cluster.data_dir(1), acks="all") as plain:
        for partition in range(3):
            plain.send_batch(source, [b"%d-%d" % (partition, n) for n in range(5)],
                             partition=partition).get(WAIT_S)
    tps = [TopicPartition(source, partition) for partition in range(3)]
    with Consumer(source, bootstrap=cluster.data_dir(2), group_id=group_id,
                  auto_offset_reset="earliest", enable_auto_commit=False,
                  isolation_level="read_committed") as consumer, \
            Producer(cluster.data_dir(3), transactional_id="ctp", acks="all") as producer:
        producer.init_transactions()
        records, deadline = [], time.monotonic() + WAIT_S
        while len(records) < 15:
            assert time.monotonic() < deadline, "consuming the input"
            records += [record for batch in consumer.poll(timeout_ms=200).values()
                        for record in batch]
        offsets = {tp: OffsetAndMetadata(5, "") for tp in tps}
        for commit in (False, True):
            producer.begin_transaction()
            for record in records:
                producer.send(sink, record.value.upper(), partition=record.partition)
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            assert [consumer.committed(tp) for tp in tps] == \
                ([5, 5, 5] if commit else [None, None, None])
    expected = {partition: [b"%d-%d" % (partition, n) for n in range(5)]
                for partition in range(3)}
    for broker_id in cluster.brokers:
        wait_until_stable(cluster, broker_id, sink, 3, [12, 12, 12])
        assert read_all(cluster.data_dir(broker_id), sink, 3, "read_committed") == {
            partition: [value.upper() for value in values]
            for partition, values in expected.items()}


def test_listing_gathers_every_coordinator(cluster):
    """``list_transactions`` asked of any broker lists the ids of every coordinator."""
    topic = "txn-listed"
    create_topic(cluster, topic, 3)
    names = [f"listed-{n}" for n in range(6)]
    coordinators = set()
    for name in names:
        with Producer(cluster.data_dir(1), transactional_id=name) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, name.encode(), partition=0)
            producer.commit_transaction()
        coordinators.add(coordinator_of(cluster, name))
    assert len(coordinators) > 1, "the ids spread over several coordinators"
    for broker_id in cluster.brokers:
        listed = request(cluster.data_dir(broker_id), "list_transactions")
        assert listed["unreachable_brokers"] == []
        assert {entry["transactional_id"] for entry in listed["transactions"]} >= set(names)
        assert {entry["state"] for entry in listed["transactions"]
                if entry["transactional_id"] in names} == {"CompleteCommit"}


def test_a_kafka_clients_transactions_run_unchanged_against_the_cluster(cluster):
    """librdkafka's transactional producer (confluent-kafka), bootstrapped from every
    listener: FindCoordinator names the id's coordinator, AddPartitionsToTxn has each
    partition's leader admit it, EndTxn writes the markers across the three leaders;
    a read_committed consumer reads the committed transaction whole and nothing of
    the aborted one, and offsets sent to a transaction count when it commits."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka import TopicPartition as KafkaPartition
    topic, group_id = "txn-kafka-client", "txn-kafka-group"
    create_topic(cluster, topic, 3)
    producer = KafkaProducer({"bootstrap.servers": cluster.bootstrap_servers,
                              "transactional.id": "kafka-client", "linger.ms": 2})
    try:
        producer.init_transactions(WAIT_S)
        producer.begin_transaction()
        for n in range(30):
            producer.produce(topic, b"c%d" % n, partition=n % 3)
        producer.commit_transaction(WAIT_S)
        producer.begin_transaction()
        for n in range(30):
            producer.produce(topic, b"a%d" % n, partition=n % 3)
        producer.flush(WAIT_S)
        producer.abort_transaction(WAIT_S)
        offsets_of = KafkaConsumer({"bootstrap.servers": cluster.bootstrap_servers,
                                    "group.id": group_id, "enable.auto.commit": False})
        try:
            producer.begin_transaction()
            producer.produce(topic, b"with-offsets", partition=0)
            producer.send_offsets_to_transaction(
                [KafkaPartition(topic, partition, 7) for partition in range(3)],
                offsets_of.consumer_group_metadata(), WAIT_S)
            producer.commit_transaction(WAIT_S)
            committed = offsets_of.committed([KafkaPartition(topic, partition)
                                              for partition in range(3)], WAIT_S)
            assert [entry.offset for entry in committed] == [7, 7, 7]
        finally:
            offsets_of.close()
    finally:
        producer.flush(WAIT_S)
    expected = {partition: [b"c%d" % n for n in range(partition, 30, 3)]
                for partition in range(3)}
    expected[0].append(b"with-offsets")
    reader = KafkaConsumer({"bootstrap.servers": cluster.bootstrap_servers,
                            "group.id": "txn-kafka-reader", "auto.offset.reset": "earliest",
                            "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        reader.assign([KafkaPartition(topic, partition, 0) for partition in range(3)])
        seen = {partition: [] for partition in range(3)}
        deadline = time.monotonic() + WAIT_S
        while seen != expected:
            assert time.monotonic() < deadline, f"read_committed read {seen}"
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen[message.partition()].append(message.value())
    finally:
        reader.close()
    for broker_id in cluster.brokers:
        assert read_all(cluster.data_dir(broker_id), topic, 3, "read_committed") == expected



def test_find_hanging_judges_by_every_coordinator(cluster):
    """An operator's find-hanging against the leader of a partition judges its open
    transaction by what every coordinator holds: one coordinated by another broker
    is held, so hanging only past the bound asked, and its abort is refused; stats
    count it open and not hanging; once committed, nothing is open."""
    topic = "txn-hanging"
    create_topic(cluster, topic, 3)
    leader = leaders(cluster, topic)[0]
    state_leaders = leaders(cluster, TRANSACTION_STATE_TOPIC)
    transactional_id = next(
        name for name in (f"held-{n}" for n in range(100))
        if state_leaders[offsets_partition(name, STATE_PARTITIONS)] != leader)
    with Producer(cluster.data_dir(leader), transactional_id=transactional_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"open", partition=0).get(timeout=WAIT_S)
        data_dir = cluster.data_dir(leader)
        assert request(data_dir, "find_hanging_transactions",
                       max_transaction_timeout_ms=600_000)["transactions"] == []
        time.sleep(0.01)
        [found] = request(data_dir, "find_hanging_transactions",
                          max_transaction_timeout_ms=0)["transactions"]
        assert (found["transactional_id"], found["held_by_coordinator"],
                found["coordinator_state"]) == (transactional_id, True, "Ongoing")
        with pytest.raises(TransactionStillOngoingError):
            request(data_dir, "abort_hanging_transaction", topic=topic, partition=0,
                    start_offset=found["start_offset"])

        def counted():
            stats = request(data_dir, "stats")
            opened = {(entry["topic"], entry["partition"]): entry["open_transactions"]
                      for entry in stats["partitions"]}
            return stats["transactions"] is not None and opened[(topic, 0)] == 1 \
                and stats["transactions"]["hanging"] == []
        cluster.wait_for(counted, WAIT_S, "stats to count the open transaction", interval_s=0.2)
        producer.commit_transaction()
    wait_until_stable(cluster, leader, topic, 3, [2, 0, 0])
    assert request(cluster.data_dir(leader), "find_hanging_transactions",
                   max_transaction_timeout_ms=0)["transactions"] == []
