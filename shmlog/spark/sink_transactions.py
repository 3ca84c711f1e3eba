"""The exactly-once sink's two-phase commit: tasks write in transactions they leave
open, the driver decides, stores the decision, and completes it.

Rules
-----
* Every writing task (an attempt of a Spark partition) writes its rows in one
  transaction of its own transactional id, :func:`transactional_id`:
  ``shmlog-spark-sink-<query id>-<run>-<partition>-<attempt>`` (streaming; ``run``
  is new at every start of the query) or ``shmlog-spark-write-<run>-...`` (batch).
  It flushes and leaves the transaction open (*prepared*), and reports its id,
  producer id and epoch to the driver (:class:`Prepared`). A task that got no row
  opens no transaction.
* A micro-batch's decision is stored before any of its transactions commits: the
  batch id, the run and the (partition, attempt) of every prepared transaction
  Spark reported, as the metadata of an offset the group
  ``shmlog-spark-sink-<query id>`` commits (:func:`store_decision`). Before
  storing, every reported transaction is checked to be still open under the epoch
  its task had (:class:`SinkTransactionLostError` otherwise: nothing is stored, the
  micro-batch fails and Spark runs it again).
* Completing a decision (:func:`complete`) commits its transactions (committing one
  already committed is answered the same, so a retry is harmless) and aborts every
  other open transaction of the query (:func:`abort_others`: failed attempts, a
  crashed run's leftovers) by fencing its id.
* On a micro-batch whose decision is stored already (the driver died between the
  decision and Spark's commit log, and the restarted query ran the batch again):
  the stored decision is completed and what this run wrote for it is aborted. If
  the stored decision's transactions were all aborted meanwhile (the query stayed
  down past the transaction timeout), none of them committed, and this run's are
  decided instead; some committed and some aborted cannot be made whole
  (:class:`SinkTransactionLostError`).

Theory of operation
-------------------
Why exactly once: Spark writes a micro-batch's offsets to its offset log before
running it, calls the sink's commit after every task succeeded, and records the
batch in its commit log after that commit returns; after a failure it runs the last
batch not in the commit log again, with the same batch id and the same input.
Nothing a task writes is visible (to read_committed readers) before the decision,
and the decision is one atomic write: before it, a re-run's writes replace the
earlier run's (which are aborted); after it, the decided transactions and only
they commit, however often the commit is retried. Retried and speculative task
attempts have ids of their own, so no attempt fences another; the ones Spark did
not keep are aborted when the batch completes or aborts.

What it needs: the decided transactions must outlive the driver's downtime, so
the transaction timeout (``kafka.transaction.timeout.ms``, default
``limits.SPARK_SINK_TRANSACTION_TIMEOUT_MS``, at most the broker's
``transaction_max_timeout_ms``) should exceed the longest micro-batch plus the
longest time a failed query stays down; read_committed readers of the topic wait
at a micro-batch's open transactions until it commits. A decision names its
transactions in at most ``limits.OFFSET_METADATA_SIZE_MAX`` bytes (some hundreds
of writing tasks per micro-batch: coalesce the output when more).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from ..common import limits
from ..common.errors import SinkTransactionLostError
from ..protocol.control_client import request

__all__ = ["Prepared", "transactional_id", "new_run", "decision_group", "stored_decision",
           "store_decision", "check_open", "complete", "outcome", "abort_others",
           "commit_micro_batch", "abort_micro_batch", "commit_write", "STREAM_PREFIX",
           "BATCH_PREFIX"]

STREAM_PREFIX = "shmlog-spark-sink-"
BATCH_PREFIX = "shmlog-spark-write-"
_OPEN = "Ongoing"
_COMMITTED = ("CompleteCommit", "PrepareCommit")


@dataclass(frozen=True)
class Prepared:
    """A task's open transaction: its id, and the producer id and epoch it has."""
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partition: int
    attempt: int
    written: tuple[str, int]        # a partition it wrote to (where a decision is stored)


def new_run() -> str:
    """A run's name, part of every transactional id it uses (new at every start)."""
    return uuid.uuid4().hex[:12]


def prefix(query: str | None, run: str | None = None) -> str:
    """The transactional ids of a streaming query (``query``), or of a batch write."""
    base = f"{STREAM_PREFIX}{query}-" if query else BATCH_PREFIX
    return base if run is None else f"{base}{run}-"


def transactional_id(query: str | None, run: str, partition: int, attempt: int) -> str:
    return f"{prefix(query, run)}{partition}-{attempt}"


def decision_group(query: str) -> str:
    return f"{STREAM_PREFIX}{query}"


def stored_decision(bootstrap: str, query: str) -> tuple[int, list[str]] | None:
    """The last micro-batch decided for ``query`` and its transactional ids, or None."""
    found = None
    for _, _, _, metadata in request(bootstrap, "fetch_offsets",
                                     group_id=decision_group(query))["offsets"]:
        try:
            decision = json.loads(metadata)
            batch, run = int(decision["batch"]), str(decision["run"])
            ids = [transactional_id(query, run, int(p), int(a)) for p, a in decision["tasks"]]
        except (ValueError, TypeError, KeyError):
            continue                           # not a decision of ours
        if found is None or batch > found[0]:
            found = (batch, ids)
    return found


def store_decision(bootstrap: str, query: str, batch: int, run: str,
                   prepared: list[Prepared], where: tuple[str, int]) -> None:
    """Store the decision (one committed offset of the query's group, at offset 0 of
    ``where``, a partition the micro-batch wrote to).

    Raises
    ------
    SinkTransactionLostError
        It does not fit in an offset's metadata.
    """
    metadata = json.dumps({"batch": batch, "run": run,
                           "tasks": sorted([p.partition, p.attempt] for p in prepared)},
                          separators=(",", ":"))
    if len(metadata) > limits.OFFSET_METADATA_SIZE_MAX:
        raise SinkTransactionLostError(
            f"micro-batch {batch} of query {query} was written by {len(prepared)} tasks, more "
            f"than one decision names (its {len(metadata)} bytes exceed "
            f"{limits.OFFSET_METADATA_SIZE_MAX}): coalesce the output to fewer partitions")
    request(bootstrap, "commit_offsets", group_id=decision_group(query),
            offsets=[[where[0], where[1], 0, metadata]])


def _describe(bootstrap: str, ids: list[str]) -> dict[str, dict]:
    if not ids:
        return {}
    return {entry["transactional_id"]: entry for entry in
            request(bootstrap, "describe_transactions", transactional_ids=list(ids))
            ["transactions"]}


def check_open(bootstrap: str, prepared: list[Prepared], what: str) -> None:
    """Every prepared transaction is still open under its task's epoch.

    Raises
    ------
    SinkTransactionLostError
        One was aborted (its timeout) or fenced since its task reported it.
    """
    found = _describe(bootstrap, [p.transactional_id for p in prepared])
    for p in prepared:
        state = found.get(p.transactional_id)
        if state is None or state["state"] != _OPEN or \
                (state["producer_id"], state["producer_epoch"]) != (p.producer_id,
                                                                    p.producer_epoch):
            raise SinkTransactionLostError(
                f"{what}: the transaction {p.transactional_id} its task prepared is no longer "
                f"open ({state['state'] if state else 'unknown'}; timed out or fenced): "
                f"nothing of it was committed, the write fails (a streaming query runs the "
                f"micro-batch again)")


def complete(bootstrap: str, ids: list[str], what: str) -> None:
    """Commit the decided transactions ``ids`` (those committed already are left).

    Raises
    ------
    SinkTransactionLostError
        One was aborted (timed out) before it could commit, or is unknown.
    """
    found = _describe(bootstrap, ids)
    missing = set(ids) - set(found)
    if missing:
        raise SinkTransactionLostError(f"{what}: the coordinator knows no transaction "
                                       f"{sorted(missing)}")
    for name, state in sorted(found.items()):
        if state["state"] in _COMMITTED:
            continue
        if state["state"] != _OPEN:
            raise SinkTransactionLostError(
                f"{what}: the decided transaction {name} was aborted ({state['state']}) "
                f"before it committed (it outlived kafka.transaction.timeout.ms); its rows "
                f"are lost")
        request(bootstrap, "end_txn", transactional_id=name,
                producer_id=state["producer_id"], producer_epoch=state["producer_epoch"],
                committed=True)


def outcome(bootstrap: str, ids: list[str]) -> str:
    """``open`` when the decided transactions can still all commit (each open or
    committed), ``aborted`` when none of them committed and none can (all aborted),
    ``torn`` otherwise."""
    states = [state["state"] for state in _describe(bootstrap, ids).values()]
    if all(state == _OPEN or state in _COMMITTED for state in states) and \
            len(states) == len(ids):
        return "open"
    if not any(state in _COMMITTED for state in states):
        return "aborted"
    return "torn"


def abort_others(bootstrap: str, start: str, keep: set[str], timeout_ms: int,
                 contains: str = "") -> None:
    """Abort every open transaction whose id starts with ``start`` (and holds
    ``contains``) but those in ``keep``: its producer is fenced (a new epoch), which
    aborts it."""
    for entry in request(bootstrap, "list_transactions", states=[_OPEN])["transactions"]:
        name = entry["transactional_id"]
        if name.startswith(start) and contains in name and name not in keep:
            request(bootstrap, "init_transactions", transactional_id=name,
                    transaction_timeout_ms=timeout_ms)


def commit_micro_batch(bootstrap: str, query: str, batch: int, run: str,
                       prepared: list[Prepared], timeout_ms: int) -> None:
    """The driver's commit of a micro-batch (see the module's rules): decide (or take
    the stored decision of this batch), complete, abort the rest.

    Raises
    ------
    SinkTransactionLostError
        A prepared transaction was lost before the decision (the micro-batch fails
        and runs again), or a stored decision cannot be completed whole.
    """
    what = f"micro-batch {batch} of streaming query {query}"
    decided = stored_decision(bootstrap, query)
    if decided is not None and decided[0] == batch:
        state = outcome(bootstrap, decided[1])
        if state == "open":
            complete(bootstrap, decided[1], what)
            abort_others(bootstrap, prefix(query), set(decided[1]), timeout_ms)
            return
        if state == "torn":
            raise SinkTransactionLostError(
                f"{what}: of its decided transactions some committed and some were aborted "
                f"(they outlived kafka.transaction.timeout.ms while the query was down): "
                f"the micro-batch cannot be written exactly once")
        # Every decided one aborted, none committed: this run's writes replace them.
    check_open(bootstrap, prepared, what)
    ids = [p.transactional_id for p in prepared]
    if prepared:
        store_decision(bootstrap, query, batch, run, prepared, prepared[0].written)
        complete(bootstrap, ids, what)
    abort_others(bootstrap, prefix(query), set(ids), timeout_ms)


def abort_micro_batch(bootstrap: str, query: str | None, batch: int, run: str,
                      timeout_ms: int) -> None:
    """The driver's abort of a micro-batch: every open transaction of the query is
    aborted but a stored decision's of this very batch (a later run completes it)."""
    if query is None:               # no task reported: this run's, found by its name
        abort_others(bootstrap, STREAM_PREFIX, set(), timeout_ms, contains=f"-{run}-")
        return
    decided = stored_decision(bootstrap, query)
    keep = set(decided[1]) if decided is not None and decided[0] == batch else set()
    abort_others(bootstrap, prefix(query), keep, timeout_ms)


def commit_write(bootstrap: str, run: str, prepared: list[Prepared], timeout_ms: int) -> None:
    """The driver's commit of a batch write: its tasks' transactions commit, every
    other open one of the write (failed attempts) is aborted."""
    what = f"the batch write {run}"
    check_open(bootstrap, prepared, what)
    ids = [p.transactional_id for p in prepared]
    complete(bootstrap, ids, what)
    abort_others(bootstrap, prefix(None, run), set(ids), timeout_ms)
