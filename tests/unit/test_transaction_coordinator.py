"""The transaction coordinator in a broker, in-process: producer ids and epochs per
transactional id (zombies fenced), partitions added, batches admitted, commit and
abort with their markers and the last stable offset, commits of offsets inside a
transaction, timeouts, and a restart that finishes what was stored.

Method: a ``BrokerCore`` on a temporary data directory, driven as ``serve`` drives
it (``handle`` a request frame, ``drain``), a ring in anonymous memory added to its
appender for the producer's batches, and the coordinator's ``tick`` called with a
time past a timeout (no test waits for a clock)."""

from __future__ import annotations

import time

import pytest

from helpers import TransactionalCore
from shmlog.broker.transaction_coordinator import (
    TransactionCoordinator,
    TransactionState,
    transaction_record,
)
from shmlog.common import limits
from shmlog.common.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from shmlog.record.records import encode_batch, now_ms
from shmlog.shm.completion import CompletionCode

TXN = "payments-1"


class World(TransactionalCore):
    """The transactions' in-process world (``helpers.TransactionalCore``), its
    transactional id this module's."""

    def __init__(self, data_dir: str):
        super().__init__(data_dir, transaction_state_log_num_partitions=2)

    def init(self, transactional_id: str = TXN, timeout_ms: int = 60_000) -> dict:
        return super().init(transactional_id, timeout_ms)


@pytest.fixture
def world(data_dir):
    made = World(data_dir)
    yield made
    made.core.close()


def test_a_committed_transaction_is_stable_on_every_partition_it_wrote(world):
    producer = world.init()
    assert producer["producer_epoch"] == 0
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0], ["out", 1]])
    assert world.send(producer, 0, [b"a", b"b"]) == 0
    assert world.send(producer, 1, [b"c"]) == 0
    assert world.send(producer, 0, [b"d"]) == 2
    assert world.stable(0) == (3, 0) and world.stable(1) == (1, 0)
    state = world.ask("describe_transactions", transactional_ids=[TXN])["transactions"][0]
    assert state["state"] == "Ongoing" and state["partitions"] == [["out", 0], ["out", 1]]
    world.ask("end_txn", **producer, committed=True)
    assert world.stable(0) == (4, 4) and world.stable(1) == (2, 2)     # the markers
    assert world.values(0) == [b"a", b"b", b"d"] and world.values(1) == [b"c"]
    assert world.ask("list_transactions")["transactions"] == [
        {"transactional_id": TXN, "producer_id": producer["producer_id"],
         "state": "CompleteCommit"}]
    world.ask("end_txn", **producer, committed=True)      # a retry is answered the same
    with pytest.raises(InvalidTxnStateError):
        world.ask("end_txn", **producer, committed=False)


def test_an_aborted_transaction_is_indexed(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"x", b"y"])
    world.ask("end_txn", **producer, committed=False)
    assert world.stable(0) == (3, 3)
    aborted = world.core.host.partition("out", 0).log.aborted_transactions(0, 3)
    assert [(entry.producer_id, entry.first_offset, entry.last_offset) for entry in aborted] \
        == [(producer["producer_id"], 0, 2)]


def test_a_second_producer_of_the_id_fences_the_first_and_aborts_its_transaction(world):
    zombie = world.init()
    world.ask("add_partitions_to_txn", **zombie, partitions=[["out", 0]])
    world.send(zombie, 0, [b"zombie"])
    successor = world.init()
    assert (successor["producer_id"], successor["producer_epoch"]) == \
        (zombie["producer_id"], zombie["producer_epoch"] + 1)
    assert world.stable(0) == (2, 2), "the open transaction was aborted"
    assert len(world.core.host.partition("out", 0).log.aborted_transactions(0, 2)) == 1
    with pytest.raises(ProducerFencedError):
        world.ask("add_partitions_to_txn", **zombie, partitions=[["out", 1]])
    with pytest.raises(ProducerFencedError):
        world.ask("end_txn", **zombie, committed=True)
    # The zombie's late batch is fenced by the partition too (the marker's epoch).
    assert world.send(zombie, 0, [b"late"]) < 0
    world.ask("add_partitions_to_txn", **successor, partitions=[["out", 0]])
    world.sequences.clear()
    assert world.send(successor, 0, [b"good"]) == 2
    world.ask("end_txn", **successor, committed=True)
    assert world.values(0) == [b"zombie", b"good"]


def test_requests_of_an_unknown_producer_or_partition_are_refused(world):
    producer = world.init()
    with pytest.raises(InvalidProducerIdMappingError):
        world.ask("add_partitions_to_txn", **{**producer, "producer_id": 12345},
                  partitions=[["out", 0]])
    with pytest.raises(InvalidProducerIdMappingError):
        world.ask("end_txn", **{**producer, "transactional_id": "never"}, committed=True)
    with pytest.raises(UnknownTopicOrPartitionError):
        world.ask("add_partitions_to_txn", **producer, partitions=[["nope", 0]])
    with pytest.raises(InvalidTransactionTimeoutError):
        world.init("slow", timeout_ms=10**9)
    with pytest.raises(InvalidTxnStateError):
        world.ask("end_txn", **producer, committed=True)        # nothing begun


def test_offsets_committed_in_a_transaction_count_only_once_it_commits(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"out"])
    with pytest.raises(InvalidTxnStateError, match="add"):
        world.ask("txn_offset_commit", **producer, group_id="g",
                  offsets=[["out", 1, 0, ""]])
    world.ask("add_offsets_to_txn", **producer, group_id="g")
    world.core.host.append("out", 1, encode_batch([b"input"] * 5))
    world.ask("txn_offset_commit", **producer, group_id="g", offsets=[["out", 1, 5, "m"]])
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == []
    world.ask("end_txn", **producer, committed=False)
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == []
    world.ask("add_offsets_to_txn", **producer, group_id="g")
    world.ask("txn_offset_commit", **producer, group_id="g", offsets=[["out", 1, 4, "n"]])
    world.ask("end_txn", **producer, committed=True)
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == [["out", 1, 4, "n"]]


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(world):
    producer = world.init(timeout_ms=1_000)
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"slow"])
    deadline = world.core.transactions.next_deadline()
    assert deadline is not None
    world.core.transactions.tick(deadline - 1)
    assert world.stable(0) == (1, 0), "not yet"
    world.core.transactions.tick(deadline)
    assert world.stable(0) == (2, 2)
    with pytest.raises(ProducerFencedError):
        world.ask("end_txn", **producer, committed=True)
    state = world.ask("describe_transactions", transactional_ids=[TXN])["transactions"][0]
    assert (state["state"], state["producer_epoch"]) == ("CompleteAbort", 1)


def test_a_restart_keeps_an_open_transaction_going_and_its_pending_offsets(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"before"])
    world.ask("add_offsets_to_txn", **producer, group_id="g")
    world.core.host.append("out", 1, encode_batch([b"input"] * 3))
    world.ask("txn_offset_commit", **producer, group_id="g", offsets=[["out", 1, 3, ""]])
    sequences = dict(world.sequences)
    world.restart()
    world.sequences = sequences
    assert world.stable(0) == (1, 0)
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == []
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 1]])
    assert world.send(producer, 0, [b"after"]) == 1
    world.ask("end_txn", **producer, committed=True)
    assert world.stable(0) == (3, 3)
    assert world.values(0) == [b"before", b"after"]
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == [["out", 1, 3, ""]]
    world.restart()
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == [["out", 1, 3, ""]], \
        "read back with its marker"
    assert world.init()["producer_epoch"] == 1, "the id's epoch was stored"


def test_a_marker_that_cannot_be_written_is_retried(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0], ["out", 1]])
    world.send(producer, 0, [b"a"])
    world.send(producer, 1, [b"b"])
    log = world.core.host.partition("out", 1).log
    world.core.host.appender.set_is_leader(world.core.host.partition("out", 1).row, False)
    world.ask("end_txn", **producer, committed=True)
    assert world.stable(0) == (2, 2) and log.log_end_offset == 1
    with pytest.raises(ConcurrentTransactionsError):
        world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.core.host.appender.set_is_leader(world.core.host.partition("out", 1).row, True)
    # A batch of the same epoch meanwhile joins neither the decided transaction nor a
    # new one (it would be committed by the marker still to come).
    assert world.send(producer, 1, [b"next"]) == -CompletionCode.INVALID_TXN_STATE
    world.core.transactions.tick(now_ms() + 60_000)
    assert log.log_end_offset == 2 and world.stable(1) == (2, 2)
    assert world.values(1) == [b"b"], "the refused batch is not in the log"
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])


def test_a_first_batch_adds_its_partition_without_a_request(world):
    """KIP-890's implicit add: the partition asks the coordinator, which adds it when
    the producer's id is at that epoch (and refuses a stranger or a stale epoch)."""
    producer = world.init()
    assert world.send(producer, 0, [b"implicit"]) == 0
    state = world.ask("describe_transactions", transactional_ids=[TXN])["transactions"][0]
    assert state["state"] == "Ongoing" and state["partitions"] == [["out", 0]]
    assert world.stable(0) == (1, 0)
    stranger = {**producer, "producer_id": producer["producer_id"] + 1000}
    assert world.send(stranger, 1, [b"stranger"]) == -CompletionCode.INVALID_TXN_STATE
    world.ask("end_txn", **producer, committed=True)
    assert world.stable(0) == (2, 2)
    successor = world.init()
    assert world.send(producer, 1, [b"stale"]) == -CompletionCode.INVALID_PRODUCER_EPOCH
    world.sequences.clear()
    assert world.send(successor, 1, [b"fresh"]) == 0


def test_a_restart_finishes_a_decision_whose_markers_were_not_all_written(world):
    """The coordinator stored PrepareCommit and wrote one of two markers when it went
    down (a partition it could not write): started again, it writes the rest from
    the stored decision, and the transaction commits on both partitions."""
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0], ["out", 1]])
    world.send(producer, 0, [b"a"])
    world.send(producer, 1, [b"b"])
    world.core.host.appender.set_is_leader(world.core.host.partition("out", 1).row, False)
    world.ask("end_txn", **producer, committed=True)
    assert world.stable(0) == (2, 2) and world.stable(1) == (1, 0)
    state = world.ask("describe_transactions", transactional_ids=[TXN])["transactions"][0]
    assert state["state"] == "PrepareCommit"
    world.restart()
    assert world.stable(1) == (2, 2), "the missing marker written at the start"
    state = world.ask("describe_transactions", transactional_ids=[TXN])["transactions"][0]
    assert state["state"] == "CompleteCommit"
    assert world.values(0) == [b"a"] and world.values(1) == [b"b"]


def test_an_idle_transactional_id_expires(data_dir):
    """Kafka's transactional.id.expiration.ms: an id with no transaction under way is
    forgotten once idle that long (a tombstone, so a restart forgets it too); one
    with a transaction open is not; the next init gets a new producer id."""
    world = TransactionalCore(data_dir, transactional_id_expiration_ms=60_000)
    try:
        idle = world.init("idle")
        busy = world.init("busy")
        world.send(busy, 0, [b"open"])
        deadline = world.core.transactions.next_deadline()
        world.core.transactions.tick(now_ms() + 59_000)
        assert {entry["transactional_id"] for entry in
                world.ask("list_transactions")["transactions"]} == {"idle", "busy"}
        world.core.transactions.tick(now_ms() + 61_000)
        assert [entry["transactional_id"] for entry in
                world.ask("list_transactions")["transactions"]] == ["busy"]
        assert deadline is not None
        world.restart()
        assert [entry["transactional_id"] for entry in
                world.ask("list_transactions")["transactions"]] == ["busy"]
        assert world.init("idle")["producer_id"] != idle["producer_id"]
    finally:
        world.core.close()


def test_a_restart_ends_pending_commits_only_in_their_own_offsets_partition(data_dir):
    """The producer's earlier transaction committed group "b"'s offsets (its marker in
    b's partition of __consumer_offsets); its open one holds "a"'s (a's partition, no
    marker yet). Read back partition by partition, b's marker must not commit a's."""
    from shmlog.groups import offsets_partition
    names = [f"g{number}" for number in range(20)]
    group_a = names[0]
    group_b = next(name for name in names if offsets_partition(name, 2) !=
                   offsets_partition(group_a, 2))
    world = TransactionalCore(data_dir, offsets_topic_num_partitions=2,
                              transaction_state_log_num_partitions=1)
    try:
        producer = world.init(TXN)
        world.core.host.append("out", 1, encode_batch([b"input"] * 5))
        world.ask("add_offsets_to_txn", **producer, group_id=group_b)
        world.ask("txn_offset_commit", **producer, group_id=group_b, offsets=[["out", 1, 2, ""]])
        world.ask("end_txn", **producer, committed=True)
        world.ask("add_offsets_to_txn", **producer, group_id=group_a)
        world.ask("txn_offset_commit", **producer, group_id=group_a, offsets=[["out", 1, 4, ""]])
        world.restart()
        assert world.ask("fetch_offsets", group_id=group_b)["offsets"] == [["out", 1, 2, ""]]
        assert world.ask("fetch_offsets", group_id=group_a)["offsets"] == [], \
            "a's commit waits for its own transaction's marker"
        world.ask("end_txn", **producer, committed=False)
        assert world.ask("fetch_offsets", group_id=group_a)["offsets"] == []
    finally:
        world.core.close()


def test_a_plain_commit_after_a_transactional_one_stands(world):
    producer = world.init()
    world.core.host.append("out", 1, encode_batch([b"input"] * 5))
    world.ask("add_offsets_to_txn", **producer, group_id="g")
    world.ask("txn_offset_commit", **producer, group_id="g", offsets=[["out", 1, 2, ""]])
    time.sleep(0.002)                                   # a later commit time
    world.ask("commit_offsets", group_id="g", offsets=[["out", 1, 4, "plain"]])
    world.ask("end_txn", **producer, committed=True)
    assert world.ask("fetch_offsets", group_id="g")["offsets"] == [["out", 1, 4, "plain"]]


class SentMarkers:
    """A coordinator whose markers are sent (a cluster's), the sends and stores kept."""

    def __init__(self):
        ids = iter(range(100, 200))
        self.stored, self.sent = [], []
        self.coordinator = TransactionCoordinator(
            allocate_producer_id=lambda: next(ids), store=self.stored.append,
            add_partition=lambda *added: None, max_timeout_ms=60_000,
            send_markers=lambda *sent: self.sent.append(sent))


def test_sent_markers_complete_the_transaction_once_all_are_written():
    world = SentMarkers()
    coordinator, now = world.coordinator, 1_000
    producer = coordinator.init_transactions(TXN, 60_000, now=now)
    coordinator.add_partitions_to_txn(TXN, **producer, partitions=[["a", 0], ["b", 0]],
                                      now=now)
    coordinator.end_txn(TXN, **producer, committed=True, now=now)
    (name, marker, partitions, first), = world.sent
    assert (name, marker.committed, partitions) == (TXN, True, [("a", 0), ("b", 0)])
    assert coordinator.markers_unwritten(TXN)
    assert coordinator.transactions[TXN].state is TransactionState.PREPARE_COMMIT
    deadline = coordinator.next_deadline()
    assert deadline is not None and deadline > now, "no busy loop while markers are out"
    coordinator.markers_written(TXN, first + 1, [("a", 0), ("b", 0)], {}, now)
    assert coordinator.markers_unwritten(TXN), "another round's reply is ignored"
    coordinator.markers_written(TXN, first, [("a", 0)], {("b", 0): ShmlogError("down")}, now)
    # b's marker waits for its retry: no round is out, the retry is the deadline.
    assert coordinator.markers_unwritten(TXN)
    assert coordinator.next_deadline() == now + limits.TRANSACTION_MARKER_RETRY_MS
    coordinator.tick(now + limits.TRANSACTION_MARKER_RETRY_MS)
    (_, _, partitions, second) = world.sent[-1]
    assert partitions == [("b", 0)] and second != first, "only the failed one again"
    coordinator.markers_written(TXN, second, [("b", 0)], {}, now)
    assert coordinator.transactions[TXN].state is TransactionState.COMPLETE_COMMIT
    assert world.stored[-1].state is TransactionState.COMPLETE_COMMIT
    assert not coordinator.markers_unwritten(TXN)


def test_an_unloaded_id_takes_no_late_marker_reply():
    world = SentMarkers()
    coordinator, now = world.coordinator, 1_000
    producer = coordinator.init_transactions(TXN, 60_000, now=now)
    coordinator.add_partitions_to_txn(TXN, **producer, partitions=[["a", 0]], now=now)
    coordinator.end_txn(TXN, **producer, committed=False, now=now)
    round_ = world.sent[-1][3]
    assert coordinator.unload(lambda name: name == TXN) == [TXN]
    coordinator.load([(key, value) for key, value in
                      (transaction_record(metadata) for metadata in world.stored[-1:])], now)
    reloaded = world.sent[-1][3]
    assert reloaded != round_, "the load sends the stored decision's markers again"
    coordinator.markers_written(TXN, round_, [("a", 0)], {}, now)
    assert coordinator.transactions[TXN].state is TransactionState.PREPARE_ABORT
    coordinator.markers_written(TXN, reloaded, [("a", 0)], {}, now)
    assert coordinator.transactions[TXN].state is TransactionState.COMPLETE_ABORT
