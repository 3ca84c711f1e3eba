"""Client settings (``Producer``, ``Consumer``, ``Admin``): type and range checks.

Rules
-----
* A client checks every setting in its constructor, before it asks the broker
  anything or maps any shared memory, so a bad setting leaves nothing behind.
* A bad setting raises :class:`~shmlog.common.errors.InvalidConfigError` naming the
  setting, the value given and what is accepted, as Kafka's ``ConfigException``
  does. Numbers are integers (numpy integers too), never bools or floats.
* Ranges are Kafka's where Kafka has them; the upper bounds come from
  ``shmlog.common.limits``.
"""

from __future__ import annotations

import numbers
import os
import re
from typing import Any, Iterable

from .errors import InvalidConfigError

__all__ = ["integer", "optional_integer", "flag", "choice", "optional_text", "data_directory",
           "bootstrap"]


def integer(name: str, value: Any, least: int, most: int) -> int:
    """``value`` as an int in ``[least, most]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidConfigError(f"{name} must be an integer in [{least}, {most}], "
                                 f"got {value!r:.100}")
    if not least <= value <= most:
        raise InvalidConfigError(f"{name} must be in [{least}, {most}], got {value}")
    return int(value)


def optional_integer(name: str, value: Any, least: int, most: int) -> int | None:
    """None, or ``value`` as an int in ``[least, most]``."""
    return None if value is None else integer(name, value, least, most)


def flag(name: str, value: Any) -> bool:
    """``value``, which must be a bool (a truthy string like "false" is a mistake)."""
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{name} must be True or False, got {value!r:.100}")
    return value


def choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value``, one of ``choices`` (compared by type and value: True is not 1)."""
    choices = tuple(choices)
    if not any(type(value) is type(option) and value == option for option in choices):
        raise InvalidConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                                 f"got {value!r:.100}")
    return value


def optional_text(name: str, value: Any) -> str | None:
    """None, or a non-empty string."""
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidConfigError(f"{name} must be a non-empty string (or None), "
                                 f"got {value!r:.100}")
    return value


def data_directory(value: Any, name: str = "bootstrap") -> str | None:
    """The ``bootstrap`` setting: None (the default directory) or a path."""
    if value is not None and not (isinstance(value, (str, os.PathLike)) and os.fspath(value)):
        raise InvalidConfigError(f"{name} must be the broker's data directory (a path), "
                                 f"got {value!r:.100}")
    return None if value is None else os.fspath(value)


# What kafka-python programs pass as bootstrap_servers: host:port (or [host]:port).
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")


def bootstrap(bootstrap: Any, bootstrap_servers: Any) -> str | None:
    """The data directory from a client's ``bootstrap`` and its kafka-python alias
    ``bootstrap_servers`` (a path, or a list or tuple of one path, as
    kafka-python takes a list of servers).

    Raises
    ------
    InvalidConfigError
        Both given with different values; a list of more than one directory; a
        ``host:port`` that is no directory here (a broker is reached through its
        data directory on this host, not over the network).
    """
    if isinstance(bootstrap_servers, (list, tuple)):
        if len(bootstrap_servers) != 1:
            raise InvalidConfigError(
                f"bootstrap_servers must name one broker data directory (a path, or a list "
                f"of one), got {list(bootstrap_servers)!r:.200}")
        bootstrap_servers = bootstrap_servers[0]
    servers = data_directory(bootstrap_servers, "bootstrap_servers")
    directory = data_directory(bootstrap)
    if servers is not None and directory is not None and \
            os.path.normpath(servers) != os.path.normpath(directory):
        raise InvalidConfigError(f"bootstrap={directory!r} and bootstrap_servers={servers!r} "
                                 f"name different brokers; give one of them")
    directory = directory or servers
    if directory is not None and _HOST_PORT.fullmatch(directory) and \
            not os.path.isdir(directory):
        raise InvalidConfigError(
            f"bootstrap_servers={directory!r} looks like host:port, but a shmlog client "
            f"reaches its broker through the broker's data directory on this host (what "
            f"`shmlog broker --data-dir` was given): pass that path instead")
    return directory
