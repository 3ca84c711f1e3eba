"""Shared fixtures (small partition logs in temporary directories, a broker's data
directory whose shared memory is removed afterwards, one local ZooKeeper per session)
and options."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import uuid

import pytest
from kazoo.client import KazooClient

from helpers import unlink_shared_memory
from shmlog.devtools.zookeeper import ZooKeeperServer
from shmlog.segments import PartitionLog
from shmlog.shm import shared_memory
from shmlog.storage.topic_config import TopicConfig

# How long the chroot's clean-up waits for a ZooKeeper session.
ZOOKEEPER_CLEAN_UP_TIMEOUT_S = 30.0

# Cluster tests want sessions that expire in seconds, not ZooKeeper's 4 to 40.
ZOOKEEPER_TICK_TIME_MS = 500


@pytest.fixture
def open_log(tmp_path):
    """``open_log(**overrides)`` opens (or reopens) the partition log in tmp_path
    with Kafka-named config overrides, e.g. ``open_log(**{"segment.bytes": 4096})``;
    every log opened is closed at teardown."""
    opened = []

    def opener(directory=None, **overrides):
        config = TopicConfig.from_overrides(overrides)
        partition_log = PartitionLog(str(directory or tmp_path / "partition"), config)
        opened.append(partition_log)
        return partition_log

    yield opener
    for partition_log in opened:
        if partition_log._segments:
            partition_log.close()


@pytest.fixture
def data_dir(tmp_path):
    """A data directory for a test's brokers; the /dev/shm objects named under its
    prefix are removed at teardown (a broker killed by the test leaves them)."""
    path = str(tmp_path / "data")
    yield path
    unlink_shared_memory(path)


@pytest.fixture
def clean_data_dir(tmp_path):
    """:func:`data_dir` for tests whose brokers and producers all end cleanly: that
    they left nothing in /dev/shm is checked (and then removed anyway)."""
    path = str(tmp_path / "data")
    yield path
    leftovers = unlink_shared_memory(path)
    assert not leftovers, f"left in /dev/shm: {leftovers}"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """One local ZooKeeper (:class:`ZooKeeperServer`, tickTime 500 ms, a free port) for
    the whole session: started by the first test that asks for it (its JVM takes a
    second or two), stopped when the session ends. Tests share it: each works under
    znode paths of its own."""
    with ZooKeeperServer(str(tmp_path_factory.mktemp("zookeeper")),
                         tick_time_ms=ZOOKEEPER_TICK_TIME_MS) as server:
        yield server


@pytest.fixture
def hosts(zookeeper):
    """A ``zookeeper.connect`` string with a chroot of this test's own in the session's
    ZooKeeper (removed after)."""
    chroot = f"/t-{uuid.uuid4().hex}"
    yield zookeeper.connect_string + chroot
    cleaner = KazooClient(hosts=zookeeper.connect_string)
    cleaner.start(timeout=ZOOKEEPER_CLEAN_UP_TIMEOUT_S)
    cleaner.delete(chroot, recursive=True)
    cleaner.stop()
    cleaner.close()


@pytest.fixture
def short_tmp_path():
    """A temporary directory with a short path (/tmp/shmlog-t-...), removed after, for
    tests whose brokers' control sockets lie deep inside it: an AF_UNIX path holds at
    most 107 bytes, and pytest's ``tmp_path`` is long (longer still on an xdist
    worker: ``popen-gw1/``)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="shmlog-t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def no_shared_memory_left():
    """Fail a module whose tests leave shared memory named for this pytest process
    (``shmlog-test-<pid>-...``, the names tests make for their rings and tables)."""
    prefix = f"shmlog-test-{os.getpid()}-"
    before = set(shared_memory.names(prefix))
    yield
    left = sorted(set(shared_memory.names(prefix)) - before)
    for name in left:
        shared_memory.unlink(name)
    if left:
        pytest.fail(f"this module left {len(left)} shared memory objects: {left[:5]}")


# Test directories whose files share package- or session-wide fixtures that are
# costly to start twice (a cluster, a Spark session): one xdist worker runs them all.
SHARED_GROUPS = ("cluster", "spark")


def pytest_collection_modifyitems(config, items):
    """Group the tests for ``pytest -n N --dist loadgroup`` (``make test``): a file's
    tests run on one worker (its module fixtures start once), and so do all of
    tests/cluster and all of tests/spark."""
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        shared = len(parts) > 2 and parts[1] in SHARED_GROUPS
        item.add_marker(pytest.mark.xdist_group(parts[1] if shared else "/".join(parts)))


def pytest_addoption(parser):
    parser.addoption("--fault-runs", type=int, default=16, metavar="N",
                     help="how many times tests/fault/test_full_disk.py fills a disk "
                          "(16 by default; more for a soak run)")
    parser.addoption("--cluster-kills", type=int, default=3, metavar="N",
                     help="how many times tests/cluster/test_kill_leader.py kills a "
                          "partition's leader (3 by default; more for a soak run)")
