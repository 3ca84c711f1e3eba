"""``shmlog topics`` and ``shmlog groups``: administration through the broker's
control endpoint (Kafka's kafka-topics and kafka-consumer-groups: ``topics describe``
adds each partition's offsets and disk use and the configs' sources; ``groups
describe`` takes ``--all-groups``, ``--members`` and ``--state``; ``reset-offsets``
takes ``--to-datetime`` and ``--by-duration``).

These verbs only ask the broker something, so they import :class:`~shmlog.client.admin.Admin`
(ZeroMQ and the control protocol) and nothing of the data path: no numba, no numpy
(``tests/integration/test_cli_processes.py`` checks it). Keep it so: a new import
here must be light too.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..common.errors import LocalProtocolError
from .exit_codes import EXIT_OK, EXIT_USAGE
from .tools import table

__all__ = ["add_topics_parser", "add_groups_parser", "config_sources", "describe_topic_lines",
           "KAFKA_CONFIG_SOURCES"]


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
    topics.add_argument("--all", action="store_true",
                        help="describe: every config with its source (default: the topic's "
                             "overrides only)")
    topics.add_argument("--json", action="store_true", help="machine-readable output")
    topics.set_defaults(run=_topics, check=_check_topics)


def add_groups_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``groups`` subcommand to ``commands`` (an argparse subparsers action)."""
    groups = commands.add_parser("groups", parents=parents,
                                 help="list, describe, reset offsets of, delete "
                                 "consumer groups")
    groups.add_argument("action", choices=["list", "describe", "reset-offsets", "delete"])
    groups.add_argument("group", nargs="?", help="the group (all actions but list, and "
                                                  "describe --all-groups)")
    groups.add_argument("--all-groups", action="store_true", help="describe: every group")
    view = groups.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true",
                      help="describe: committed offsets, log ends and lag (the default)")
    view.add_argument("--members", action="store_true",
                      help="describe: member id, host, client id, partitions, assignment")
    view.add_argument("--state", action="store_true",
                      help="describe: coordinator, assignor, state, member count")
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
    target.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss",
                        help="the first offset at or after this time (local time unless a "
                             "zone follows, as Kafka)")
    target.add_argument("--by-duration", metavar="PnDTnHnMnS",
                        help="the first offset at or after this long ago (ISO-8601, e.g. PT10M)")
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
    """Every action but list names a group (describe: or --all-groups, not both)."""
    every = arguments.action == "describe" and arguments.all_groups
    if arguments.action != "list" and not arguments.group and not every:
        parser.error(f"groups {arguments.action} needs a group id"
                     + (" or --all-groups" if arguments.action == "describe" else ""))
    if every and arguments.group:
        parser.error("groups describe takes a group id or --all-groups, not both")
    if arguments.all_groups and arguments.action != "describe":
        parser.error("--all-groups goes with describe")


def _topics(arguments) -> int:
    from ..client.admin import Admin
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
    if arguments.json and action == "describe":
        offsets = {entry["partition"]: entry for entry in admin.list_offsets(arguments.topic)}
        result["partitions"] = [{**entry, **offsets.get(entry["partition"], {})}
                                for entry in result["partitions"]]
        result["configs"] = [{"name": name, "value": value, "source": source}
                             for name, value, source in config_sources(result)
                             if arguments.all or source != "DEFAULT_CONFIG"]
        print(json.dumps(result, indent=2))
    elif arguments.json:
        print(json.dumps(result, indent=2))
    elif action == "list":
        print("\n".join(result))
    elif action == "delete":
        print(f"deleted topic {arguments.topic}")
    elif action == "describe":
        print("\n".join(describe_topic_lines(result, admin.list_offsets(arguments.topic),
                                              every_config=arguments.all)))
    elif "live_brokers" in result:
        print("\n".join(_cluster_lines(result)))
    else:
        print("\n".join(_single_lines(result)))
    return EXIT_OK


# Kafka's ConfigSource names of the sources a broker's describe_topic may tell.
KAFKA_CONFIG_SOURCES = {"topic": "DYNAMIC_TOPIC_CONFIG", "broker": "STATIC_BROKER_CONFIG",
                        "default": "DEFAULT_CONFIG"}


def config_sources(described: dict) -> list[tuple[str, object, str]]:
    """(name, value, source) of every config of a described topic, with Kafka's
    ``ConfigSource`` names, worked out here, in the command, from what the broker
    tells: its ``config_sources`` when it tells them (``{name: {"value",
    "source"}}``), else ``DYNAMIC_TOPIC_CONFIG`` for the topic's own settings
    (``overrides``: a cluster's config znode, a single broker's ``topic.json``)
    and ``DEFAULT_CONFIG`` for the rest of its ``config``."""
    if "config_sources" in described:
        return [(name, entry["value"], KAFKA_CONFIG_SOURCES.get(entry["source"],
                                                                str(entry["source"]).upper()))
                for name, entry in sorted(described["config_sources"].items())]
    overrides = described.get("overrides", {})
    every = {**described["config"], **overrides}
    return [(name, every[name], "DYNAMIC_TOPIC_CONFIG" if name in overrides else
             "DEFAULT_CONFIG") for name in sorted(every)]


def describe_topic_lines(described: dict, offsets: list[dict], *,
                         every_config: bool = False) -> list[str]:
    """``topics describe``'s lines: kafka-topics --describe's (a cluster's leaders,
    replicas and ISRs), each partition's offsets and disk use, then the topic's
    overrides with their sources (every config with ``every_config``)."""
    lines = _cluster_lines(described) if "live_brokers" in described else \
        _single_lines(described)
    by_partition = {entry["partition"]: entry for entry in offsets}
    lines += [f"\tTopic: {described['name']}\tPartition: {number}"
              f"\tLogStartOffset: {entry['log_start_offset']}"
              f"\tLogEndOffset: {entry['log_end_offset']}"
              f"\tHighWatermark: {entry['high_watermark']}\tSize: {entry['size']}"
              f"\tSegments: {entry['segment_count']}"
              for number, entry in sorted(by_partition.items())]
    lines += [f"\tConfig: {name}={_config_text(value)}\tSource: {source}"
              for name, value, source in config_sources(described)
              if every_config or source != "DEFAULT_CONFIG"]
    return lines


def _single_lines(described: dict) -> list[str]:
    """kafka-topics --describe's header for a single broker's topic (the broker is
    the only replica: no leader lines)."""
    overrides = [(name, value) for name, value, source in config_sources(described)
                 if source == "DYNAMIC_TOPIC_CONFIG"]
    return [f"Topic: {described['name']}\tTopicId: {described['topic_id']}"
            f"\tPartitionCount: {len(described['partitions'])}\tReplicationFactor: 1"
            f"\tConfigs: " + ",".join(f"{name}={_config_text(value)}"
                                       for name, value in overrides)]


def _config_text(value) -> str:
    # Kafka's configs are strings: booleans print as true/false.
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _cluster_lines(described: dict) -> list[str]:
    """kafka-topics --describe's lines for a topic of a cluster."""
    from ..cluster.metadata import describe_lines
    return describe_lines(described["name"], described["topic_id"],
                          {entry["partition"]: (entry["leader"], entry["replicas"], entry["isr"])
                           for entry in described["partitions"]},
                          described["overrides"], described["live_brokers"])


def _groups(arguments) -> int:
    """Kafka's kafka-consumer-groups: list, describe (with lag), reset-offsets
    (a dry run unless --execute), delete."""
    from ..client.admin import Admin
    admin = Admin(arguments.data_dir)
    action = arguments.action
    if action == "list":
        result: object = admin.list_consumer_groups()
        lines = [f"{group['group_id']}  {group['state']}  members={group['members']}"
                 for group in result]
    elif action == "describe":
        result, lines = _describe_groups(admin, arguments)
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
        lines = [*table(rows), "offsets reset" if arguments.execute else
                 "dry run: nothing changed (add --execute to apply)"]
    else:
        admin.delete_consumer_group(arguments.group)
        result = {"deleted": arguments.group}
        lines = [f"deleted group {arguments.group}"]
    print(json.dumps(result, indent=2) if arguments.json else "\n".join(lines))
    return EXIT_OK


def _describe_groups(admin, arguments) -> tuple[object, list[str]]:
    """kafka-consumer-groups --describe (``--offsets``, the default; ``--members``;
    ``--state``) of one group or, with --all-groups, of every group: (the JSON
    result, the text lines)."""
    names = [arguments.group] if arguments.group else \
        sorted(group["group_id"] for group in admin.list_consumer_groups())
    described = [admin.describe_consumer_group(name) for name in names]
    if arguments.state:
        coordinators = _coordinators(admin, names)
        for entry in described:
            entry["coordinator"] = coordinators[entry["group_id"]]
        rows = [("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")]
        rows += [(entry["group_id"], entry["coordinator"], entry["protocol"] or "-",
                  entry["state"], len(entry["members"])) for entry in described]
        lines = table(rows)
    elif arguments.members:
        rows = [("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT")]
        rows += [(entry["group_id"], member["member_id"], member.get("client_host") or "-",
                  member["client_id"] or "-", len(member["assignment"]),
                  _assignment_text(member["assignment"]))
                 for entry in described for member in entry["members"]]
        lines = [f"Consumer group '{entry['group_id']}' has no active members."
                 for entry in described if not entry["members"]]
        lines += table(rows) if len(rows) > 1 else []
    else:
        lines = []
        for entry in described:
            lines += ([""] if lines else []) + _offsets_lines(entry)
    return (described if arguments.all_groups else described[0]), lines


def _offsets_lines(described: dict) -> list[str]:
    """One group's header and its partitions' committed offsets, log ends and lag."""
    members = {member["member_id"]: member for member in described["members"]}
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
             "HOST", "CLIENT-ID")]
    rows += [(entry["topic"], entry["partition"], _dash(entry["committed"]),
              _dash(entry["log_end_offset"]), _dash(entry["lag"]),
              _dash(entry["member_id"]),
              _dash(members.get(entry["member_id"], {}).get("client_host") or None),
              _dash(members.get(entry["member_id"], {}).get("client_id")))
             for entry in described["partitions"]]
    return [f"Group {described['group_id']}: {described['state']}, generation "
            f"{described['generation']}, assignor {described['protocol'] or '-'}, "
            f"{len(described['members'])} members", *table(rows)]


def _assignment_text(assignment: list) -> str:
    """Kafka's ASSIGNMENT column: ``topic(0,1),other(2)``, or ``-``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in assignment:
        by_topic.setdefault(topic, []).append(partition)
    return ",".join(f"{topic}({','.join(str(number) for number in sorted(numbers))})"
                    for topic, numbers in sorted(by_topic.items())) or "-"


def _coordinators(admin, group_ids: list[str]) -> dict[str, str]:
    """Kafka's COORDINATOR (ID) of each group: in a cluster the leader of the
    group's ``__consumer_offsets`` partition (``groups.offsets_partition``), as
    ``host (id)``; a single broker coordinates every group itself (broker 0)."""
    import socket

    from ..groups import OFFSETS_TOPIC, offsets_partition
    metadata = admin.metadata()
    if "brokers" not in metadata:
        return {group_id: f"{socket.gethostname()} (0)" for group_id in group_ids}
    offsets = next((topic for topic in metadata["topics"] if topic["name"] == OFFSETS_TOPIC),
                   None)
    coordinators = {}
    for group_id in group_ids:
        leader = -1 if offsets is None else offsets["partitions"][offsets_partition(
            group_id, len(offsets["partitions"]))]["leader"]
        broker = metadata["brokers"].get(str(leader))
        coordinators[group_id] = "none (-1)" if broker is None else f"{broker['host']} ({leader})"
    return coordinators


def _reset_target(arguments) -> tuple[str, int | str | None]:
    for name, value in (("earliest", arguments.to_earliest), ("latest", arguments.to_latest)):
        if value:
            return name, None
    for name, value in (("offset", arguments.to_offset),
                        ("timestamp", arguments.to_timestamp_ms), ("shift", arguments.shift_by),
                        ("datetime", arguments.to_datetime),
                        ("duration", arguments.by_duration)):
        if value is not None:
            return name, value
    raise LocalProtocolError("reset-offsets needs one of --to-earliest, --to-latest, "
                             "--to-offset, --to-timestamp-ms, --to-datetime, --by-duration, "
                             "--shift-by")


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _key_values(pairs: list[str] | None) -> dict:
    values = {}
    for pair in pairs or []:
        key, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"shmlog topics: --config takes key=value, got {pair!r}")
        values[key] = value
    return values
