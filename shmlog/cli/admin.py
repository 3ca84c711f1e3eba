"""``shmlog topics`` and ``shmlog groups``: administration through the broker's
control endpoint (Kafka's kafka-topics and kafka-consumer-groups).

These verbs only ask the broker something, so they import :class:`~shmlog.admin.Admin`
(ZeroMQ and the control protocol) and nothing of the data path: no numba, no numpy
(``tests/integration/test_cli_processes.py`` checks it). Keep it so: a new import
here must be light too.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import LocalProtocolError
from .exit_codes import EXIT_OK, EXIT_USAGE

__all__ = ["add_topics_parser", "add_groups_parser"]


def add_topics_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``topics`` subcommand to ``commands`` (an argparse subparsers action)."""
    topics = commands.add_parser("topics", parents=parents,
                                 help="create, list, describe, alter, delete topics")
    topics.add_argument("action", choices=["create", "list", "describe", "alter", "delete"])
    topics.add_argument("topic", nargs="?", help="the topic (all actions but list)")
    topics.add_argument("--data-dir", help="the broker's data directory")
    topics.add_argument("--partitions", type=int, default=None,
                        help="partition count (create; alter: the new, larger count)")
    topics.add_argument("--replication-factor", type=int, default=None,
                        help="create, in a cluster: replicas of each partition (default: "
                             "the broker's default.replication.factor)")
    topics.add_argument("--config", action="append", metavar="KEY=VALUE",
                        help="a topic config, Kafka's names (repeatable)")
    topics.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                        help="remove a config override (alter; repeatable)")
    topics.add_argument("--json", action="store_true", help="machine-readable output")
    topics.set_defaults(run=_topics, check=_check_topics)


def add_groups_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``groups`` subcommand to ``commands`` (an argparse subparsers action)."""
    groups = commands.add_parser("groups", parents=parents,
                                 help="list, describe, reset offsets of, delete "
                                 "consumer groups")
    groups.add_argument("action", choices=["list", "describe", "reset-offsets", "delete"])
    groups.add_argument("group", nargs="?", help="the group (all actions but list)")
    groups.add_argument("--data-dir", help="the broker's data directory")
    groups.add_argument("--topic", action="append",
                        help="reset-offsets: this topic (repeatable; default: every topic the "
                             "group committed offsets for)")
    target = groups.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int)
    target.add_argument("--to-timestamp-ms", type=int,
                        help="the first offset at or after this time")
    target.add_argument("--shift-by", type=int, help="move the committed offsets by this many")
    groups.add_argument("--execute", action="store_true",
                        help="reset-offsets: apply the plan (the default is a dry run)")
    groups.add_argument("--json", action="store_true", help="machine-readable output")
    groups.set_defaults(run=_groups, check=_check_groups)


def _check_topics(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> None:
    """What argparse cannot say: every action but list names a topic; create makes
    one partition unless told."""
    if arguments.action != "list" and not arguments.topic:
        parser.error(f"topics {arguments.action} needs a topic name")
    if arguments.action == "create" and arguments.partitions is None:
        arguments.partitions = 1


def _check_groups(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> None:
    """Every action but list names a group."""
    if arguments.action != "list" and not arguments.group:
        parser.error(f"groups {arguments.action} needs a group id")


def _topics(arguments) -> int:
    from ..admin import Admin
    admin = Admin(arguments.data_dir)
    action = arguments.action
    if action == "list":
        result: object = admin.list_topics()
    elif action == "create":
        result = admin.create_topic(arguments.topic, arguments.partitions,
                                    _key_values(arguments.config), arguments.replication_factor)
    elif action == "describe":
        result = admin.describe_topic(arguments.topic)
    elif action == "alter":
        result = admin.alter_topic_config(arguments.topic, _key_values(arguments.config),
                                          arguments.delete_config)
        if arguments.partitions:
            result = admin.add_partitions(arguments.topic, arguments.partitions)
    else:
        admin.delete_topic(arguments.topic)
        result = {"deleted": arguments.topic}
    if arguments.json:
        print(json.dumps(result, indent=2))
    elif action == "list":
        print("\n".join(result))
    elif action == "delete":
        print(f"deleted topic {arguments.topic}")
    elif "live_brokers" in result:
        print("\n".join(_cluster_lines(result)))
    else:
        print(f"Topic: {result['name']}  TopicId: {result['topic_id']}  "
              f"PartitionCount: {len(result['partitions'])}")
        overrides = {key: value for key, value in result["config"].items()}
        print("Configs: " + ", ".join(f"{key}={value}" for key, value in sorted(overrides.items())))
    return EXIT_OK


def _cluster_lines(described: dict) -> list[str]:
    """kafka-topics --describe's lines for a topic of a cluster."""
    from ..cluster_metadata import describe_lines
    return describe_lines(described["name"], described["topic_id"],
                          {entry["partition"]: (entry["leader"], entry["replicas"], entry["isr"])
                           for entry in described["partitions"]},
                          described["overrides"], described["live_brokers"])


def _groups(arguments) -> int:
    """Kafka's kafka-consumer-groups: list, describe (with lag), reset-offsets
    (a dry run unless --execute), delete."""
    from ..admin import Admin
    admin = Admin(arguments.data_dir)
    action = arguments.action
    if action == "list":
        result: object = admin.list_consumer_groups()
        lines = [f"{group['group_id']}  {group['state']}  members={group['members']}"
                 for group in result]
    elif action == "describe":
        result = admin.describe_consumer_group(arguments.group)
        clients = {member["member_id"]: member["client_id"] for member in result["members"]}
        rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                 "CLIENT-ID")]
        rows += [(entry["topic"], entry["partition"], _dash(entry["committed"]),
                  _dash(entry["log_end_offset"]), _dash(entry["lag"]),
                  _dash(entry["member_id"]), _dash(clients.get(entry["member_id"])))
                 for entry in result["partitions"]]
        lines = [f"Group {result['group_id']}: {result['state']}, generation "
                 f"{result['generation']}, assignor {result['protocol'] or '-'}, "
                 f"{len(result['members'])} members", *_table(rows)]
    elif action == "reset-offsets":
        to, value = _reset_target(arguments)
        topics = arguments.topic or sorted({topic for topic, _ in
                                            admin.list_consumer_group_offsets(arguments.group)})
        if not topics:
            print(f"shmlog groups: group {arguments.group!r} has no committed offsets; name "
                  f"the topics with --topic", file=sys.stderr)
            return EXIT_USAGE
        plan = admin.plan_offset_reset(arguments.group, topics, to=to, value=value)
        if arguments.execute:
            admin.alter_consumer_group_offsets(arguments.group, {
                (entry["topic"], entry["partition"]): entry["new"] for entry in plan})
        result = {"executed": arguments.execute, "offsets": plan}
        rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET")]
        rows += [(entry["topic"], entry["partition"], _dash(entry["current"]), entry["new"])
                 for entry in plan]
        lines = [*_table(rows), "offsets reset" if arguments.execute else
                 "dry run: nothing changed (add --execute to apply)"]
    else:
        admin.delete_consumer_group(arguments.group)
        result = {"deleted": arguments.group}
        lines = [f"deleted group {arguments.group}"]
    print(json.dumps(result, indent=2) if arguments.json else "\n".join(lines))
    return EXIT_OK


def _reset_target(arguments) -> tuple[str, int | None]:
    for name, value in (("earliest", arguments.to_earliest), ("latest", arguments.to_latest)):
        if value:
            return name, None
    for name, value in (("offset", arguments.to_offset),
                        ("timestamp", arguments.to_timestamp_ms), ("shift", arguments.shift_by)):
        if value is not None:
            return name, value
    raise LocalProtocolError("reset-offsets needs one of --to-earliest, --to-latest, "
                             "--to-offset, --to-timestamp-ms, --shift-by")


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def _key_values(pairs: list[str] | None) -> dict:
    values = {}
    for pair in pairs or []:
        key, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"shmlog topics: --config takes key=value, got {pair!r}")
        values[key] = value
    return values
