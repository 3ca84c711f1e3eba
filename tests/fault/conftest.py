"""The fault tests' shared fixtures: a small disk of their own, and a broker's data
directory on it (the full-disk tests)."""

from __future__ import annotations

import pytest

from helpers import small_tmpfs, unlink_shared_memory

# A disk small enough to fill in a test, large enough for a broker's first segment.
TMPFS_SIZE = 16 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of TMPFS_SIZE mounted for the test (as root; skipped otherwise)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    with small_tmpfs(mount_point, TMPFS_SIZE):
        yield mount_point


@pytest.fixture
def data_dir(small_disk):
    """A broker's data directory on the small disk; its shared memory removed after."""
    path = str(small_disk / "data")
    yield path
    unlink_shared_memory(path)
