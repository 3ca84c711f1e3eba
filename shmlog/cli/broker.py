"""``shmlog broker``: run a broker in the foreground until SIGTERM or SIGINT.

Every field of :class:`~shmlog.config.broker.BrokerConfig` but its tables is a
flag (``--name`` for ``name``), so a broker needs no config file; ``--config``
reads a TOML file, and a flag wins over it. The ``[cluster]`` table is read from
the file only. The broker itself is imported when the verb runs.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..common.documented import doc_of
from ..config.broker import BrokerConfig
from .exit_codes import EXIT_OK

__all__ = ["add_parser"]


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``broker`` subcommand to ``commands`` (an argparse subparsers action)."""
    broker = commands.add_parser("broker", parents=parents,
                                 help="run a broker (no config file needed)",
                                 description="Run a broker in the foreground; SIGTERM or "
                                 "Ctrl-C stops it gracefully.")
    broker.add_argument("--config", help="a TOML file of broker settings")
    broker.add_argument("--data-dir", help="default: $SHMLOG_DATA_DIR or ~/.local/share/shmlog")
    for field in dataclasses.fields(BrokerConfig):
        if field.name != "data_dir" and field.name not in BrokerConfig.TABLE_SETTINGS:
            broker.add_argument(f"--{field.name.replace('_', '-')}",
                                type=int if field.name not in BrokerConfig.TEXT_SETTINGS
                                and field.name not in BrokerConfig.BOOLEAN_SETTINGS else str,
                                help=f"{doc_of(field)} Default {field.default}."
                                .replace("%", "%%"))        # argparse formats help with %
    broker.set_defaults(run=_broker)


def _broker(arguments) -> int:
    """Run a broker in the foreground until SIGTERM or SIGINT."""
    from ..server.broker import serve
    settings = {field.name: getattr(arguments, field.name)
                for field in dataclasses.fields(BrokerConfig)
                if field.name not in BrokerConfig.TABLE_SETTINGS}
    serve(BrokerConfig.load(arguments.config, **settings))
    return EXIT_OK
