"""A broker on a host shared with other users: its data is private by default (or
shared with one configured group), it never writes through a planted symbolic link
nor into a directory another user owns, it cannot be kept from starting by another
user's shared-memory object, and a client refused by the control socket's
permissions is told so at once (as is one that finds no control socket, while a
group join still waits out a broker restart).

Method: real brokers (``shmlog.Broker`` child processes, or ``python -m shmlog
broker`` where the start must fail) on data directories under a fresh directory in
/tmp that every user may traverse. The other user is ``nobody``: the test forks and
the child drops to that uid (and, where it matters, into the shared group) before it
acts, so it runs the same code as any client would. Modes are read with ``os.stat``
after a producer wrote, a segment rolled and a topic's config changed. Needs root
(to become another user); skipped otherwise. Every wait is bounded; brokers are
stopped and the shared memory and directories removed.
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import pickle
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

import posix_ipc
import pytest

from helpers import nobody, unlink_shared_memory
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer
from shmlog.client.group_member import GroupMember, MemberConfig
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    BrokerAccessDeniedError,
    BrokerNotRunningError,
    NotOwnedError,
    ShmlogError,
)
from shmlog.server.broker import Broker, request, shared_memory_prefix
from shmlog.shm import shared_memory
from shmlog.shm import state_layout as S
from shmlog.shm.state import PartitionStateTable, bells_name
from shmlog.storage.log_manager import LogManager

DEADLINE_S = 60
SHM = "/dev/shm"
GROUP = "users"                 # a group the broker shares with; nobody is not in it

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="becoming another user (nobody) needs root")


@pytest.fixture
def data_dir():
    base = tempfile.mkdtemp(prefix="shmlog-host-", dir="/tmp")
    os.chmod(base, 0o711)               # others may traverse to the data directory
    path = os.path.join(base, "data")
    yield path
    unlink_shared_memory(path)
    shutil.rmtree(base, ignore_errors=True)


def _group_id() -> int:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        pytest.skip(f"this host has no group {GROUP!r}")


def as_nobody(action, *, groups=()):
    """What ``action()`` returns, or the exception it raises, when run in a child
    process as user nobody (with supplementary ``groups``)."""
    uid, gid = nobody()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: never returns
        try:
            os.close(reader)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            try:
                outcome = ("returned", action())
            except Exception as error:              # noqa: BLE001 - handed to the parent
                outcome = ("raised", error)
            os.write(writer, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(writer)
    try:
        chunks = []
        while True:
            ready, _, _ = select.select([reader], [], [], DEADLINE_S)
            assert ready, "the child running as nobody did not answer"
            chunk = os.read(reader, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(reader)
        os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "raised":
        raise value
    return value


def _produce(data_dir: str, ring_mode: int) -> None:
    """A topic that rolls segments, written by a producer (whose ring has
    ``ring_mode``), its config changed."""
    admin = Admin(data_dir)
    admin.create_topic("t", 2, {"segment.bytes": 4096})
    with Producer(data_dir) as producer:
        ring_name = producer.ring.name
        for number in range(200):
            producer.send("t", b"x" * 100, partition=number % 2)
        producer.flush(timeout=DEADLINE_S)
        assert _mode(os.path.join(SHM, ring_name)) == ring_mode
    admin.alter_topic_config("t", {"retention.ms": 3_600_000})


def control_path(data_dir: str) -> str:
    return os.path.join(data_dir, "run", "control.sock")


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _tree(data_dir: str):
    """(path, status) of everything under the data directory, itself included."""
    yield data_dir, os.lstat(data_dir)
    for root, directories, files in os.walk(data_dir):
        for name in directories + files:
            path = os.path.join(root, name)
            yield path, os.lstat(path)


def test_the_data_is_private_by_default(data_dir):
    with Broker(data_dir) as broker:
        _produce(data_dir, 0o600)
        prefix = shared_memory_prefix(data_dir)
        assert _mode(os.path.join(SHM, prefix + "-state")) == 0o600
        assert _mode(os.path.join(SHM, bells_name(prefix + "-state"))) == 0o600
        assert _mode(control_path(data_dir)) == 0o600
        assert _mode(os.path.dirname(control_path(data_dir))) == 0o700
        assert broker.stop() == 0
    files = 0
    for path, status in _tree(data_dir):
        if stat.S_ISDIR(status.st_mode):
            assert stat.S_IMODE(status.st_mode) == 0o700, path
        else:
            files += 1
            assert stat.S_IMODE(status.st_mode) == 0o600, path
    assert files > 10            # segments, indexes, checkpoints, topic.json, the lock, ...


def _assert_shared_with(data_dir, group_id) -> None:
    """Every directory below ``data_dir`` is 2750 and every file 0640, the group's."""
    for path, status in _tree(data_dir):
        if path == control_path(data_dir):
            continue
        assert status.st_gid == group_id, path
        expected = 0o2750 if stat.S_ISDIR(status.st_mode) else 0o640
        assert stat.S_IMODE(status.st_mode) == expected, path


def test_a_data_group_shares_the_data_with_that_group_only(data_dir):
    group_id = _group_id()
    with Broker(data_dir, data_group=GROUP) as broker:
        _produce(data_dir, 0o660)
        table = shared_memory_prefix(data_dir) + "-state"
        # The group reads the table and writes only its doorbells (issue 27, row 2).
        table_status = os.stat(os.path.join(SHM, table))
        assert (stat.S_IMODE(table_status.st_mode), table_status.st_gid) == (0o640, group_id)
        bells_status = os.stat(os.path.join(SHM, bells_name(table)))
        assert (stat.S_IMODE(bells_status.st_mode), bells_status.st_gid) == (0o660, group_id)
        socket_status = os.stat(control_path(data_dir))
        assert (stat.S_IMODE(socket_status.st_mode), socket_status.st_gid) == (0o660, group_id)
        _assert_shared_with(data_dir, group_id)
        segment = os.path.join(data_dir, "topics", "t", "0", "00000000000000000000.log")

        def member():
            with open(segment, "rb") as source:
                first = source.read(8)
            with PartitionStateTable.attach(table):
                pass
            return Admin(data_dir).list_topics(), len(first)

        assert as_nobody(member, groups=[group_id]) == (["t"], 8)
        with pytest.raises(BrokerAccessDeniedError, match="permission denied"):
            as_nobody(lambda: Admin(data_dir).list_topics())
        with pytest.raises(PermissionError):
            as_nobody(lambda: open(segment, "rb"))
        assert broker.stop() == 0


def test_a_data_group_member_can_write_only_the_doorbells(data_dir):
    """A member of the data group maps the state table read-only: opening it for
    writing is EACCES. What it may write, the doorbells, it fills with garbage, and
    a consumer of another user (this process) still reads every record (issue 27,
    row 2)."""
    _group_id()
    with Broker(data_dir, data_group=GROUP) as broker:
        Admin(data_dir).create_topic("t")
        table = shared_memory_prefix(data_dir) + "-state"
        with Producer(data_dir) as producer:
            producer.send("t", b"before", partition=0).get(timeout=DEADLINE_S)

        def member():
            try:
                os.close(os.open(os.path.join(SHM, table), os.O_RDWR))
                refused = 0
            except PermissionError as error:
                refused = error.errno
            with PartitionStateTable.attach(table) as attached:
                read_only = not attached.rows.flags.writeable
                for word, value in ((S.APPENDER_SEQUENCE_WORD, 2**63 - 1),
                                    (S.APPENDER_SLEEPERS_WORD, -2**63),
                                    (S.CONSUMER_SEQUENCE_WORD, -1),
                                    (S.CONSUMER_SLEEPERS_WORD, -2**63)):
                    attached.bells[word] = value
            return refused, read_only

        assert as_nobody(member, groups=[_group_id()]) == (errno.EACCES, True)
        with Producer(data_dir) as producer:
            producer.send("t", b"after", partition=0).get(timeout=DEADLINE_S)
        with Consumer("t", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            values = []
            deadline = time.monotonic() + DEADLINE_S
            while len(values) < 2 and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=50).values():
                    values += [record.value for record in records]
        assert values == [b"before", b"after"]
        assert broker.stop() == 0


def test_data_written_while_private_is_shared_once_a_group_is_configured(data_dir):
    group_id = _group_id()
    with Broker(data_dir) as broker:
        _produce(data_dir, 0o600)
        assert broker.stop() == 0
    with Broker(data_dir, data_group=GROUP) as broker:
        _assert_shared_with(data_dir, group_id)
        assert broker.stop() == 0
    with Broker(data_dir) as broker:         # and private again
        assert broker.stop() == 0
    assert _mode(data_dir) == 0o700


def test_a_client_without_permission_is_told_at_once(data_dir):
    with Broker(data_dir):
        with pytest.raises(BrokerAccessDeniedError, match="may not connect"):
            # The wait it is given is never used: the socket's permissions answer.
            as_nobody(lambda: request(data_dir, "ping", timeout_ms=30_000))


def test_no_control_socket_fails_at_once_naming_the_command(data_dir):
    with pytest.raises(BrokerNotRunningError) as refused:
        request(data_dir, "ping", timeout_ms=30_000)
    assert "there is no control socket" in str(refused.value)
    assert f"start one with: shmlog broker --data-dir {data_dir}" in str(refused.value)


def _start_failing(data_dir: str) -> str:
    """Start a broker that must refuse to run; its error output."""
    started = subprocess.run([sys.executable, "-m", "shmlog", "broker", "--data-dir", data_dir],
                             capture_output=True, text=True, timeout=DEADLINE_S)
    assert started.returncode == 1, started.stderr
    return started.stderr


def test_a_squatted_shared_memory_name_is_refused_naming_it(data_dir):
    table = shared_memory_prefix(data_dir) + "-state"
    as_nobody(lambda: posix_ipc.SharedMemory("/" + table, posix_ipc.O_CREX, mode=0o644,
                                             size=4096).close_fd())
    try:
        error = _start_failing(data_dir)
        assert f"{table!r} is taken by an object of nobody" in error
        assert f"rm /dev/shm/{table}" in error
        assert os.stat(os.path.join(SHM, table)).st_uid == nobody()[0]
    finally:
        shared_memory.unlink(table)
    with Broker(data_dir) as broker:        # with the object gone, it starts
        assert broker.stop() == 0


def test_a_stale_state_table_of_our_own_is_replaced(data_dir):
    table = shared_memory_prefix(data_dir) + "-state"
    posix_ipc.SharedMemory("/" + table, posix_ipc.O_CREX, mode=0o600, size=4096).close_fd()
    with Broker(data_dir) as broker:
        assert os.stat(os.path.join(SHM, table)).st_size > 4096
        assert broker.stop() == 0


def test_a_data_directory_of_another_user_is_refused(data_dir):
    os.makedirs(data_dir)
    os.chown(data_dir, *nobody())
    error = _start_failing(data_dir)
    assert f"data directory {data_dir} belongs to nobody" in error
    with pytest.raises(NotOwnedError, match="belongs to nobody"):
        LogManager(data_dir)
    assert os.listdir(data_dir) == []


def test_a_planted_lock_symlink_is_never_followed(data_dir, tmp_path):
    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    os.makedirs(data_dir)
    os.symlink(victim, os.path.join(data_dir, "broker.lock"))
    with pytest.raises(NotOwnedError, match="is a symbolic link"):
        LogManager(data_dir)
    assert victim.read_text() == "keep me\n"
    assert "symbolic link" in _start_failing(data_dir)
    assert victim.read_text() == "keep me\n"


def test_a_lock_file_of_another_user_is_refused(data_dir):
    os.makedirs(data_dir)
    lock = os.path.join(data_dir, "broker.lock")
    with open(lock, "w") as planted:
        planted.write("not yours\n")
    os.chown(lock, *nobody())
    with pytest.raises(NotOwnedError, match="belongs to nobody"):
        LogManager(data_dir)
    with open(lock) as planted:
        assert planted.read() == "not yours\n"


def test_an_unknown_data_group_is_refused():
    with pytest.raises(ShmlogError, match="data_group names no group"):
        Broker("/tmp/unused", data_group="no-such-group-here")


def test_a_group_join_waits_out_a_broker_restart(data_dir):
    """A missing control socket fails at once: a join that finds no broker must pause
    between its attempts, or it gives up before a restarting broker is back."""
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t")
        assert broker.stop() == 0                # cleanly: no control socket is left
    member = GroupMember(functools.partial(request, data_dir), "g", "c", MemberConfig())
    outcome = {}

    def join():
        try:
            outcome["assignment"] = member.join(["t"], None, ())
        except ShmlogError as error:
            outcome["error"] = error

    joining = threading.Thread(target=join, daemon=True)
    joining.start()
    try:
        with Broker(data_dir, group_initial_rebalance_delay_ms=0) as broker:
            joining.join(timeout=DEADLINE_S)
            assert not joining.is_alive(), "the join never ended"
            assert outcome == {"assignment": [("t", 0)]}
            member.close()
            assert broker.stop() == 0
    finally:
        member.close()
