"""The operators' side of transactions, in-process: DescribeProducers of a partition,
find-hanging (a transaction the coordinator does not hold, one it holds with other
partitions only, one open past the max timeout), the abort of a hanging transaction
(its ABORT marker, the last stable offset freed, an aborted transaction indexed) and
its refusals (the coordinator holds it; nothing starts there); what ``stats``, the
Prometheus families and ``shmlog status`` show of transactions; and the
``shmlog transactions`` verbs, their requests answered by the same core.

Method: a ``BrokerCore`` on a temporary data directory driven as ``serve`` drives it
(``handle`` a request frame, ``drain``), a ring in anonymous memory added to its
appender for the producers' batches. A transaction the coordinator does not hold is
made as a lost coordinator leaves one: the partition told to admit a producer's
transactional batch (``PartitionHost.expect_transaction``, what AddPartitionsToTxn
does) with no coordinator state behind it. An old transaction is one whose first
batch carries a timestamp from long ago (no test waits for a clock).
"""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import TransactionalCore
from shmlog import cli
from shmlog.cli import transactions as transactions_cli
from shmlog.cli.status import status_lines
from shmlog.common.errors import (
    OpenTransactionNotFoundError,
    TransactionStillOngoingError,
    UnknownTopicOrPartitionError,
)
from shmlog.record.records import encode_batch, now_ms
from shmlog.server.prometheus import StatsCollector

TXN = "payments-1"
LOST_PRODUCER_ID = 900_000          # an id no transactional id maps to
MAX_TIMEOUT_MS = 120_000
HOUR_MS = 3_600_000


class World(TransactionalCore):
    """The transactions' in-process world (``helpers.TransactionalCore``) with this
    module's max timeout."""

    def __init__(self, data_dir: str):
        super().__init__(data_dir, transaction_state_log_num_partitions=1,
                         transaction_max_timeout_ms=MAX_TIMEOUT_MS)

    def init(self, transactional_id: str = TXN, timeout_ms: int = 60_000) -> dict:
        return super().init(transactional_id, timeout_ms)

    def lost(self, partition: int, producer_id: int = LOST_PRODUCER_ID) -> dict:
        """A producer whose partition admits its transaction, with no coordinator
        state behind it (as a lost ``__transaction_state`` leaves one)."""
        assert self.core.host.expect_transaction("out", partition, producer_id, 0)
        return {"producer_id": producer_id, "producer_epoch": 0}

    def send(self, producer: dict, partition: int, values: list[bytes],
             timestamp_ms: int | None = None) -> int:
        """A transactional batch of ``producer`` through the ring: its base offset."""
        result = super().send(producer, partition, values, timestamp_ms=timestamp_ms)
        assert result >= 0, result
        return result

    def last_stable_offset(self, partition: int) -> int:
        row = self.core.host.partition("out", partition).row
        return self.core.host.table.snapshot(row).last_stable_offset


@pytest.fixture
def world(data_dir):
    made = World(data_dir)
    yield made
    made.core.close()


def hanging(world: World, **fields) -> list[tuple]:
    found = world.ask("find_hanging_transactions", **fields)["transactions"]
    return [(entry["topic"], entry["partition"], entry["producer_id"], entry["start_offset"])
            for entry in found]


def test_describe_producers_shows_the_transactions_open_in_a_partition(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0], ["out", 1]])
    world.core.host.append("out", 0, encode_batch([b"plain"] * 2))
    written_at = now_ms()
    world.send(producer, 0, [b"a", b"b"], timestamp_ms=written_at)
    described = world.ask("describe_producers", topic="out", partition=0)
    assert described["producers"] == [{
        "topic": "out", "partition": 0, "producer_id": producer["producer_id"],
        "producer_epoch": 0, "start_offset": 2, "start_ms": written_at,
        "duration_ms": described["producers"][0]["duration_ms"], "transactional_id": TXN,
        "coordinator_state": "Ongoing", "timeout_ms": 60_000, "held_by_coordinator": True}]
    assert described["producers"][0]["duration_ms"] >= 0
    # Added to out-1 but nothing written there: no offset held back, not listed.
    assert world.ask("describe_producers", topic="out", partition=1)["producers"] == []
    assert hanging(world) == []
    with pytest.raises(UnknownTopicOrPartitionError):
        world.ask("describe_producers", topic="nope", partition=0)


def test_a_transaction_the_coordinator_does_not_hold_is_hanging_and_can_be_aborted(world):
    lost = world.lost(1)
    world.send(lost, 1, [b"x"])
    world.send(lost, 1, [b"y"])
    assert world.last_stable_offset(1) == 0
    found = world.ask("find_hanging_transactions")
    assert found["max_transaction_timeout_ms"] == MAX_TIMEOUT_MS
    assert [(entry["producer_id"], entry["start_offset"], entry["transactional_id"],
             entry["coordinator_state"], entry["held_by_coordinator"])
            for entry in found["transactions"]] == [(LOST_PRODUCER_ID, 0, None, None, False)]
    with pytest.raises(OpenTransactionNotFoundError, match="offset 1"):
        world.ask("abort_hanging_transaction", topic="out", partition=1, start_offset=1)
    aborted = world.ask("abort_hanging_transaction", topic="out", partition=1, start_offset=0)
    assert aborted == {"topic": "out", "partition": 1, "producer_id": LOST_PRODUCER_ID,
                       "producer_epoch": 0, "start_offset": 0, "marker_offset": 2}
    assert world.last_stable_offset(1) == 3
    indexed = world.core.host.partition("out", 1).log.aborted_transactions(0, 3)
    assert [(entry.producer_id, entry.first_offset, entry.last_offset)
            for entry in indexed] == [(LOST_PRODUCER_ID, 0, 2)]
    assert hanging(world) == []
    assert world.core.transaction_operations.hanging_aborted == 1


def test_a_partition_the_coordinators_transaction_does_not_name_is_hanging(world):
    """The coordinator holds the producer's transaction, Ongoing, with out-1 only:
    the transaction open in out-0 is one no marker of it will end."""
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 1]])
    world.send(producer, 1, [b"held"])
    world.lost(0, producer["producer_id"])
    world.send(producer, 0, [b"stray"])
    assert hanging(world) == [("out", 0, producer["producer_id"], 0)]
    with pytest.raises(TransactionStillOngoingError, match="let it time out, or fence"):
        world.ask("abort_hanging_transaction", topic="out", partition=1, start_offset=0)
    world.ask("abort_hanging_transaction", topic="out", partition=0, start_offset=0)
    assert world.last_stable_offset(0) == 2 and world.last_stable_offset(1) == 0
    world.ask("end_txn", **producer, committed=True)
    assert world.last_stable_offset(1) == 2
    assert hanging(world) == []


def test_a_held_transaction_open_past_the_max_timeout_is_hanging_but_not_aborted(world):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"old"], timestamp_ms=now_ms() - HOUR_MS)
    assert hanging(world) == [("out", 0, producer["producer_id"], 0)]
    assert hanging(world, max_transaction_timeout_ms=2 * HOUR_MS) == []
    assert hanging(world, topic="out", partition=1) == []
    assert hanging(world, topic="out") == [("out", 0, producer["producer_id"], 0)]
    with pytest.raises(TransactionStillOngoingError, match="Ongoing at the coordinator"):
        world.ask("abort_hanging_transaction", topic="out", partition=0, start_offset=0)
    assert world.last_stable_offset(0) == 0, "nothing was written"


def scrape(stats: dict) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(lambda: stats))
    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_stats_prometheus_and_status_show_transactions_and_the_hanging_ones(world):
    committed, timed_out = world.init(), world.init("slow", timeout_ms=1_000)
    world.ask("add_partitions_to_txn", **committed, partitions=[["out", 0]])
    world.send(committed, 0, [b"a"])
    world.ask("end_txn", **committed, committed=True)
    world.ask("add_partitions_to_txn", **timed_out, partitions=[["out", 0]])
    world.send(timed_out, 0, [b"b"])
    world.core.transactions.tick(world.core.transactions.next_deadline())
    world.ask("add_partitions_to_txn", **committed, partitions=[["out", 0]])
    world.send(committed, 0, [b"c"])                      # open, held: not hanging
    world.send(world.lost(1), 1, [b"d", b"e"])            # hanging
    stats = world.ask("stats")
    transactions = stats["transactions"]
    assert transactions["states"] == {"Empty": 0, "Ongoing": 1, "PrepareCommit": 0,
                                      "PrepareAbort": 0, "CompleteCommit": 0,
                                      "CompleteAbort": 1}
    assert (transactions["commits"], transactions["aborts"], transactions["timed_out"],
            transactions["open"], transactions["hanging_aborted"]) == (1, 1, 1, 2, 0)
    assert [(entry["topic"], entry["partition"], entry["start_offset"])
            for entry in transactions["hanging"]] == [("out", 1, 0)]
    out = {entry["partition"]: entry for entry in stats["partitions"] if entry["topic"] == "out"}
    assert (out[0]["last_stable_offset"], out[0]["open_transactions"]) == (4, 1)
    assert (out[1]["last_stable_offset"], out[1]["open_transactions"]) == (0, 1)
    assert out[0]["high_watermark"] == 5

    samples = scrape(stats)
    out_1 = (("partition", "1"), ("topic", "out"))
    assert samples[("shmlog_partition_last_stable_offset", out_1)] == 0
    assert samples[("shmlog_partition_open_transactions", out_1)] == 1
    assert samples[("shmlog_transactions", (("state", "Ongoing"),))] == 1
    assert samples[("shmlog_transactions", (("state", "CompleteAbort"),))] == 1
    assert samples[("shmlog_transaction_commits_total", ())] == 1
    assert samples[("shmlog_transaction_aborts_total", ())] == 1
    assert samples[("shmlog_transaction_timeouts_total", ())] == 1
    assert samples[("shmlog_transactions_hanging", ())] == 1

    lines = status_lines(stats)
    header = next(index for index, line in enumerate(lines) if line.startswith("TOPIC"))
    assert lines[header].split()[:6] == ["TOPIC", "PARTITION", "START", "END", "HW", "LSO"]
    assert lines[header + 1].split()[:6] == ["out", "0", "0", "5", "5", "4"]
    summary = next(line for line in lines if line.startswith("transactions:"))
    assert summary == ("transactions: 2 transactional ids (Ongoing 1, CompleteAbort 1), "
                       "1 committed, 1 aborted (1 timed out), 2 open in partitions")
    table = lines[lines.index(next(line for line in lines
                                   if line.startswith("hanging transactions: 1"))) + 1:]
    assert table[0].split() == ["TOPIC", "PARTITION", "PRODUCER_ID", "EPOCH", "START_OFFSET",
                                "OPEN", "TRANSACTIONAL_ID", "COORDINATOR"]
    assert table[1].split()[:5] == ["out", "1", str(LOST_PRODUCER_ID), "0", "0"]
    assert table[1].split()[-2:] == ["-", "unknown"]


def test_a_transaction_open_past_its_own_timeout_is_hanging_in_status(world):
    """status judges a held transaction by its own timeout (its coordinator failed to
    abort it: here, its tick never ran)."""
    producer = world.init(timeout_ms=1_000)
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"late"], timestamp_ms=now_ms() - 60_000)
    assert [entry["transactional_id"] for entry in world.ask("stats")["transactions"][
        "hanging"]] == [TXN]
    assert hanging(world) == [], "within the max timeout, and held"


# -- the verbs -------------------------------------------------------------------------------
@pytest.fixture
def verbs(world, monkeypatch, capsys):
    """Run ``shmlog transactions ...`` in-process, its requests answered by the
    world's core: (exit code, stdout, stderr)."""
    monkeypatch.setattr(transactions_cli, "_ask",
                        lambda data_dir, request_type, **fields: world.ask(request_type,
                                                                           **fields))

    def run(*arguments):
        code = cli.main(["transactions", *arguments])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_the_verbs_list_describe_find_and_abort(world, verbs):
    producer = world.init()
    world.ask("add_partitions_to_txn", **producer, partitions=[["out", 0]])
    world.send(producer, 0, [b"a"], timestamp_ms=now_ms() - 90_000)
    world.send(world.lost(1), 1, [b"x"])

    code, out, _ = verbs("list")
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
        [TXN, str(producer["producer_id"]), "Ongoing"]]

    code, out, _ = verbs("describe", "--transactional-id", TXN)
    header, row = [line.split() for line in out.splitlines()]
    assert code == 0 and header == ["TRANSACTIONAL-ID", "PRODUCER-ID", "PRODUCER-EPOCH",
                                    "STATE", "TIMEOUT-MS", "START-TIME-MS", "DURATION-MS",
                                    "PARTITIONS"]
    assert row[:5] == [TXN, str(producer["producer_id"]), "0", "Ongoing", "60000"]
    assert row[-1] == "out-0"
    code, _, err = verbs("describe", "--transactional-id", "never")
    assert code == 1 and "no transactional id 'never'" in err

    code, out, _ = verbs("describe-producers", "--topic", "out", "--partition", "0")
    assert code == 0 and out.splitlines()[1].split()[-2:] == [TXN, "Ongoing"]

    code, out, _ = verbs("find-hanging")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].split()[:5] == ["TOPIC", "PARTITION", "PRODUCER-ID", "PRODUCER-EPOCH",
                                    "START-OFFSET"]
    assert lines[1].split()[:5] == ["out", "1", str(LOST_PRODUCER_ID), "0", "0"]
    assert lines[1].split()[-2:] == ["-", "unknown"]
    code, out, _ = verbs("find-hanging", "--max-transaction-timeout", "1", "--topic", "out",
                         "--partition", "0", "--json")
    found = json.loads(out)
    assert code == 0 and found["max_transaction_timeout_ms"] == 60_000
    assert [(entry["transactional_id"], entry["held_by_coordinator"])
            for entry in found["transactions"]] == [(TXN, True)]
    assert found["transactions"][0]["duration_ms"] >= 90_000

    code, _, err = verbs("abort", "--topic", "out", "--partition", "0", "--start-offset", "0")
    assert code == 1 and "let it time out, or fence its producer" in err
    code, out, _ = verbs("abort", "--topic", "out", "--partition", "1", "--start-offset", "0")
    assert code == 0 and out.strip() == (
        f"aborted the transaction of producer {LOST_PRODUCER_ID} (epoch 0) in out-1 that "
        f"started at offset 0: ABORT marker at offset 1")
    code, out, _ = verbs("find-hanging")
    assert code == 0 and out.strip() == "no open transactions found"


def test_the_verbs_arguments_are_checked(capsys):
    for arguments in (["transactions"], ["transactions", "describe"],
                      ["transactions", "abort", "--topic", "t", "--partition", "0"],
                      ["transactions", "find-hanging", "--partition", "0"],
                      ["transactions", "find-hanging", "--max-transaction-timeout", "-1"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(arguments)
        assert exited.value.code == 2, arguments
    capsys.readouterr()
