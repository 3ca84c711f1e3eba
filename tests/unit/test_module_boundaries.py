"""No module of shmlog uses another module's private names.

Goal: modules talk through public names only, so a module can change anything
private knowing only its own code (issue 13). A private name is one that starts
with a single underscore; dunder names (``__version__``) are not private.

Method: parse every ``.py`` file under ``shmlog/`` (no import, so nothing runs)
and report, with file and line,
1. ``from .x import _y`` (or ``from shmlog.x import _y``): a private name of
   another module imported;
2. ``x._y`` where ``x`` is a name the file bound by an import (``import x``,
   ``from . import x``, ``from .x import y``, any alias): a private attribute
   read off an imported module or object;
and checks that the scan finds both kinds in a sample that has them.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "shmlog"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(source: str, where: str) -> list[str]:
    """Every use of another module's private name in ``source``."""
    tree = ast.parse(source)
    imported = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{where}:{node.lineno}: from {'.' * node.level}"
                                 f"{node.module or ''} import {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and isinstance(node.value, ast.Name) and node.value.id in imported:
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_scan_finds_both_kinds_of_violation():
    sample = ("from .segments import _append, PartitionLog\n"
              "from . import records as R\n"
              "import os\n"
              "def f(ring):\n"
              "    return R._check_batch, os._exit, ring._head, PartitionLog._open\n")
    assert violations(sample, "sample") == [
        "sample:1: from .segments import _append",
        "sample:5: R._check_batch",
        "sample:5: os._exit",
        "sample:5: PartitionLog._open",
    ]
    assert violations("from .x import __version__\nimport y\ny.__doc__\n", "sample") == []


def test_no_module_uses_another_modules_private_names():
    files = sorted(PACKAGE.rglob("*.py"))
    assert files, f"no sources under {PACKAGE}"
    found = []
    for path in files:
        found += violations(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "private names used across modules:\n" + "\n".join(found)
