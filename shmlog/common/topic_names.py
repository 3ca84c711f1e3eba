"""Topic names: Kafka's rule for a legal one (its ``Topic.validate``).

Rules
-----
* A name is 1 to ``limits.TOPIC_NAME_LENGTH_MAX`` characters of ASCII letters, digits,
  ``.``, ``_`` and ``-``, and neither ``.`` nor ``..`` (it names a directory).
* Light: the clients check a name before they ask the broker (``Admin``'s
  ``validate_only``), so this module imports only the limits and the errors.
"""

from __future__ import annotations

import re

from . import limits
from .errors import InvalidTopicError

__all__ = ["validate_topic_name"]

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> str:
    """Return ``name`` when it is a legal topic name (Kafka's rules), else raise.

    Raises
    ------
    InvalidTopicError
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"topic name must be a non-empty string, got {name!r}")
    if len(name) > limits.TOPIC_NAME_LENGTH_MAX:
        raise InvalidTopicError(f"topic name is {len(name)} characters; at most "
                                f"{limits.TOPIC_NAME_LENGTH_MAX} are allowed")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not _LEGAL.fullmatch(name):
        bad = sorted(set(re.sub(r"[a-zA-Z0-9._-]", "", name)))
        raise InvalidTopicError(f"topic name {name!r} contains {''.join(bad)!r}; use only "
                                f"ASCII letters, digits, '.', '_' and '-'")
    return name
