"""docs/CONFIGURATION.md is what ``python -m shmlog.config.docs`` generates from the
settings registries, and every setting of every registry is described.

Method: render the reference in-process and compare it with the committed file;
run the module as the file's opening comment says to, as a subprocess; check that
each registry's settings appear by name, so none drops out of the reference.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from shmlog.common.documented import doc_of
from shmlog.config import docs as config_docs
from shmlog.config.broker import BrokerConfig
from shmlog.config.cluster import KAFKA_NAMES, ClusterConfig
from shmlog.storage import topic_config as config

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md"


def test_the_committed_reference_is_what_the_tool_generates():
    assert REFERENCE.read_text() == config_docs.render(), (
        f"docs/CONFIGURATION.md is out of date: run {config_docs.COMMAND}")


def test_the_tool_prints_the_reference():
    printed = subprocess.run([sys.executable, "-m", "shmlog.config.docs"],
                             capture_output=True, text=True, timeout=60, check=True)
    assert printed.stdout == config_docs.render()


def test_every_setting_is_described_and_listed():
    reference = config_docs.render()
    for key in config.KEYS.values():
        assert key.doc and f"`{key.name}`" in reference
        assert config.accepted_values(key)
    for field in dataclasses.fields(BrokerConfig):
        assert doc_of(field) and f"`{field.name}`" in reference
    for field in dataclasses.fields(ClusterConfig):
        assert doc_of(field) and f"`{KAFKA_NAMES[field.name]}`" in reference

