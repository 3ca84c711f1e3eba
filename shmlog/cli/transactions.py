"""``shmlog transactions``: Kafka's kafka-transactions.sh through the broker's control
endpoint: ``list`` (every transactional id, its producer id and state),
``describe --transactional-id ID`` (state, producer id and epoch, timeout, start,
duration, partitions), ``describe-producers --topic T --partition P`` (the
transactions open in a partition), ``find-hanging`` (open transactions the
coordinator does not hold, or open longer than ``--max-transaction-timeout``
minutes) and ``abort --topic T --partition P --start-offset O`` (an ABORT marker
for the hanging transaction that starts there; refused while the coordinator holds
it). The rules of hanging and of the abort are the broker's
(``broker/transaction_operations.py``).

These verbs only ask the broker something: they import the control client and
nothing of the data path (no numba, no numpy), as ``admin.py``'s do.
"""

from __future__ import annotations

import argparse
import json
import sys

from .exit_codes import EXIT_FAILURE, EXIT_OK
from .tools import table

__all__ = ["add_parser", "list_lines", "describe_lines", "open_transaction_lines",
           "MS_PER_MINUTE"]

MS_PER_MINUTE = 60_000           # --max-transaction-timeout is in minutes, as Kafka's


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``transactions`` subcommand to ``commands`` (an argparse subparsers
    action)."""
    transactions = commands.add_parser(
        "transactions", parents=parents,
        help="list, describe, find hanging and abort transactions (kafka-transactions)",
        description="Kafka's kafka-transactions.sh: the transaction coordinator's "
        "transactional ids, and the transactions open in partitions.")
    verbs = transactions.add_subparsers(dest="action", required=True, metavar="ACTION")

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = verbs.add_parser(name, parents=parents, help=help_text, description=help_text)
        parser.add_argument("--data-dir", help="the broker's data directory")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    verb("list", "every transactional id: its producer id and state")
    describe = verb("describe", "a transactional id's state, producer, timeout, start, "
                    "duration and partitions")
    describe.add_argument("--transactional-id", required=True)
    producers = verb("describe-producers", "the transactions open in a partition: producer "
                     "id, epoch, start offset, and the coordinator's state")
    producers.add_argument("--topic", required=True)
    producers.add_argument("--partition", type=int, required=True)
    hanging = verb("find-hanging", "open transactions the coordinator does not hold, or "
                   "open longer than the max timeout")
    hanging.add_argument("--max-transaction-timeout", type=int, metavar="MINUTES",
                         help="open longer than this is hanging (default: the broker's "
                              "transaction_max_timeout_ms)")
    hanging.add_argument("--topic", help="only this topic's partitions")
    hanging.add_argument("--partition", type=int, help="with --topic: only this partition")
    abort = verb("abort", "write an ABORT marker for the hanging transaction that starts "
                 "at --start-offset in the partition")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--start-offset", type=int, required=True,
                       help="the transaction's first offset (find-hanging's START-OFFSET)")
    transactions.set_defaults(run=_run, check=_check)


def _check(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> None:
    if arguments.action == "find-hanging":
        if arguments.partition is not None and arguments.topic is None:
            parser.error("find-hanging: --partition goes with --topic")
        if arguments.max_transaction_timeout is not None \
                and arguments.max_transaction_timeout < 0:
            parser.error("--max-transaction-timeout takes minutes, 0 or more")


def _ask(data_dir: str | None, request_type: str, **fields) -> dict:
    """One control request to the broker of ``data_dir`` (the default one if None)."""
    from ..common.paths import default_data_dir
    from ..protocol.control_client import request
    return request(data_dir or default_data_dir(), request_type, **fields)


def _run(arguments) -> int:
    action, data_dir = arguments.action, arguments.data_dir
    if action == "list":
        result: object = _ask(data_dir, "list_transactions")["transactions"]
        lines = list_lines(result)
    elif action == "describe":
        found = _ask(data_dir, "describe_transactions",
                     transactional_ids=[arguments.transactional_id])["transactions"]
        if not found:
            print(f"shmlog transactions: no transactional id {arguments.transactional_id!r} "
                  f"at the coordinator", file=sys.stderr)
            return EXIT_FAILURE
        result, lines = found[0], describe_lines(found[0])
    elif action == "describe-producers":
        result = _ask(data_dir, "describe_producers", topic=arguments.topic,
                      partition=arguments.partition)
        lines = open_transaction_lines(result["producers"])
    elif action == "find-hanging":
        fields = {} if arguments.max_transaction_timeout is None else \
            {"max_transaction_timeout_ms": arguments.max_transaction_timeout * MS_PER_MINUTE}
        if arguments.topic is not None:
            fields.update(topic=arguments.topic, partition=arguments.partition)
        result = _ask(data_dir, "find_hanging_transactions", **fields)
        lines = open_transaction_lines(result["transactions"])
    else:
        result = _ask(data_dir, "abort_hanging_transaction", topic=arguments.topic,
                      partition=arguments.partition, start_offset=arguments.start_offset)
        lines = [f"aborted the transaction of producer {result['producer_id']} (epoch "
                 f"{result['producer_epoch']}) in {result['topic']}-{result['partition']} "
                 f"that started at offset {result['start_offset']}: ABORT marker at offset "
                 f"{result['marker_offset']}"]
    print(json.dumps(result, indent=2) if arguments.json else "\n".join(lines))
    return EXIT_OK


def list_lines(transactions: list[dict]) -> list[str]:
    """kafka-transactions --list's table (without its coordinator column: one broker
    coordinates every id)."""
    rows = [("TRANSACTIONAL-ID", "PRODUCER-ID", "STATE")]
    rows += [(entry["transactional_id"], entry["producer_id"], entry["state"])
             for entry in transactions]
    return table(rows)


def describe_lines(described: dict) -> list[str]:
    """kafka-transactions describe's table, one transactional id."""
    return table([("TRANSACTIONAL-ID", "PRODUCER-ID", "PRODUCER-EPOCH", "STATE",
                   "TIMEOUT-MS", "START-TIME-MS", "DURATION-MS", "PARTITIONS"),
                  (described["transactional_id"], described["producer_id"],
                   described["producer_epoch"], described["state"], described["timeout_ms"],
                   _dash(described["start_ms"]), _dash(described["duration_ms"]),
                   ",".join(f"{topic}-{partition}" for topic, partition
                            in described["partitions"]) or "-")])


def open_transaction_lines(found: list[dict]) -> list[str]:
    """find-hanging's and describe-producers' table: where each transaction is open,
    its producer, start offset and time, how long it has been open, and what the
    coordinator holds of its producer id."""
    if not found:
        return ["no open transactions found"]
    rows = [("TOPIC", "PARTITION", "PRODUCER-ID", "PRODUCER-EPOCH", "START-OFFSET",
             "START-TIME-MS", "DURATION-MIN", "TRANSACTIONAL-ID", "COORDINATOR-STATE")]
    rows += [(entry["topic"], entry["partition"], entry["producer_id"], entry["producer_epoch"],
              entry["start_offset"], _dash(entry["start_ms"]),
              "-" if entry["duration_ms"] < 0 else entry["duration_ms"] // MS_PER_MINUTE,
              entry["transactional_id"] or "-", entry["coordinator_state"] or "unknown")
             for entry in found]
    return table(rows)


def _dash(value: int) -> str:
    """-1 (not begun, not known) as Kafka's tools show it: ``-``."""
    return "-" if value is None or value < 0 else str(value)
