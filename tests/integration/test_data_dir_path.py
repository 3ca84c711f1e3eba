"""A root broker cannot be pointed at someone else's files: the path to its data
directory must be one nobody else can change (as sshd's ``StrictModes`` wants a
home directory's), and it changes the modes only of what is its own.

Method: root runs a real broker (``python -m shmlog broker`` where the start must
fail, ``shmlog.Broker`` where it must serve) on paths under a fresh root-owned
directory in /tmp; the other user is ``nobody``: what it plants (a symbolic link, a
directory of its own, a file in the data directory) is made by a child process
that drops to its uid first (``preexec_fn``), as that user would. A refused start
must exit with status 1 and the typed error's message, and leave the victim's
modes and contents as they were. Needs root (to become another user); skipped
otherwise. Every wait is bounded; brokers are stopped and the shared memory and
directories removed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from helpers import nobody, unlink_shared_memory
from shmlog.common.errors import UnsafeDataDirectoryError
from shmlog.server.broker import Broker
from shmlog.storage.log_manager import LogManager

DEADLINE_S = 60

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="planting files as another user (nobody) needs root")


@pytest.fixture
def base():
    """A fresh directory in /tmp of root's that only root writes (0755)."""
    path = tempfile.mkdtemp(prefix="shmlog-path-", dir="/tmp")
    os.chmod(path, 0o755)
    data_dirs: list[str] = []
    yield path, data_dirs
    for data_dir in data_dirs:
        unlink_shared_memory(data_dir)
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*command: str) -> None:
    """Run ``command`` as nobody (the child drops root before it execs)."""
    uid, gid = nobody()

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    subprocess.run(command, preexec_fn=drop, check=True, timeout=DEADLINE_S)


def start_failing(data_dir: str) -> str:
    """Start a broker that must refuse to run; its error output."""
    started = subprocess.run([sys.executable, "-m", "shmlog", "broker", "--data-dir", data_dir],
                             capture_output=True, text=True, timeout=DEADLINE_S)
    assert started.returncode == 1, started.stderr
    return started.stderr


def sticky_directory(root: str, name: str) -> str:
    """A root-owned directory everyone may write, with the sticky bit (as /tmp)."""
    path = os.path.join(root, name)
    os.mkdir(path)
    os.chmod(path, 0o1777)
    return path


def snapshot(tree: str) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry below ``tree``: (mode, owner, contents of a file)."""
    found = {}
    for directory, directories, files in os.walk(tree):
        for name in directories + files:
            path = os.path.join(directory, name)
            status = os.lstat(path)
            contents = None
            if stat.S_ISREG(status.st_mode):
                with open(path, "rb") as source:
                    contents = source.read()
            found[os.path.relpath(path, tree)] = (status.st_mode, status.st_uid, contents)
    return found


def victim_directory(root: str) -> str:
    """A root-owned directory of ordinary modes: files 0644, directories 0755."""
    victim = os.path.join(root, "victim")
    os.makedirs(os.path.join(victim, "conf.d"))
    for path, text in (("passwd", "root:x:0:0\n"), ("conf.d/site.conf", "keep = me\n")):
        with open(os.path.join(victim, path), "w") as target:
            target.write(text)
        os.chmod(os.path.join(victim, path), 0o644)
    os.chmod(victim, 0o755)
    os.chmod(os.path.join(victim, "conf.d"), 0o755)
    return victim


def test_a_data_directory_that_is_a_planted_symlink_is_refused_and_its_target_untouched(base):
    root, data_dirs = base
    victim = victim_directory(root)
    before = snapshot(victim)
    shared = sticky_directory(root, "shared")
    data_dir = os.path.join(shared, "data")
    data_dirs.append(data_dir)
    as_nobody("ln", "-s", victim, data_dir)

    error = start_failing(data_dir)
    assert f"{data_dir} is a symbolic link (to {victim}, of nobody" in error, error
    with pytest.raises(UnsafeDataDirectoryError, match="is a symbolic link"):
        LogManager(data_dir)
    assert snapshot(victim) == before, "the victim's modes and contents are unchanged"
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o755


def test_a_data_directory_under_a_symlink_is_refused(base):
    root, data_dirs = base
    real = os.path.join(root, "real")
    os.mkdir(real, 0o755)
    os.symlink(real, os.path.join(root, "link"))
    data_dir = os.path.join(root, "link", "data")
    data_dirs.append(data_dir)
    with pytest.raises(UnsafeDataDirectoryError, match=f"{root}/link is a symbolic link"):
        LogManager(data_dir)
    assert os.listdir(real) == [], "nothing was made through the link"


def test_a_data_directory_under_another_users_directory_is_refused(base):
    root, data_dirs = base
    shared = sticky_directory(root, "shared")
    home = os.path.join(shared, "home")
    as_nobody("mkdir", "-m", "755", home)
    data_dir = os.path.join(home, "data")
    data_dirs.append(data_dir)

    error = start_failing(data_dir)
    assert f"{home} belongs to nobody" in error, error
    assert os.listdir(home) == [], "the broker made nothing there"


def test_a_data_directory_under_a_world_writable_directory_needs_its_sticky_bit(base):
    root, data_dirs = base
    open_to_all = os.path.join(root, "open")
    os.mkdir(open_to_all)
    os.chmod(open_to_all, 0o777)
    data_dir = os.path.join(open_to_all, "data")
    data_dirs.append(data_dir)

    error = start_failing(data_dir)
    assert f"{open_to_all} is writable by others (mode 777) without the sticky bit" in error
    assert os.listdir(open_to_all) == []

    os.chmod(open_to_all, 0o1777)           # as /tmp: nobody may replace root's entries
    with Broker(data_dir) as broker:
        assert broker.process.poll() is None
        assert broker.stop() == 0
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700


def test_a_data_directory_on_a_safe_path_serves_and_only_its_own_files_change_mode(base):
    root, data_dirs = base
    victim = victim_directory(root)
    data_dir = os.path.join(root, "data")
    data_dirs.append(data_dir)
    os.mkdir(data_dir, 0o755)               # wider than the broker's: it will narrow it
    theirs = os.path.join(data_dir, "theirs.txt")
    with open(theirs, "w") as target:
        target.write("nobody's\n")
    os.chmod(theirs, 0o644)
    os.chown(theirs, *nobody())
    os.symlink(os.path.join(victim, "passwd"), os.path.join(data_dir, "link"))
    before = snapshot(victim)

    with Broker(data_dir) as broker:
        assert broker.process.poll() is None
        assert broker.stop() == 0
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(data_dir, "broker.lock")).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(theirs).st_mode) == 0o644, "another user's file is left"
    assert snapshot(victim) == before, "nothing is changed through a link"
