"""``shmlog cluster up``: a whole cluster on this machine in the foreground (a local
ZooKeeper and N brokers on 127.0.0.1, 127.0.0.2, ...), until SIGTERM or SIGINT.
``shmlog cluster status``: a cluster's brokers and the partitions that need an
operator, read from its ZooKeeper (``cluster_status``).
``shmlog cluster reassign``: move partitions' replicas between brokers, with
kafka-reassign-partitions.sh's verbs (``--generate``, ``--execute [--throttle]``,
``--verify``, ``--cancel``; ``cluster_reassign``). Exit 0 when done, 1 when refused
or (``--verify``) not complete yet, 2 for a usage error or a file that does not
parse.
``shmlog cluster keys``: CurveZMQ key pairs for brokers (``curve_keys``), one
per name, printing each public key.

For development and trying cluster mode: it runs
:class:`shmlog.devtools.local_cluster.LocalCluster` (imported when the verb runs, so the other
verbs start without it), prints each broker's data directory (what clients on that
broker's "host" name) and config file, and prints ``cluster up`` once every broker
serves. Its brokers talk CurveZMQ with keys made in ``DIR/keys`` (``--plaintext``:
plain TCP). A signal stops every broker (each leaves the cluster cleanly), then
ZooKeeper. Production runs one ``shmlog broker --config FILE`` per host instead,
pointed at the operator's ZooKeeper ensemble.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ..common import limits
from ..common.limits import ELECT_LEADERS_TIMEOUT_MS_DEFAULT
from .exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from .signals import STOP_SIGNALS, stopped_by_signals

__all__ = ["add_parser", "DIRECTORY_DEFAULT"]

DIRECTORY_DEFAULT = "shmlog-cluster"


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``cluster`` subcommand (verbs ``up``, ``status``, ``keys``,
    ``elect-leaders`` and ``reassign``) to
    ``commands``."""
    cluster = commands.add_parser("cluster", parents=parents,
                                  help="run a local cluster (ZooKeeper and N brokers), or "
                                       "show a cluster's status")
    verbs = cluster.add_subparsers(dest="cluster_command", required=True, metavar="VERB")
    up = verbs.add_parser(
        "up", parents=parents, help="start ZooKeeper and the brokers; Ctrl-C stops them",
        description="Start a local ZooKeeper and N brokers (broker i on 127.0.0.i, data in "
                    "DIR/broker-i) in the foreground; SIGTERM or Ctrl-C stops them all.")
    up.add_argument("--dir", default=DIRECTORY_DEFAULT,
                    help=f"a new or empty directory for everything (default {DIRECTORY_DEFAULT})")
    up.add_argument("--brokers", type=int, default=limits.CLUSTER_UP_BROKERS_DEFAULT,
                    help=f"how many brokers (default {limits.CLUSTER_UP_BROKERS_DEFAULT})")
    up.add_argument("--zookeeper-connect",
                    help="use this running ZooKeeper (host:port) instead of starting one")
    up.add_argument("--plaintext", action="store_true",
                    help="brokers talk plain TCP (default: CurveZMQ, keys made in DIR/keys)")
    up.set_defaults(run=_up, check=_check)
    keys = verbs.add_parser(
        "keys", parents=parents, help="make CurveZMQ key pairs for brokers",
        description="Write a CurveZMQ key pair per NAME in ZeroMQ's certificate format: "
                    "DIR/NAME.key (the public key: give it to every peer, or put it in their "
                    "curve.allowed.public.keys.dir) and DIR/NAME.key_secret (mode 0600: the "
                    "broker's curve.secret.key.file). Prints each public key (Z85). An "
                    "existing key is never overwritten without --force.")
    keys.add_argument("--out", required=True, metavar="DIR",
                      help="the directory to write to (made 0700 if missing)")
    keys.add_argument("names", nargs="+", metavar="NAME", help="e.g. broker-1 broker-2")
    keys.add_argument("--force", action="store_true", help="replace existing key files")
    keys.add_argument("--json", action="store_true", help="print {name: public key} as JSON")
    keys.set_defaults(run=_keys)
    status = verbs.add_parser(
        "status", parents=parents, help="brokers, controller, under-replicated and offline "
                                         "partitions, leaders per broker",
        description="Read a cluster's state from its ZooKeeper (read only): the live brokers "
                    "and how many partitions each leads, the controller, and every "
                    "under-replicated or offline partition. Exit 1 when a partition is "
                    "under-replicated or offline, or no controller is elected.")
    status.add_argument("--zookeeper-connect", required=True, metavar="HOSTS[/CHROOT]",
                        help="the brokers' zookeeper.connect")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_status)
    elect = verbs.add_parser(
        "elect-leaders", parents=parents, help="elect the preferred leader of partitions",
        description="Ask the controller to make each partition's preferred replica (the "
                    "first of its assignment) its leader where it is alive and in sync "
                    "(kafka-leader-election.sh --election-type preferred), wait for it, and "
                    "print per partition what happened. Exit 1 if any partition is not led "
                    "by its preferred replica afterwards.")
    elect.add_argument("--zookeeper-connect", required=True, metavar="HOSTS[/CHROOT]",
                       help="the brokers' zookeeper.connect")
    which = elect.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-topic-partitions", action="store_true",
                       help="every partition of every topic")
    which.add_argument("--topic", help="the partitions of this topic")
    elect.add_argument("--partition", type=int, help="only this partition (with --topic)")
    elect.add_argument("--timeout-ms", type=int, default=ELECT_LEADERS_TIMEOUT_MS_DEFAULT,
                       help=f"how long to wait for the controller (default "
                            f"{ELECT_LEADERS_TIMEOUT_MS_DEFAULT})")
    elect.add_argument("--json", action="store_true", help="print JSON")
    elect.set_defaults(run=_elect_leaders, check=_check_elect_leaders)
    _add_reassign(verbs, parents)


def _add_reassign(verbs, parents: list[argparse.ArgumentParser]) -> None:
    reassign = verbs.add_parser(
        "reassign", parents=parents, help="move partitions' replicas between brokers "
                                           "(kafka-reassign-partitions)",
        description="Propose (--generate), start (--execute), check (--verify) or cancel "
                    "(--cancel) a partition reassignment through the cluster's ZooKeeper. "
                    "The controller adds the new replicas, waits until they are in sync, "
                    "then drops the old ones. --verify exits 1 until every partition is "
                    "complete, then removes the throttles.")
    reassign.add_argument("--zookeeper-connect", required=True, metavar="HOSTS[/CHROOT]",
                          help="the brokers' zookeeper.connect")
    action = reassign.add_mutually_exclusive_group(required=True)
    for verb, what in (("generate", "print the current and a proposed assignment"),
                       ("execute", "start the reassignment in --reassignment-json-file"),
                       ("verify", "print each partition's progress; clear the throttles "
                                  "once all are complete"),
                       ("cancel", "revert the partitions of --reassignment-json-file that "
                                  "are still moving")):
        action.add_argument(f"--{verb}", action="store_true", help=what)
    reassign.add_argument("--topics-to-move-json-file", metavar="FILE",
                          help='with --generate: {"topics":[{"topic":"t"}],"version":1}')
    reassign.add_argument("--broker-list", metavar="IDS",
                          help="with --generate: the brokers to spread over, e.g. 1,2,4")
    reassign.add_argument("--disable-rack-aware", action="store_true",
                          help="with --generate: ignore the brokers' racks")
    reassign.add_argument("--reassignment-json-file", metavar="FILE",
                          help='{"version":1,"partitions":[{"topic":"t","partition":0,'
                               '"replicas":[1,2,4]}]}')
    reassign.add_argument("--throttle", type=int, metavar="BYTES_PER_S",
                          help="with --execute: the moving replicas' replication rate")
    reassign.set_defaults(run=_reassign, check=_check_reassign)


def _check_reassign(parser: argparse.ArgumentParser, arguments) -> None:
    if arguments.generate:
        if not arguments.topics_to_move_json_file or not arguments.broker_list:
            parser.error("--generate needs --topics-to-move-json-file and --broker-list")
        try:
            arguments.broker_ids = [int(item) for item in arguments.broker_list.split(",")]
        except ValueError:
            parser.error(f"--broker-list must be broker ids joined by commas, got "
                         f"{arguments.broker_list!r}")
    elif not arguments.reassignment_json_file:
        parser.error("--execute, --verify and --cancel need --reassignment-json-file")
    if arguments.throttle is not None and (not arguments.execute or arguments.throttle <= 0):
        parser.error("--throttle goes with --execute, in bytes/s > 0")


def _check(parser: argparse.ArgumentParser, arguments) -> None:
    if not 1 <= arguments.brokers <= limits.CLUSTER_UP_BROKERS_MAX:
        parser.error(f"--brokers must be in 1..{limits.CLUSTER_UP_BROKERS_MAX}, "
                     f"got {arguments.brokers}")


def _up(arguments) -> int:
    """Run the cluster until SIGTERM or SIGINT (exit 0); exit 1 when it cannot start."""
    directory = os.path.abspath(arguments.dir)
    if os.path.isdir(directory) and os.listdir(directory):
        print(f"shmlog cluster up: {directory} is not empty: give a new directory "
              f"(--dir)", file=sys.stderr)
        return EXIT_FAILURE
    from ..devtools.local_cluster import LocalCluster
    cluster = LocalCluster(directory, arguments.brokers,
                           zookeeper_connect=arguments.zookeeper_connect,
                           curve=not arguments.plaintext)
    stop = threading.Event()
    # SIGTERM and SIGINT interrupt the start (KeyboardInterrupt) and end the wait.
    with stopped_by_signals():
        try:
            cluster.start()
            _print_cluster(cluster)
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            for number in STOP_SIGNALS:
                signal.signal(number, signal.SIG_IGN)     # one stop, not interrupted
            cluster.stop()
    print("cluster stopped", flush=True)
    return EXIT_OK


def _keys(arguments) -> int:
    """Write the key pairs; exit 1 (having written none) when a name is invalid or a
    key exists without --force."""
    import json

    from ..common import access
    from ..common.errors import InvalidConfigError
    from ..config import curve_keys
    try:
        for name in arguments.names:
            curve_keys.check_key_name(name)
        if not arguments.force:
            for name in arguments.names:
                for suffix in (curve_keys.PUBLIC_SUFFIX, curve_keys.SECRET_SUFFIX):
                    path = os.path.join(arguments.out, name + suffix)
                    if os.path.lexists(path):
                        raise FileExistsError(f"{path} exists (--force replaces it)")
        access.make_directories(arguments.out)
        made = {name: curve_keys.write_key_pair(arguments.out, name, arguments.force).public_key
                for name in arguments.names}
    except (InvalidConfigError, OSError) as error:
        print(f"shmlog cluster keys: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if arguments.json:
        print(json.dumps(made, indent=2), flush=True)
    else:
        for name, public_key in made.items():
            print(f"{name}: {public_key}  ({os.path.join(arguments.out, name)}"
                  f"{curve_keys.PUBLIC_SUFFIX})", flush=True)
    return EXIT_OK


def _status(arguments) -> int:
    """Print the status; exit 1 unless every partition is fully replicated and led and
    a controller is elected (a check a script or a probe can run)."""
    import json

    from ..cluster import status as cluster_status
    found = cluster_status.read(arguments.zookeeper_connect)
    print(json.dumps(found.as_dict(), indent=2) if arguments.json
          else cluster_status.describe(found), flush=True)
    healthy = found.controller is not None and not found.under_replicated
    return EXIT_OK if healthy else EXIT_FAILURE


def _reassign(arguments) -> int:
    """Run one verb of ``cluster reassign`` (see the module's exit codes)."""
    from ..cluster import reassign as cluster_reassign
    from ..cluster.zk import paths as zk_paths
    from ..cluster.zk.client import ClusterZooKeeper
    from ..common.errors import ShmlogError
    try:
        path = arguments.topics_to_move_json_file or arguments.reassignment_json_file
        with open(path, "rb") as file:
            text = file.read()
        if arguments.generate:
            topics = cluster_reassign.decode_topics(text.decode(), path)
        else:
            request = zk_paths.decode_reassignment(text, path)
    except (OSError, UnicodeDecodeError, ShmlogError) as error:
        print(f"shmlog cluster reassign: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # Nothing is created on connecting: a typo in the chroot finds no topic
        # instead of making an empty cluster.
        zookeeper = ClusterZooKeeper(arguments.zookeeper_connect).start(create_paths=False)
        try:
            if arguments.generate:
                return _generate(zookeeper, topics, arguments)
            if arguments.execute:
                return _execute(zookeeper, request, arguments.throttle)
            if arguments.verify:
                return _verify(zookeeper, request)
            return _cancel(zookeeper, request)
        finally:
            zookeeper.close()
    except ShmlogError as error:
        print(f"shmlog cluster reassign: {error}", file=sys.stderr)
        return EXIT_FAILURE


def _generate(zookeeper, topics, arguments) -> int:
    from ..cluster import reassign as cluster_reassign
    current, proposed = cluster_reassign.generate(zookeeper, topics, arguments.broker_ids,
                                                  rack_aware=not arguments.disable_rack_aware)
    print(f"Current partition replica assignment\n{cluster_reassign.encode_request(current)}\n"
          f"\nProposed partition reassignment configuration\n"
          f"{cluster_reassign.encode_request(proposed)}", flush=True)
    return EXIT_OK


def _execute(zookeeper, request, throttle) -> int:
    from ..cluster import reassign as cluster_reassign
    current = cluster_reassign.execute(zookeeper, request, throttle)
    print(f"Current partition replica assignment\n\n{cluster_reassign.encode_request(current)}"
          f"\n\nSave this to use as the --reassignment-json-file option during rollback",
          flush=True)
    if throttle is not None:
        print(f"The inter-broker throttle limit was set to {throttle} B/s\n"
              f"Warning: You must run --verify periodically, until the reassignment "
              f"completes, to ensure the throttle is removed.", flush=True)
    print("Successfully started partition reassignments for "
          + ",".join(f"{topic}-{partition}" for topic, partition in sorted(request)), flush=True)
    return EXIT_OK


def _verify(zookeeper, request) -> int:
    from ..cluster import reassign as cluster_reassign
    statuses, complete = cluster_reassign.verify(zookeeper, request)
    print("Status of partition reassignment:", flush=True)
    for (topic, partition), verdict in statuses.items():
        print(f"Reassignment of partition {topic}-{partition} is {verdict.value}.", flush=True)
    if complete:
        print("Throttles cleared: the brokers' throttle rates and the topics' throttled "
              "replicas", flush=True)
    return EXIT_OK if complete else EXIT_FAILURE


def _cancel(zookeeper, request) -> int:
    from ..cluster import reassign as cluster_reassign
    cancelled = cluster_reassign.cancel(zookeeper, request)
    print("Successfully cancelled partition reassignments for "
          + (",".join(f"{topic}-{partition}" for topic, partition in cancelled) or "none"),
          flush=True)
    return EXIT_OK


def _check_elect_leaders(parser: argparse.ArgumentParser, arguments) -> None:
    if arguments.partition is not None and arguments.topic is None:
        parser.error("--partition needs --topic")
    if arguments.partition is not None and arguments.partition < 0:
        parser.error(f"--partition must be >= 0, got {arguments.partition}")
    if arguments.timeout_ms < 1:
        parser.error(f"--timeout-ms must be >= 1, got {arguments.timeout_ms}")


def _elect_leaders(arguments) -> int:
    """Run the election; exit 1 if a partition is not led by its preferred replica
    afterwards, or the election could not be asked for or was not carried out."""
    import json

    from ..cluster.controller import leader_election  # kazoo: only this verb loads it
    elections = leader_election.elect_preferred_leaders(
        arguments.zookeeper_connect, arguments.topic, arguments.partition, arguments.timeout_ms)
    print(json.dumps([election.as_dict() for election in elections], indent=2)
          if arguments.json else leader_election.describe(elections), flush=True)
    return EXIT_OK if all(election.outcome.ok for election in elections) else EXIT_FAILURE


def _print_cluster(cluster) -> None:
    print(f"ZooKeeper: {cluster.zookeeper_connect}", flush=True)
    security = f"CurveZMQ, keys in {cluster.keys_directory}" if cluster.curve else "plain TCP"
    print(f"brokers talk {security}", flush=True)
    for broker_id in range(1, cluster.count + 1):
        print(f"broker {broker_id} on {cluster.host(broker_id)}: "
              f"data {cluster.data_dir(broker_id)}, config {cluster.config_file(broker_id)}",
              flush=True)
    first = cluster.data_dir(1)
    print(f"clients of broker N's host: --data-dir {os.path.dirname(first)}/broker-N, "
          f"Producer(\"{first}\"), Consumer(bootstrap=\"{first}\"), ...", flush=True)
    print(f"Kafka clients: bootstrap.servers={cluster.bootstrap_servers}", flush=True)
    print("cluster up (Ctrl-C or SIGTERM stops it)", flush=True)
