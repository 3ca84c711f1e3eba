"""An offset-based history checker for replicated logs (Jepsen's Kafka workload idea).

Cluster tests drive producers and consumers while they kill, stop and cut brokers;
they record here what every client saw, and at the end what every replica holds,
and :meth:`History.check` says whether the cluster kept Kafka's promises.

What is recorded
----------------
* **Sends**: a value unique in the whole history, its partition, its ``acks``, and
  its outcome: acknowledged at an offset, failed with an error, or unknown (sent,
  but the client never learnt the result: a timeout, a killed producer). A send is
  begun with :meth:`History.send` (it is unknown until completed) and completed
  once with :meth:`History.ack` or :meth:`History.fail`.
* **Reads**: a value a consumer read at a (partition, offset), from any host.
* **At the end**: each partition's final log (what a consumer of the surviving
  leader reads below its high watermark), and optionally each replica's log
  (:class:`ReplicaLog`: its high watermark, its records and its raw batches;
  :func:`read_replica` reads one from a partition directory).

The five rules (one :class:`Violation` per breach, numbered as here)
--------------------------------------------------------------------
1. **One value per offset.** Each (partition, offset) holds one value across the
   reads, the acknowledgements of acks=all sends, the final logs and the replicas'
   records below their high watermarks. acks=0/1 acknowledgements are left out:
   Kafka lets a leader's failover reuse their offsets (Kafka's documentation,
   "acks=1 ... data will be lost" when the leader fails before replicating).
2. **No acknowledged acks=all write lost.** Every acks=all value acknowledged at
   offset o is in the final log at o.
3. **No duplicates.** No value appears twice in a final log (across its partitions)
   nor twice in one replica's records below its high watermark (a retried batch
   appended twice).
4. **Reads are never undone.** Every value read is in the final log at the offset
   it was read at: nothing a consumer saw was truncated away or replaced.
5. **Replicas agree below the high watermark.** For each partition, the batches of
   its replicas whose base offset is below the lowest of their high watermarks are
   byte-identical, batch by batch.

And for transactions (sends made inside one, :meth:`History.send` with
``transaction=``; its end recorded with :meth:`History.end`; the final logs read
with read_committed given as ``committed_logs``):

6. **read_committed never sees an aborted value.** No value a read_committed
   reader read belongs to a transaction that aborted, and every one is in the
   committed logs at the offset read.
7. **A transaction is all or nothing.** In the committed logs, a committed
   transaction's values are all there (every partition), an aborted one's none,
   and one whose end is unknown (its producer killed while committing) all or none.

Failed and unknown sends promise nothing (a failed acks=all send may still be in
the log: Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND); the verdict counts how many of
the unknown ones were found in the final log, as Jepsen reports "recovered" writes.

Theory of operation
-------------------
Recording takes one lock per call, so many producer and consumer threads record
into one history; :meth:`History.check` copies what was recorded under the lock and
checks the copy with plain dictionaries: every observation of a (partition, offset)
is gathered with where it came from, so a violation's message names the value,
the offset and every witness. The checker needs no broker: histories are plain
values, which is how its unit tests build one that breaks exactly one rule.
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import os
import threading
from collections import defaultdict
from typing import Any, Hashable, Iterable, Mapping, Sequence

__all__ = ["ACKS_ALL", "Outcome", "Send", "Read", "ReplicaLog", "Violation", "Verdict",
           "History", "TransactionEnd", "read_replica", "RULES"]

# acks="all" as Kafka's wire form has it.
ACKS_ALL = -1
RULES = {
    1: "one value per (partition, offset)",
    2: "every acknowledged acks=all value is in the final log at its offset",
    3: "no value twice in a log",
    4: "every value read is in the final log at the offset read",
    5: "replicas' batches below the lowest high watermark are byte-identical",
    6: "read_committed reads return no aborted value, and only committed ones",
    7: "a transaction's values are in the committed logs all or none (all once committed)",
}
# Messages list at most this many witnesses or differences of one kind.
SHOWN_MAX = 5


class Outcome(enum.Enum):
    """What a client learnt of its send."""
    UNKNOWN = "unknown"
    ACKED = "acked"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Send:
    """One send and its outcome (``offset`` when acked, ``error`` when failed)."""
    value: Hashable
    partition: int
    acks: int
    outcome: Outcome = Outcome.UNKNOWN
    offset: int | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Read:
    """A value a consumer read; ``reader`` names who (a host, a broker) for messages;
    ``committed`` when it read with isolation_level read_committed."""
    partition: int
    offset: int
    value: Hashable
    reader: str = ""
    committed: bool = False


class TransactionEnd(enum.Enum):
    """How a transaction ended, as its producer learnt it."""
    OPEN = "open"                  # no end recorded: its producer died before committing
    COMMITTED = "committed"        # commit_transaction returned
    ABORTED = "aborted"            # abort_transaction returned, or it was never committed
    UNKNOWN = "unknown"            # its producer died (or failed) while committing


@dataclasses.dataclass(frozen=True)
class ReplicaLog:
    """One replica of one partition at the end of a test.

    ``records`` are (offset, value) pairs; ``batches`` are (base_offset,
    last_offset, raw bytes) in log order. Only what lies below ``high_watermark``
    is checked."""
    high_watermark: int
    records: Sequence[tuple[int, Hashable]] = ()
    batches: Sequence[tuple[int, int, bytes]] = ()


@dataclasses.dataclass(frozen=True)
class Violation:
    """A breach of rule ``rule`` (see :data:`RULES`)."""
    rule: int
    message: str

    def __str__(self) -> str:
        return f"rule {self.rule} ({RULES[self.rule]}): {self.message}"


@dataclasses.dataclass
class Verdict:
    """What :meth:`History.check` found: the violations, and counts for the report."""
    violations: list[Violation]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_rule(self, rule: int) -> list[Violation]:
        """The violations of one rule."""
        return [violation for violation in self.violations if violation.rule == rule]

    def rules_broken(self) -> set[int]:
        return {violation.rule for violation in self.violations}

    def __str__(self) -> str:
        summary = ", ".join(f"{name} {count}" for name, count in self.counts.items())
        if self.ok:
            return f"history ok ({summary})"
        return "\n".join([f"history has {len(self.violations)} violation(s) ({summary}):"]
                         + [f"  {violation}" for violation in self.violations])

    def assert_ok(self) -> None:
        """Raise AssertionError listing every violation, if there is one."""
        if not self.ok:
            raise AssertionError(str(self))


def _acks(acks: Any) -> int:
    if acks in ("all", -1):
        return ACKS_ALL
    if acks in (0, 1) and not isinstance(acks, bool):
        return acks
    raise ValueError(f"acks must be 'all', -1, 0 or 1, got {acks!r}")


class History:
    """Sends and reads, recorded from many threads; :meth:`check` judges them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sends: dict[Hashable, Send] = {}
        self._reads: list[Read] = []
        self._transactions: dict[Hashable, list[Hashable]] = {}   # its values
        self._ends: dict[Hashable, TransactionEnd] = {}

    def send(self, value: Hashable, partition: int, *, acks: Any = "all",
             transaction: Hashable | None = None) -> None:
        """A send begins (its outcome unknown until :meth:`ack` or :meth:`fail`), in
        ``transaction`` when given. Values must be unique in the history: a repeated
        one raises ValueError."""
        send = Send(value, partition, _acks(acks))
        with self._lock:
            if value in self._sends:
                raise ValueError(f"value {value!r} was sent before: values must be unique")
            self._sends[value] = send
            if transaction is not None:
                self._transactions.setdefault(transaction, []).append(value)

    def end(self, transaction: Hashable, how: TransactionEnd) -> None:
        """How the transaction ended (a transaction with no end recorded is OPEN:
        never committed, so aborted once its producer is fenced or times out)."""
        with self._lock:
            self._ends[transaction] = TransactionEnd(how)

    def ack(self, value: Hashable, offset: int) -> None:
        """The send of ``value`` was acknowledged at ``offset``."""
        self._complete(value, outcome=Outcome.ACKED, offset=offset)

    def fail(self, value: Hashable, error: Any) -> None:
        """The send of ``value`` failed with ``error`` (an exception or a text)."""
        self._complete(value, outcome=Outcome.FAILED, error=repr(error) if isinstance(
            error, BaseException) else str(error))

    def _complete(self, value: Hashable, **outcome: Any) -> None:
        with self._lock:
            send = self._sends.get(value)
            if send is None:
                raise ValueError(f"value {value!r} was never sent")
            if send.outcome is not Outcome.UNKNOWN:
                raise ValueError(f"the send of {value!r} was completed before "
                                 f"({send.outcome.value})")
            self._sends[value] = dataclasses.replace(send, **outcome)

    def read(self, partition: int, offset: int, value: Hashable, *, reader: str = "",
             committed: bool = False) -> None:
        """A consumer (``reader``) read ``value`` at (``partition``, ``offset``)
        (with read_committed when ``committed``)."""
        with self._lock:
            self._reads.append(Read(partition, offset, value, reader, committed))

    def read_many(self, partition: int, records: Iterable[tuple[int, Hashable]], *,
                  reader: str = "", committed: bool = False) -> None:
        """Several (offset, value) pairs read from one partition, under one lock."""
        reads = [Read(partition, offset, value, reader, committed)
                 for offset, value in records]
        with self._lock:
            self._reads.extend(reads)

    def transactions(self) -> dict[Hashable, tuple[list[Hashable], TransactionEnd]]:
        """Each transaction's values and end."""
        with self._lock:
            return {transaction: (list(values), self._ends.get(transaction,
                                                               TransactionEnd.OPEN))
                    for transaction, values in self._transactions.items()}

    def sends(self) -> list[Send]:
        with self._lock:
            return list(self._sends.values())

    def reads(self) -> list[Read]:
        with self._lock:
            return list(self._reads)

    def check(self, final_logs: Mapping[int, Any],
              replica_logs: Mapping[int, Mapping[Any, ReplicaLog]] | None = None,
              committed_logs: Mapping[int, Any] | None = None) -> Verdict:
        """Check the rules (module docstring) against the final state.

        Parameters
        ----------
        final_logs : mapping of partition to its committed records
            (offset, value) pairs, or a mapping of offset to value: what a consumer
            reads from the surviving leader below its high watermark (read_uncommitted:
            aborted transactions' values included). Give every partition sent to: an
            acknowledged value of a partition left out is lost.
        replica_logs : mapping of partition to {replica name: ReplicaLog}, optional
        committed_logs : mapping of partition to records, optional
            The same read with read_committed, once no transaction is open: the
            transactions' rules (6, 7) are checked against it.
        """
        sends, reads = self.sends(), self.reads()
        logs = {partition: _pairs(records) for partition, records in final_logs.items()}
        replicas = {partition: dict(by_replica)
                    for partition, by_replica in (replica_logs or {}).items()}
        violations = (_one_value_per_offset(sends, reads, logs, replicas)
                      + _acked_writes_kept(sends, logs)
                      + _no_duplicates(logs, replicas)
                      + _reads_kept(reads, logs)
                      + _replicas_agree(replicas))
        counts = _counts(sends, reads, logs)
        if committed_logs is not None:
            committed = {partition: _pairs(records)
                         for partition, records in committed_logs.items()}
            transactions = self.transactions()
            violations += _no_aborted_reads(reads, committed, transactions)
            violations += _all_or_nothing(committed, transactions)
            ends = [end for _, end in transactions.values()]
            counts.update({f"transactions {end.value}": ends.count(end)
                           for end in TransactionEnd})
        return Verdict(violations, counts)


def _pairs(records: Any) -> list[tuple[int, Hashable]]:
    return list(records.items() if isinstance(records, Mapping) else records)


def _committed(replica: ReplicaLog) -> list[tuple[int, Hashable]]:
    return [(offset, value) for offset, value in replica.records
            if offset < replica.high_watermark]


def _shown(items: Iterable[Any]) -> str:
    items = list(items)
    more = f" and {len(items) - SHOWN_MAX} more" if len(items) > SHOWN_MAX else ""
    return "; ".join(str(item) for item in items[:SHOWN_MAX]) + more


def _one_value_per_offset(sends, reads, logs, replicas) -> list[Violation]:
    # (partition, offset) -> value -> where it was seen
    seen: dict[tuple[int, int], dict[Hashable, list[str]]] = defaultdict(lambda: defaultdict(list))
    for send in sends:
        if send.outcome is Outcome.ACKED and send.acks == ACKS_ALL:
            seen[send.partition, send.offset][send.value].append("acks=all ack")
    for read in reads:
        seen[read.partition, read.offset][read.value].append(f"read by {read.reader or '?'}")
    for partition, records in logs.items():
        for offset, value in records:
            seen[partition, offset][value].append("final log")
    for partition, by_replica in replicas.items():
        for name, replica in by_replica.items():
            for offset, value in _committed(replica):
                seen[partition, offset][value].append(f"replica {name}")
    return [Violation(1, f"partition {partition} offset {offset} holds {len(values)} values: "
                         + _shown(f"{value!r} ({', '.join(sorted(set(where)))})"
                                  for value, where in values.items()))
            for (partition, offset), values in sorted(seen.items()) if len(values) > 1]


def _acked_writes_kept(sends, logs) -> list[Violation]:
    violations = []
    by_offset = {partition: dict(records) for partition, records in logs.items()}
    for send in sends:
        if send.outcome is not Outcome.ACKED or send.acks != ACKS_ALL:
            continue
        found = by_offset.get(send.partition, {}).get(send.offset, _MISSING)
        if found != send.value:
            where = "nothing" if found is _MISSING else repr(found)
            violations.append(Violation(
                2, f"{send.value!r} acknowledged (acks=all) at partition {send.partition} "
                   f"offset {send.offset} is lost: the final log has {where} there"))
    return violations


_MISSING = object()


def _no_duplicates(logs, replicas) -> list[Violation]:
    violations = []
    positions: dict[Hashable, list[str]] = defaultdict(list)
    for partition, records in logs.items():
        for offset, value in records:
            positions[value].append(f"{partition}/{offset}")
    violations += [Violation(3, f"{value!r} is in the final log {len(where)} times, at "
                                f"partition/offset {', '.join(where)}")
                   for value, where in positions.items() if len(where) > 1]
    for partition, by_replica in sorted(replicas.items()):
        for name, replica in by_replica.items():
            offsets: dict[Hashable, list[int]] = defaultdict(list)
            for offset, value in _committed(replica):
                offsets[value].append(offset)
            violations += [Violation(3, f"{value!r} is in replica {name} of partition "
                                        f"{partition} {len(at)} times, at offsets "
                                        f"{', '.join(map(str, at))}")
                           for value, at in offsets.items() if len(at) > 1]
    return violations


def _reads_kept(reads, logs) -> list[Violation]:
    by_offset = {partition: dict(records) for partition, records in logs.items()}
    violations = []
    for read in reads:
        found = by_offset.get(read.partition, {}).get(read.offset, _MISSING)
        if found != read.value:
            where = "nothing" if found is _MISSING else repr(found)
            violations.append(Violation(
                4, f"{read.value!r} read by {read.reader or '?'} at partition {read.partition} "
                   f"offset {read.offset} is gone: the final log has {where} there"))
    return violations


def _no_aborted_reads(reads, committed, transactions) -> list[Violation]:
    aborted = {value: transaction for transaction, (values, end) in transactions.items()
               if end in (TransactionEnd.ABORTED, TransactionEnd.OPEN) for value in values}
    by_offset = {partition: dict(records) for partition, records in committed.items()}
    violations = []
    for read in reads:
        if not read.committed:
            continue
        if read.value in aborted:
            violations.append(Violation(
                6, f"{read.value!r} read by {read.reader or '?'} (read_committed) at partition "
                   f"{read.partition} offset {read.offset} belongs to transaction "
                   f"{aborted[read.value]!r}, which never committed"))
        elif by_offset.get(read.partition, {}).get(read.offset, _MISSING) != read.value:
            violations.append(Violation(
                6, f"{read.value!r} read by {read.reader or '?'} (read_committed) at partition "
                   f"{read.partition} offset {read.offset} is not there in the committed logs"))
    return violations


def _all_or_nothing(committed, transactions) -> list[Violation]:
    present = {value for records in committed.values() for _, value in records}
    violations = []
    for transaction, (values, end) in transactions.items():
        found = [value for value in values if value in present]
        missing = [value for value in values if value not in present]
        if end is TransactionEnd.COMMITTED and missing:
            violations.append(Violation(
                7, f"committed transaction {transaction!r} lacks {len(missing)} of its "
                   f"{len(values)} values in the committed logs: {_shown(map(repr, missing))}"))
        elif end in (TransactionEnd.ABORTED, TransactionEnd.OPEN) and found:
            violations.append(Violation(
                7, f"{end.value} transaction {transaction!r} has {len(found)} of its values in "
                   f"the committed logs: {_shown(map(repr, found))}"))
        elif end is TransactionEnd.UNKNOWN and found and missing:
            violations.append(Violation(
                7, f"transaction {transaction!r} (its end unknown) is in the committed logs in "
                   f"part: {len(found)} of {len(values)} values, missing "
                   f"{_shown(map(repr, missing))}"))
    return violations


def _replicas_agree(replicas) -> list[Violation]:
    violations = []
    for partition, by_replica in sorted(replicas.items()):
        if len(by_replica) < 2:
            continue
        high_watermark = min(replica.high_watermark for replica in by_replica.values())
        prefixes = {name: [batch for batch in replica.batches if batch[0] < high_watermark]
                    for name, replica in by_replica.items()}
        names = sorted(prefixes, key=str)
        reference = names[0]
        for name in names[1:]:
            difference = _first_difference(prefixes[reference], prefixes[name])
            if difference:
                violations.append(Violation(
                    5, f"partition {partition}, below the lowest high watermark "
                       f"{high_watermark}: replicas {reference} and {name} differ: {difference}"))
    return violations


def _first_difference(ours: Sequence[tuple[int, int, bytes]],
                      theirs: Sequence[tuple[int, int, bytes]]) -> str | None:
    for index, (mine, other) in enumerate(zip(ours, theirs)):
        if mine[:2] != other[:2]:
            return (f"batch {index} spans offsets {mine[0]}..{mine[1]} in one and "
                    f"{other[0]}..{other[1]} in the other")
        if bytes(mine[2]) != bytes(other[2]):
            position = next((at for at, (a, b) in enumerate(zip(mine[2], other[2])) if a != b),
                            min(len(mine[2]), len(other[2])))
            return (f"batch {index} (offsets {mine[0]}..{mine[1]}) differs from byte "
                    f"{position} on ({len(mine[2])} and {len(other[2])} bytes)")
    if len(ours) != len(theirs):
        return f"one has {len(ours)} batches there, the other {len(theirs)}"
    return None


def _counts(sends, reads, logs) -> dict[str, int]:
    in_logs = {value for records in logs.values() for _, value in records}
    outcomes = [send.outcome for send in sends]
    return {
        "sends": len(sends),
        "acked": outcomes.count(Outcome.ACKED),
        "acked acks=all": sum(1 for send in sends
                              if send.outcome is Outcome.ACKED and send.acks == ACKS_ALL),
        "failed": outcomes.count(Outcome.FAILED),
        "unknown": outcomes.count(Outcome.UNKNOWN),
        "unknown found in log": sum(1 for send in sends if send.outcome is Outcome.UNKNOWN
                                    and send.value in in_logs),
        "reads": len(reads),
        "final records": sum(len(records) for records in logs.values()),
    }


def read_replica(directory: str, high_watermark: int) -> ReplicaLog:
    """A partition directory's batches and records as a :class:`ReplicaLog`.

    Reads the segment files as ``shmlog dump`` does (read-only, a live broker's
    files too); only the part below ``high_watermark`` is checked later, but every
    whole batch is read. Record values are bytes (None for a null value)."""
    from shmlog.storage.dump import read_segment  # numpy and numba only when a log is read
    records: list[tuple[int, Hashable]] = []
    batches: list[tuple[int, int, bytes]] = []
    for path in sorted(glob.glob(os.path.join(directory, "*.log"))):
        report = read_segment(path, with_records=True, verify=False)
        with open(path, "rb") as source:
            for info, columns in zip(report.batches, report.records):
                source.seek(info.position)
                batches.append((info.base_offset, info.last_offset,
                                source.read(info.batch_length)))
                records += [(int(columns.offsets[index]), columns.value(index))
                            for index in range(len(columns))]
    return ReplicaLog(high_watermark, records, batches)
