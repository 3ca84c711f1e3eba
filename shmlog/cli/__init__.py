"""The ``shmlog`` command. Each subcommand parses its arguments and calls the library.

Exit codes: 0 ok, 1 a problem was found (corruption, a failed request), 2 usage error,
130 ended by Ctrl-C (128 + the signal's number: ``exit_codes.py``). Ctrl-C ends every
verb without a traceback, even one started with SIGINT ignored (``signals.py``).

One module per family of verbs, each holding its verbs' arguments (``add_parser``)
and their thin bodies: ``broker.py`` (run a broker), ``admin.py`` (``topics``,
``groups``), ``transactions.py`` (``transactions``: kafka-transactions' list,
describe, find-hanging and abort), ``tools.py`` (``offsets``, ``delete-records``,
``log-dirs``),
``console.py`` (``produce``, ``consume``), ``dump.py`` (print and verify segment and
index files), ``perf.py``, ``zookeeper.py`` (a local ZooKeeper for
development), ``cluster.py`` (a local cluster: ZooKeeper and N brokers; a cluster's
status), ``status.py`` (a running broker's status, once or redrawn). This module
builds the parser from them and runs the verb (:func:`main`, the ``shmlog`` console
script and ``python -m shmlog``).

A verb imports what it needs when it runs: the ones that only ask the broker
something (``topics``, ``groups``, ``transactions``, ``offsets``, ``delete-records``,
``log-dirs``)
load neither numba nor numpy, and start in a
tenth of a second instead of a second. So this package imports, at the top of its
modules, only light modules (``common.errors``, ``common.limits``, ``config.broker``).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..common.errors import ShmlogError
from . import (
    admin,
    broker,
    cluster,
    console,
    dump,
    perf,
    status,
    tools,
    transactions,
    zookeeper,
)
from .exit_codes import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .signals import interrupts

__all__ = ["main", "build_parser", "log_level", "package_version", "EXIT_OK", "EXIT_FAILURE",
           "EXIT_USAGE"]

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
# A broker says when it serves and when it stops, as Kafka's does at INFO; the
# client commands print only their results.
LOG_LEVEL_BROKER = "INFO"
LOG_LEVEL_CLIENT = "WARNING"


def _common_options(default) -> argparse.ArgumentParser:
    """The options every subcommand takes, before or after its name. The subcommands'
    copy has no default (SUPPRESS), so it never overwrites a value given before."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", choices=LOG_LEVELS, default=default,
                        help=f"default {LOG_LEVEL_BROKER} for the broker, "
                             f"{LOG_LEVEL_CLIENT} for the other commands")
    return common


def package_version() -> str:
    """The installed package's version (``importlib.metadata``; setup.cfg's
    ``version``), or ``unknown`` when shmlog runs from a tree that was never
    installed."""
    from importlib import metadata
    try:
        return metadata.version("shmlog")
    except metadata.PackageNotFoundError:
        return "unknown"


def log_level(arguments: argparse.Namespace) -> str:
    """The level asked for, or the command's default."""
    if arguments.log_level:
        return arguments.log_level
    return LOG_LEVEL_BROKER if arguments.command == "broker" else LOG_LEVEL_CLIENT


def build_parser() -> argparse.ArgumentParser:
    """The ``shmlog`` parser: every verb, each with ``run`` (and perhaps ``check``) as
    defaults of its namespace."""
    parser = argparse.ArgumentParser(prog="shmlog", description=__doc__.splitlines()[0],
                                     parents=[_common_options(None)])
    parser.add_argument("--version", action="version", version=f"shmlog {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = [_common_options(argparse.SUPPRESS)]

    dump.add_parser(commands, common)
    broker.add_parser(commands, common)
    admin.add_topics_parser(commands, common)
    admin.add_groups_parser(commands, common)
    transactions.add_parser(commands, common)
    tools.add_offsets_parser(commands, common)
    tools.add_delete_records_parser(commands, common)
    tools.add_log_dirs_parser(commands, common)
    console.add_produce_parser(commands, common)
    console.add_consume_parser(commands, common)
    perf.add_parser(commands, common)
    zookeeper.add_parser(commands, common)
    cluster.add_parser(commands, common)
    status.add_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the verb ``argv`` (default: the command line) names; its exit code.

    A usage error exits (status 2) through argparse; a :class:`ShmlogError` is
    printed and returns 1; a closed stdout (``| head``) ends the verb quietly; Ctrl-C
    returns 130, without a traceback (a verb that runs until stopped handles it
    itself, and returns 128 + the signal's number).
    """
    parser = build_parser()
    arguments = parser.parse_args(argv)
    check = getattr(arguments, "check", None)
    if check is not None:               # what a verb's arguments need beyond argparse
        check(parser, arguments)
    logging.basicConfig(level=log_level(arguments),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with interrupts():
            return arguments.run(arguments)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ShmlogError as error:
        print(f"shmlog {arguments.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        return EXIT_OK
