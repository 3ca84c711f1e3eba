"""The package's public face: ``import shmlog`` loads no numba nor numpy (its names are
imported on first use), yet every name of ``__all__`` is there, is the defining
module's object, and is listed by ``dir``; the light modules the clients and the
command import (paths, control client, broker config, limits) stay light.

Method: fresh interpreters (this test process has numba loaded already) report which
heavy modules an import loaded; the names are compared in-process.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import shmlog

HEAVY_MODULES = ("numba", "numpy", "llvmlite")
TIMEOUT_S = 120
REPORT_HEAVY = ("import json, sys; {statement}; print(json.dumps(sorted(name for name in "
                "sys.modules if name.split('.')[0] in {heavy!r})))")


def heavy_modules_after(statement: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", REPORT_HEAVY.format(
        statement=statement, heavy=HEAVY_MODULES)], capture_output=True, text=True,
        timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("statement", [
    "import shmlog", "from shmlog import ShmlogError, InvalidTopicError",
    "import shmlog.cli", "from shmlog import Admin",
    "import shmlog.paths, shmlog.control_client, shmlog.broker_config, shmlog.limits",
])
def test_light_imports_load_neither_numba_nor_numpy(statement):
    assert heavy_modules_after(statement) == []


def test_the_layout_limits_are_there_when_asked_for():
    # The limits that follow from the layouts are computed on first use.
    from shmlog import batch_layout, index_layout, limits
    from shmlog.limits import INDEX_SIZE_MIN
    assert limits.BATCH_SIZE_MIN == batch_layout.HEADER_LENGTH + batch_layout.RECORD_HEADER_LENGTH
    assert limits.SEGMENT_SIZE_MIN == limits.BATCH_SIZE_MIN
    assert limits.SEGMENT_SIZE_MAX == index_layout.POSITION_MAX
    assert INDEX_SIZE_MIN == 4 * index_layout.TIME_ENTRY_LENGTH
    with pytest.raises(AttributeError):
        limits.NO_SUCH_LIMIT


@pytest.mark.parametrize("name", shmlog.__all__)
def test_every_public_name_is_the_defining_modules_object(name):
    value = getattr(shmlog, name)
    assert getattr(importlib.import_module(value.__module__), value.__name__) is value
    assert name in dir(shmlog)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        shmlog.no_such_name
    with pytest.raises(ImportError):
        exec("from shmlog import no_such_name", {})
