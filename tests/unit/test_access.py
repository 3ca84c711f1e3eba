"""Every file and directory the storage makes has the mode ``access`` decides, by an
explicit mode at creation, not by luck of the umask: private (0700/0600) by default,
0750/0640 and the group's gid once a group shares the data.

Method: a LogManager in this process, under the permissive umask 022, makes a
compacted topic, appends, rolls, compacts (the cleaner's files and swap manifest),
checkpoints and closes; then every entry under the data directory is stat'ed.
"""

from __future__ import annotations

import grp
import os
import stat

import pytest

from helpers import values_batch
from shmlog.common import access
from shmlog.storage import cleaner
from shmlog.storage.log_manager import LogManager

NOW = 1_700_000_000_000
GROUP = "users"


@pytest.fixture
def policy():
    """``policy(access)`` adopts it under umask 022; the old policy and umask come back."""
    previous = access.current()
    umask = os.umask(0o022)

    def adopt(chosen: access.Access) -> None:
        access.adopt(chosen)
        os.umask(0o022)               # only explicit modes may narrow what is made

    yield adopt
    access.adopt(previous)
    os.umask(umask)


def _write_everything(data_dir: str) -> None:
    with LogManager(data_dir) as logs:
        logs.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": 4096,
                                   "min.cleanable.dirty.ratio": 0.01})
        partition_log = logs.partition_log("t", 0)
        for seed in range(30):
            partition_log.append(values_batch(5, seed, timestamps=[NOW] * 5))
        partition_log.roll()
        planned = cleaner.plan(partition_log, NOW + 1000)
        assert planned is not None
        assert partition_log.replace_segments(cleaner.clean(planned, NOW + 1000, 1 << 20))
        logs.alter_topic_config("t", {"retention.ms": 3_600_000})
        logs.flush()


def _entries(data_dir: str):
    yield data_dir, os.lstat(data_dir)
    for root, directories, files in os.walk(data_dir):
        for name in directories + files:
            yield os.path.join(root, name), os.lstat(os.path.join(root, name))


def test_storage_makes_private_files_by_default(tmp_path, policy):
    policy(access.Access())
    data_dir = str(tmp_path / "data")
    _write_everything(data_dir)
    files = 0
    for path, status in _entries(data_dir):
        if stat.S_ISDIR(status.st_mode):
            assert stat.S_IMODE(status.st_mode) == 0o700, path
        else:
            files += 1
            assert stat.S_IMODE(status.st_mode) == 0o600, path
    assert files >= 8               # lock, topic.json, logs, indexes, checkpoint, ...


def test_storage_makes_group_readable_files_for_a_data_group(tmp_path, policy):
    if os.geteuid() != 0:
        pytest.skip("giving files a group this user may not be in needs root")
    try:
        group_id = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        pytest.skip(f"this host has no group {GROUP!r}")
    policy(access.Access(group_id))
    data_dir = str(tmp_path / "data")
    _write_everything(data_dir)
    for path, status in _entries(data_dir):
        assert status.st_gid == group_id, path
        expected = 0o2750 if stat.S_ISDIR(status.st_mode) else 0o640
        assert stat.S_IMODE(status.st_mode) == expected, path
