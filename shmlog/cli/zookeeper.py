"""``shmlog zookeeper``: a local standalone ZooKeeper in the foreground until SIGTERM
or SIGINT, for development (cluster mode keeps its metadata in ZooKeeper; production
points the brokers at an ensemble instead).

The server is :class:`shmlog.devtools.zookeeper.ZooKeeperServer`, imported when the verb runs
(its subprocess and socket modules would add a sixth to every verb's start-up), so
the help gives ZooKeeper's defaults as text: ``test_zookeeper.py`` checks they are
the module's. The verb prints the address it serves once a client can connect, and
stops the JVM when signalled.
"""

from __future__ import annotations

import argparse
import sys

from ..common import limits
from .exit_codes import EXIT_FAILURE, EXIT_OK
from .signals import stopped_by_signals

__all__ = ["add_parser", "DEFAULTS_HELP"]

# What the help says of the defaults (shmlog.devtools.zookeeper's PORT_DEFAULT, HOST_DEFAULT,
# limits.ZOOKEEPER_TICK_TIME_MS_DEFAULT: ZooKeeper's own).
DEFAULTS_HELP = {"port": 2181, "host": "127.0.0.1", "tick_time_ms": 2000}


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``zookeeper`` subcommand to ``commands`` (an argparse subparsers action)."""
    server = commands.add_parser(
        "zookeeper", parents=parents, help="run a local ZooKeeper (development, tests)",
        description="Run a standalone ZooKeeper (from PySpark's jars; needs Java) in the "
                    "foreground; SIGTERM or Ctrl-C stops it.")
    server.add_argument("--port", type=int,
                        help=f"client port (default {DEFAULTS_HELP['port']}; 0 picks a free one)")
    server.add_argument("--host", help=f"address to listen on (default {DEFAULTS_HELP['host']})")
    server.add_argument("--data-dir", help="its configuration, log and data (default "
                                           "~/.local/share/shmlog-zookeeper)")
    server.add_argument("--tick-time-ms", type=int,
                        help="ZooKeeper's tickTime: sessions time out after 2 to 20 ticks "
                             f"(default {DEFAULTS_HELP['tick_time_ms']})")
    server.set_defaults(run=_zookeeper)


def _zookeeper(arguments) -> int:
    """Serve until SIGTERM or SIGINT (exit 0), or until the JVM exits (exit 1)."""
    from ..devtools import zookeeper
    server = zookeeper.ZooKeeperServer(
        arguments.data_dir or zookeeper.default_data_dir(),
        port=zookeeper.PORT_DEFAULT if arguments.port is None else arguments.port,
        host=arguments.host or zookeeper.HOST_DEFAULT,
        tick_time_ms=limits.ZOOKEEPER_TICK_TIME_MS_DEFAULT if arguments.tick_time_ms is None
        else arguments.tick_time_ms)
    # SIGTERM and SIGINT interrupt (KeyboardInterrupt), so the JVM is stopped on the
    # way out, even while it starts.
    with stopped_by_signals():
        try:
            with server:
                print(f"ZooKeeper serves {server.connect_string} (started in "
                      f"{server.start_time_s:.1f} s; data and log in {server.data_dir})",
                      flush=True)
                status = server.process.wait()
            print(f"shmlog zookeeper: ZooKeeper exited with status {status}: see "
                  f"{server.log_path} and {server.output_path}", file=sys.stderr)
            return EXIT_FAILURE
        except KeyboardInterrupt:
            print(f"ZooKeeper on {server.connect_string} stopped", flush=True)
            return EXIT_OK
