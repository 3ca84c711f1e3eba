"""Documented settings: the field maker of the settings registries.

:class:`~shmlog.config.broker.BrokerConfig` and
:class:`~shmlog.config.cluster.ClusterConfig` declare every setting with
:func:`setting`, which keeps its description in the dataclass field's metadata,
where ``shmlog broker --help`` and the configuration reference
(``python -m shmlog.config.docs``, docs/CONFIGURATION.md) read it with
:func:`doc_of`. The topic settings keep theirs in ``config.ConfigKey.doc``.

Rules: every field of a registry has a description (:func:`doc_of` refuses one
without), written for an operator: what the setting does, its unit, and Kafka's
name when Kafka has the setting. Light: the standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["setting", "doc_of"]

_DOC = "doc"


def setting(default: Any = dataclasses.MISSING, *, doc: str,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its description ``doc`` (no default: a required setting)."""
    assert doc.strip(), "a setting needs a description"
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={_DOC: doc})


def doc_of(field: dataclasses.Field) -> str:
    """The description :func:`setting` gave ``field`` (a field declared without one is
    a registry's programmer error, which the configuration reference's test reports
    by name)."""
    doc = field.metadata.get(_DOC)
    assert doc, (f"setting {field.name} has no description: declare it with "
                 f"shmlog.common.documented.setting(default, doc=...)")
    return doc
