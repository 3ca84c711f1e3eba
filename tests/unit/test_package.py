"""The package's public face: ``import shmlog`` loads no numba nor numpy (its names are
imported on first use), yet every name of ``__all__`` is there, is the defining
module's object, and is listed by ``dir``; the light modules the clients and the
command import (paths, control client, broker config, limits, the local ZooKeeper)
stay light; and the clients load none of the broker's side: importing the producer
loads neither the broker, the appender, the log (log manager, segments, cleaner) nor any of
the group code, importing the consumer neither the broker, the appender, the log manager,
the cleaner, nor the group coordinator and its offsets manager (it reads segments in place
and is a group member: it loads the member and the protocol it shares, ``groups``), nor
any of the log's writer side (the partition log, its segments, loader, validator,
retention and append kernels): it loads only the read path.

Method: fresh interpreters (this test process has numba loaded already) report which
heavy modules, or which of the broker's modules, an import loaded; the names are
compared in-process, as are the shared constants the broker's side imports back
from the light modules the clients load.
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
REPORT_LOADED = ("import json, sys; {statement}; print(json.dumps(sorted(name for name in "
                 "sys.modules if name in {modules!r})))")
# The broker's side of the data path. A consumer reads segments in place (their
# reading kernels live in storage.segment_read) and is a group member (its group work,
# the member, and the protocol it shares with the coordinator in groups.py); a producer
# needs neither. The log's writer side is the broker's alone.
BROKER_SIDE = ("shmlog.server.broker", "shmlog.broker.appender", "shmlog.storage.log_manager",
               "shmlog.storage.cleaner")
READ_SIDE = ("shmlog.storage.segment_read", "shmlog.groups", "shmlog.client.group_member",
             "shmlog.client.consumer_coordinator")
WRITER_SIDE = ("shmlog.segments", "shmlog.storage.log_segment", "shmlog.storage.local_log",
               "shmlog.storage.log_loader", "shmlog.storage.log_validator",
               "shmlog.storage.log_retention", "shmlog.storage.segment_append",
               "shmlog.storage.transaction_index")
# The group coordinator's side, the broker's: no client loads it.
GROUP_COORDINATOR = ("shmlog.broker.group_coordinator", "shmlog.broker.group_offsets",
                     "shmlog.broker.group_metadata")


def heavy_modules_after(statement: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", REPORT_HEAVY.format(
        statement=statement, heavy=HEAVY_MODULES)], capture_output=True, text=True,
        timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("statement", [
    "import shmlog", "from shmlog import ShmlogError, InvalidTopicError",
    "import shmlog.cli", "from shmlog import Admin",
    "import shmlog.common.paths, shmlog.protocol.control_client, shmlog.config.broker, "
    "shmlog.common.limits",
    # The import system asks a module imported from for __path__: not a layout limit.
    "from shmlog.common.limits import OFFSET_MAX",
    "import shmlog.devtools.zookeeper",
])
def test_light_imports_load_neither_numba_nor_numpy(statement):
    assert heavy_modules_after(statement) == []


def modules_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after ``statement``."""
    done = subprocess.run([sys.executable, "-c", REPORT_LOADED.format(
        statement=statement, modules=modules)], capture_output=True, text=True,
        timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("statement",
                         ["import shmlog.client.producer", "from shmlog import Producer"])
def test_the_producer_loads_neither_the_broker_the_log_nor_the_coordinator(statement):
    assert modules_after(statement, BROKER_SIDE + READ_SIDE + WRITER_SIDE) == []
    assert modules_after(statement, GROUP_COORDINATOR) == []


@pytest.mark.parametrize("statement",
                         ["import shmlog.client.consumer", "from shmlog import Consumer"])
def test_the_consumer_loads_neither_the_broker_the_appender_nor_the_log_manager(statement):
    assert modules_after(statement, BROKER_SIDE) == []


@pytest.mark.parametrize("statement",
                         ["import shmlog.client.consumer", "from shmlog import Consumer"])
def test_the_consumer_loads_the_read_path_and_none_of_the_logs_writer(statement):
    read_path = "shmlog.storage.segment_read"
    assert modules_after(statement, (read_path,) + WRITER_SIDE) == [read_path]


@pytest.mark.parametrize("statement",
                         ["import shmlog.client.consumer", "from shmlog import Consumer"])
def test_the_consumer_loads_neither_the_group_coordinator_nor_its_offsets_manager(statement):
    assert modules_after(statement, GROUP_COORDINATOR) == []
    assert modules_after(statement, ("shmlog.groups", "shmlog.client.group_member")) == \
        ["shmlog.client.group_member", "shmlog.groups"], "it is a group member"


def test_the_broker_loads_the_group_coordinator_the_clients_do_not():
    # The names above are the coordinator's modules: the broker's group service loads them.
    assert modules_after("import shmlog.broker.group_service", GROUP_COORDINATOR) == \
        sorted(GROUP_COORDINATOR)


def test_the_broker_side_uses_the_codes_and_topics_the_clients_read():
    from shmlog import groups
    from shmlog.broker import appender
    from shmlog.common import internal_topics
    from shmlog.shm import completion
    assert appender.CompletionCode is completion.CompletionCode
    assert appender.SEQUENCE_MODULUS == completion.SEQUENCE_MODULUS
    assert groups.INTERNAL_TOPICS is internal_topics.INTERNAL_TOPICS
    assert groups.OFFSETS_TOPIC == internal_topics.OFFSETS_TOPIC == "__consumer_offsets"


def test_the_layout_limits_are_there_when_asked_for():
    # The limits that follow from the layouts are stated in limits and checked by the layouts.
    from shmlog.common import limits
    from shmlog.common.limits import INDEX_SIZE_MIN
    from shmlog.record import batch_layout
    from shmlog.storage import index_layout
    assert limits.BATCH_SIZE_MIN == batch_layout.HEADER_LENGTH + batch_layout.RECORD_HEADER_LENGTH
    assert limits.SEGMENT_SIZE_MIN == limits.BATCH_SIZE_MIN
    assert limits.SEGMENT_SIZE_MAX == index_layout.POSITION_MAX
    assert INDEX_SIZE_MIN == 4 * index_layout.TIME_ENTRY_LENGTH
    with pytest.raises(AttributeError):
        limits.NO_SUCH_LIMIT  # noqa: B018 - the read is the test


@pytest.mark.parametrize("name", shmlog.__all__)
def test_every_public_name_is_the_defining_modules_object(name):
    value = getattr(shmlog, name)
    assert getattr(importlib.import_module(value.__module__), value.__name__) is value
    assert name in dir(shmlog)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        shmlog.no_such_name  # noqa: B018 - the read is the test
    with pytest.raises(ImportError):
        exec("from shmlog import no_such_name", {})
