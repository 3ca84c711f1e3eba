"""The offset-based history checker (tests/cluster/history.py) catches each of its
seven rules' breaches (the transactions' two included), and only those.

Goal: a cluster test can trust a passing verdict: a clean history passes, and for
each rule a history that breaks only that rule is caught with a message naming the
value, partition and offset.

Method: histories built from plain values, table-style (one breach each); many
threads recording into one history; replica logs read from real partition logs
(PartitionLog writes them, ``read_replica`` reads the segment files back).
"""

from __future__ import annotations

import shutil
import threading

import pytest

from cluster.history import (
    ACKS_ALL,
    History,
    Outcome,
    ReplicaLog,
    TransactionEnd,
    read_replica,
)
from helpers import values_batch

THREADS_TIMEOUT_S = 60


def clean_history() -> History:
    history = History()
    for offset, value in enumerate([b"a", b"b", b"c"]):
        history.send(value, 0, acks="all")
        history.ack(value, offset)
    history.send(b"x", 1, acks=1)
    history.ack(b"x", 0)
    history.send(b"lost-acks-1", 1, acks=1)      # acks=1 may be lost on failover
    history.ack(b"lost-acks-1", 1)
    history.send(b"failed", 1, acks="all")
    history.fail(b"failed", RuntimeError("NOT_ENOUGH_REPLICAS"))
    history.send(b"maybe", 1, acks=-1)           # never completed: unknown
    history.read_many(0, [(0, b"a"), (1, b"b")], reader="b2")
    history.read(1, 0, b"x", reader="b3")
    return history


FINAL = {0: [(0, b"a"), (1, b"b"), (2, b"c")], 1: {0: b"x", 1: b"maybe"}}


def replicas(batches_2=((0, 1, b"batch-0"), (2, 2, b"batch-2")), records_2=None):
    return {0: {
        1: ReplicaLog(3, [(0, b"a"), (1, b"b"), (2, b"c")],
                      [(0, 1, b"batch-0"), (2, 2, b"batch-2")]),
        # A lower high watermark: its tail above 2 is not compared.
        2: ReplicaLog(2, records_2 or [(0, b"a"), (1, b"b"), (2, b"other")],
                      list(batches_2)),
    }}


def test_a_clean_history_passes():
    verdict = clean_history().check(FINAL, replicas())
    assert verdict.ok, str(verdict)
    assert verdict.counts == {"sends": 7, "acked": 5, "acked acks=all": 3, "failed": 1,
                              "unknown": 1, "unknown found in log": 1, "reads": 3,
                              "final records": 5}
    assert str(verdict).startswith("history ok (sends 7, acked 5")
    verdict.assert_ok()


def test_rule_1_two_values_at_one_offset():
    verdict = clean_history().check(FINAL, replicas(records_2=[(0, b"a"), (1, b"B")]))
    assert verdict.rules_broken() == {1}
    [violation] = verdict.violations
    assert "partition 0 offset 1 holds 2 values" in violation.message
    assert "b'B' (replica 2)" in violation.message
    assert "b'b' (acks=all ack, final log, read by b2, replica 1)" in violation.message
    assert str(violation).startswith("rule 1 (one value per (partition, offset)): ")
    with pytest.raises(AssertionError, match="history has 1 violation"):
        verdict.assert_ok()


def test_rule_2_an_acknowledged_acks_all_write_lost():
    final = {0: [(0, b"a"), (1, b"b")], 1: FINAL[1]}          # c, acked at 2, is gone
    verdict = clean_history().check(final)
    assert verdict.rules_broken() == {2}
    assert [str(violation) for violation in verdict.violations] == [
        "rule 2 (every acknowledged acks=all value is in the final log at its offset): "
        "b'c' acknowledged (acks=all) at partition 0 offset 2 is lost: the final log has "
        "nothing there"]


def test_rule_2_not_for_acks_1():
    final = {0: FINAL[0], 1: {0: b"x", 1: b"maybe"}}
    history = clean_history()
    assert [send.offset for send in history.sends() if send.value == b"lost-acks-1"] == [1]
    assert history.check(final).ok      # offset 1 holds another value: acks=1 allows it


def test_rule_3_a_value_twice_in_the_final_log():
    final = {0: FINAL[0], 1: {0: b"x", 1: b"maybe", 2: b"maybe"}}
    verdict = clean_history().check(final)
    assert verdict.rules_broken() == {3}
    [violation] = verdict.violations
    assert violation.message == ("b'maybe' is in the final log 2 times, at partition/offset "
                                 "1/1, 1/2")


def test_rule_3_a_value_twice_in_a_replica():
    records = [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"c")]
    replica_logs = {0: {1: ReplicaLog(4, records)}}
    final = {0: FINAL[0] + [(3, b"c2")], 1: FINAL[1]}
    history = clean_history()
    verdict = history.check(final, replica_logs)
    # offset 3 also holds c2 in the final log: rule 1 sees it too.
    assert verdict.by_rule(3)[0].message == ("b'c' is in replica 1 of partition 0 2 times, "
                                             "at offsets 2, 3")
    final = {0: FINAL[0], 1: FINAL[1]}
    replica_logs = {0: {1: ReplicaLog(3, records)}}           # the duplicate is above its HW
    assert history.check(final, replica_logs).ok


def test_rule_4_a_read_value_truncated_away():
    history = clean_history()
    history.read(0, 3, b"d", reader="b1")                     # read, then truncated
    verdict = history.check(FINAL)
    assert verdict.rules_broken() == {4}
    [violation] = verdict.violations
    assert violation.message == ("b'd' read by b1 at partition 0 offset 3 is gone: the final "
                                 "log has nothing there")


def test_rule_4_with_rule_1_when_the_offset_was_reused():
    history = clean_history()
    history.read(0, 2, b"d", reader="b1")
    verdict = history.check(FINAL)
    assert verdict.rules_broken() == {1, 4}
    assert "the final log has b'c' there" in verdict.by_rule(4)[0].message


@pytest.mark.parametrize("batches_2, message", [
    (((0, 1, b"batch-0"), (2, 2, b"batch-2")), None),
    (((0, 1, b"batcX-0"), (2, 2, b"batch-2")), "batch 0 (offsets 0..1) differs from byte 4 on"),
    (((0, 0, b"batch-0"), (1, 2, b"batch-2")), "batch 0 spans offsets 0..1 in one and 0..0"),
    (((0, 1, b"batch-0"),), None),                                  # 2 is at its HW: not compared
    ((), "one has 1 batches there, the other 0"),
])
def test_rule_5_replica_batches_below_the_lowest_high_watermark(batches_2, message):
    verdict = clean_history().check(FINAL, replicas(batches_2=batches_2,
                                                    records_2=[(0, b"a"), (1, b"b")]))
    if message is None:
        assert verdict.ok, str(verdict)
    else:
        assert verdict.rules_broken() == {5}
        assert message in verdict.violations[0].message
        assert "partition 0, below the lowest high watermark 2: replicas 1 and 2 differ" in \
            verdict.violations[0].message


def test_many_threads_record_into_one_history():
    history = History()
    threads, per_thread = 8, 500

    def producer(thread):
        for index in range(per_thread):
            value = f"{thread}-{index}".encode()
            history.send(value, thread, acks="all")
            history.ack(value, index)
            history.read(thread, index, value, reader=str(thread))

    workers = [threading.Thread(target=producer, args=(thread,)) for thread in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(THREADS_TIMEOUT_S)
        assert not worker.is_alive()
    final = {thread: [(index, f"{thread}-{index}".encode()) for index in range(per_thread)]
             for thread in range(threads)}
    verdict = history.check(final)
    assert verdict.ok, str(verdict)
    assert verdict.counts["acked acks=all"] == verdict.counts["reads"] == threads * per_thread


def test_recording_mistakes_are_refused():
    history = History()
    history.send(b"v", 0)
    with pytest.raises(ValueError, match="was sent before"):
        history.send(b"v", 1)
    with pytest.raises(ValueError, match="never sent"):
        history.ack(b"w", 0)
    history.ack(b"v", 0)
    with pytest.raises(ValueError, match="completed before"):
        history.fail(b"v", "late")
    with pytest.raises(ValueError, match="acks must be"):
        history.send(b"u", 0, acks=2)
    [send] = history.sends()
    assert (send.outcome, send.offset, send.acks) == (Outcome.ACKED, 0, ACKS_ALL)


def test_replicas_read_from_real_logs(open_log, tmp_path):
    leader = open_log(directory=tmp_path / "leader")
    for seed in range(3):
        leader.append(values_batch(4, seed, timestamps=[1000] * 4))
    leader.flush()
    shutil.copytree(tmp_path / "leader", tmp_path / "follower")
    diverged = open_log(directory=tmp_path / "diverged")
    diverged.append(values_batch(4, 0, timestamps=[1000] * 4))
    diverged.append(values_batch(4, 9, timestamps=[1000] * 4))   # another batch at 4..7
    diverged.flush()
    logs = {name: read_replica(str(tmp_path / name), high_watermark)
            for name, high_watermark in [("leader", 12), ("follower", 12), ("diverged", 8)]}
    assert [offset for offset, _ in logs["leader"].records] == list(range(12))
    assert logs["leader"].records[5] == (5, b"v1-1-".ljust(20, b"."))
    assert [batch[:2] for batch in logs["leader"].batches] == [(0, 3), (4, 7), (8, 11)]
    final = {0: logs["leader"].records}
    history = History()
    assert history.check(final, {0: {"leader": logs["leader"],
                                      "follower": logs["follower"]}}).ok
    verdict = history.check(final, {0: logs})
    assert verdict.rules_broken() == {1, 5}
    # Each replica is compared with the first by name.
    first, second = verdict.by_rule(5)
    assert "below the lowest high watermark 8: replicas diverged and follower differ: batch 1 " \
           "(offsets 4..7) differs from byte" in first.message
    assert "replicas diverged and leader differ" in second.message


# -- transactions (rules 6 and 7) ---------------------------------------------------------
def transactional_history() -> History:
    """Transaction "c" committed over two partitions, "a" aborted, "o" left open by a
    dead producer, "u" ended unknown (its producer died committing) and all there."""
    history = History()
    for transaction, values in (("c", [(0, b"c0"), (1, b"c1")]), ("a", [(0, b"a0")]),
                                ("o", [(1, b"o1")]), ("u", [(0, b"u0"), (1, b"u1")])):
        for partition, value in values:
            history.send(value, partition, transaction=transaction)
    history.send(b"plain", 0)
    history.end("c", TransactionEnd.COMMITTED)
    history.end("a", TransactionEnd.ABORTED)
    history.end("u", TransactionEnd.UNKNOWN)
    history.read_many(0, [(0, b"c0")], reader="rc", committed=True)
    history.read_many(0, [(1, b"a0")], reader="ru")         # read_uncommitted sees it
    return history


RAW = {0: [(0, b"c0"), (1, b"a0"), (2, b"u0"), (3, b"plain")],
       1: [(0, b"c1"), (1, b"o1"), (2, b"u1")]}
COMMITTED = {0: [(0, b"c0"), (2, b"u0"), (3, b"plain")], 1: [(0, b"c1"), (2, b"u1")]}


def test_a_clean_transactional_history_passes():
    verdict = transactional_history().check(RAW, committed_logs=COMMITTED)
    assert verdict.ok, str(verdict)
    assert (verdict.counts["transactions committed"], verdict.counts["transactions aborted"],
            verdict.counts["transactions open"], verdict.counts["transactions unknown"]) == \
        (1, 1, 1, 1)


@pytest.mark.parametrize("committed, reads, rule, named", [
    # a committed transaction missing from one partition
    ({0: [(0, b"c0"), (2, b"u0"), (3, b"plain")], 1: [(2, b"u1")]}, [], 7, "b'c1'"),
    # an aborted transaction visible
    ({**COMMITTED, 0: [(0, b"c0"), (1, b"a0"), (2, b"u0"), (3, b"plain")]}, [], 7,
     "aborted transaction 'a'"),
    # an open (never committed) one visible
    ({**COMMITTED, 1: [(0, b"c1"), (1, b"o1"), (2, b"u1")]}, [], 7, "open transaction 'o'"),
    # an unknown one in part
    ({0: [(0, b"c0"), (2, b"u0"), (3, b"plain")], 1: [(0, b"c1")]}, [], 7, "in part"),
    # a read_committed reader saw an aborted value
    (COMMITTED, [(0, 1, b"a0")], 6, "never committed"),
    # a read_committed reader saw a value the committed logs do not hold there
    ({**COMMITTED, 0: [(0, b"c0"), (2, b"u0")]}, [(0, 3, b"plain")], 6, "not there"),
])
def test_each_transaction_rule_catches_its_breach(committed, reads, rule, named):
    history = transactional_history()
    for partition, offset, value in reads:
        history.read(partition, offset, value, reader="rc2", committed=True)
    verdict = history.check(RAW, committed_logs=committed)
    assert verdict.rules_broken() == {rule}, str(verdict)
    assert named in str(verdict)
