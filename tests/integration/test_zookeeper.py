"""The local ZooKeeper (``shmlog.devtools.zookeeper``, ``shmlog zookeeper``) serves what cluster
mode will ask of it: kazoo sessions, ephemeral znodes that go with their session,
versioned conditional writes and multi-op transactions with a version check (how a
deposed controller is fenced); its files are private, it listens on its client port
on loopback and nowhere else (no AdminServer on :8080), a stop leaves no JVM, a
restart on the same directory keeps the znodes, a port picked for it but taken
before the JVM binds it is given up for another, and it refuses to start where its
port is taken, its data directory is a symbolic link, java or pyspark is missing.

The ``shmlog zookeeper`` command serves until SIGTERM or SIGINT (even started with
SIGINT ignored, as a shell starts a background command), and fails when its JVM dies.

Method: a real ZooKeeper 3.9 JVM from PySpark's jars (the session's ``zookeeper``
fixture, or one of the test's own where the test stops it) and real kazoo clients.
What the JVM listens on is read from /proc (its socket inodes against
/proc/<pid>/net/tcp*). The command is run as a subprocess and signalled. Every wait
is bounded. The start time is printed (run with ``-s``), never asserted.
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError

from shmlog.cli import zookeeper as zookeeper_command
from shmlog.common import limits
from shmlog.common.errors import (
    InvalidConfigError,
    NotOwnedError,
    ZooKeeperStartError,
    ZooKeeperUnavailableError,
)
from shmlog.devtools import zookeeper as zookeeper_module
from shmlog.devtools.zookeeper import CONFIG_FILE, ZooKeeperServer, java_executable

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 60.0
WAIT_STEP_S = 0.05
TCP_LISTEN = "0A"                  # the LISTEN state in /proc/net/tcp


@pytest.fixture
def client(zookeeper):
    """A started kazoo client of the session's server; stopped and closed afterwards."""
    clients = []

    def connect() -> KazooClient:
        kazoo = KazooClient(hosts=zookeeper.connect_string)
        clients.append(kazoo)
        kazoo.start(timeout=TIMEOUT_S)
        return kazoo

    yield connect
    for kazoo in clients:
        kazoo.stop()
        kazoo.close()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {TIMEOUT_S} s"
        time.sleep(WAIT_STEP_S)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (IP address, port) pairs the process ``pid`` listens on (TCP); an IPv4
    address mapped into IPv6 (Java's sockets) as the IPv4 one."""
    inodes = set()
    for descriptor in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                address, port = fields[1].split(":")
                if fields[3] == TCP_LISTEN and fields[9] in inodes:
                    found.add((str(proc_address(address)), int(port, 16)))
    return found


def proc_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp* writes it: 32-bit words in host (little-endian) order."""
    words = bytes.fromhex(text)
    packed = b"".join(words[start:start + 4][::-1] for start in range(0, len(words), 4))
    address = ipaddress.ip_address(packed)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def processes_running(config_path: str) -> list[int]:
    """Processes whose command line names ``config_path`` (the JVMs of one server)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if config_path.encode() in cmdline.read().split(b"\0"):
                    found.append(int(pid))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def test_a_client_connects_and_the_root_is_served(zookeeper, client):
    print(f"\nZooKeeper served {zookeeper.start_time_s:.2f} s after its JVM started")
    assert zookeeper.connect_string == f"127.0.0.1:{zookeeper.port}"
    assert "zookeeper" in client().get_children("/")


def test_an_ephemeral_znode_goes_with_its_session(client):
    owner, watcher = client(), client()
    owner.create("/ephemeral-test/broker", b"1", ephemeral=True, makepath=True)
    assert watcher.exists("/ephemeral-test/broker") is not None
    with pytest.raises(NodeExistsError):        # an election's loser is refused
        watcher.create("/ephemeral-test/broker", b"2", ephemeral=True)
    owner.stop()                                # closes the session
    wait_until(lambda: watcher.exists("/ephemeral-test/broker") is None,
               "the ephemeral znode's removal")


def test_a_write_with_a_stale_version_is_refused(client):
    kazoo = client()
    kazoo.create("/versioned-test/state", b"epoch 0", makepath=True)
    _, read = kazoo.get("/versioned-test/state")
    written = kazoo.set("/versioned-test/state", b"epoch 1", version=read.version)
    assert written.version == read.version + 1
    with pytest.raises(BadVersionError):
        kazoo.set("/versioned-test/state", b"stale", version=read.version)
    assert kazoo.get("/versioned-test/state")[0] == b"epoch 1"


def test_a_transaction_checking_a_stale_version_changes_nothing(client):
    """A controller's writes carry a check of /controller_epoch's version: a deposed
    controller's (an older version) apply none of their operations."""
    kazoo = client()
    kazoo.create("/fencing-test/controller_epoch", b"1", makepath=True)
    kazoo.create("/fencing-test/state", b"leader 1")
    _, epoch = kazoo.get("/fencing-test/controller_epoch")
    kazoo.set("/fencing-test/controller_epoch", b"2", version=epoch.version)   # a new controller
    deposed = kazoo.transaction()
    deposed.check("/fencing-test/controller_epoch", epoch.version)
    deposed.set_data("/fencing-test/state", b"leader 2")
    results = deposed.commit()
    assert isinstance(results[0], BadVersionError)
    assert kazoo.get("/fencing-test/state")[0] == b"leader 1"


def test_the_servers_files_are_private(zookeeper):
    for root, _directories, files in os.walk(zookeeper.data_dir):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700, root
        for name in files:
            path = os.path.join(root, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert os.path.getsize(zookeeper.log_path) > 0, "the JVM's log is not in its log file"


def test_it_listens_on_its_client_port_on_loopback_only(zookeeper):
    assert listening_addresses(zookeeper.process.pid) == {("127.0.0.1", zookeeper.port)}, \
        "the JVM listens elsewhere too (the AdminServer's :8080?)"


def test_a_stop_leaves_no_process_and_a_restart_keeps_the_znodes(tmp_path):
    server = ZooKeeperServer(str(tmp_path / "zookeeper"), tick_time_ms=500)
    config_path = os.path.join(server.data_dir, CONFIG_FILE)
    with server:
        assert processes_running(config_path) == [server.process.pid]
        kazoo = KazooClient(hosts=server.connect_string)
        kazoo.start(timeout=TIMEOUT_S)
        kazoo.create("/kept", b"across restarts")
        kazoo.stop()
        kazoo.close()
    assert server.process.returncode == 128 + signal.SIGTERM, "the JVM was killed, not stopped"
    assert processes_running(config_path) == []
    with ZooKeeperServer(server.data_dir, tick_time_ms=500) as again:
        kazoo = KazooClient(hosts=again.connect_string)
        kazoo.start(timeout=TIMEOUT_S)
        try:
            assert kazoo.get("/kept")[0] == b"across restarts"
        finally:
            kazoo.stop()
            kazoo.close()
    assert processes_running(config_path) == []


def test_a_port_in_use_is_refused_and_leaves_no_process(zookeeper, tmp_path):
    server = ZooKeeperServer(str(tmp_path / "zookeeper"), port=zookeeper.port)
    with pytest.raises(ZooKeeperStartError, match="Address already in use"):
        server.start()
    assert server.process is None
    assert processes_running(os.path.join(server.data_dir, CONFIG_FILE)) == []


def test_a_port_taken_before_the_jvm_binds_it_is_given_up_for_another(tmp_path):
    """Port 0: the port picked is taken (here by the test, once the server wrote it
    into zoo.cfg: the JVM binds a second later) and the server starts on another."""
    server = ZooKeeperServer(str(tmp_path / "zookeeper"), tick_time_ms=500)
    config_path = os.path.join(server.data_dir, CONFIG_FILE)
    starting = threading.Thread(target=server.start)
    starting.start()
    try:
        wait_until(lambda: "clientPort=" in read_text(config_path), "zoo.cfg")
        taken_port = int(read_text(config_path).split("clientPort=")[1].split()[0])
        with socket.create_server(("127.0.0.1", taken_port)):
            starting.join(TIMEOUT_S)
            assert not starting.is_alive(), f"no start in {TIMEOUT_S} s"
        assert server.port != taken_port
        assert server.process.poll() is None, "the server does not run"
        assert "Address already in use" in read_text(server.log_path)
    finally:
        starting.join(TIMEOUT_S)
        server.stop()
    assert processes_running(config_path) == []


def read_text(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        return ""


def test_a_data_directory_of_another_kind_is_refused(tmp_path):
    os.mkdir(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(NotOwnedError):
        ZooKeeperServer(str(tmp_path / "link")).start()
    assert os.listdir(tmp_path / "elsewhere") == []


def test_out_of_range_settings_are_refused(tmp_path):
    with pytest.raises(InvalidConfigError):
        ZooKeeperServer(str(tmp_path), port=65536)
    with pytest.raises(InvalidConfigError):
        ZooKeeperServer(str(tmp_path), tick_time_ms=0)


def test_a_missing_java_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))              # holds no java
    with pytest.raises(ZooKeeperUnavailableError, match="Java runtime"):
        java_executable()
    with pytest.raises(ZooKeeperUnavailableError):
        ZooKeeperServer(str(tmp_path / "zookeeper")).start()
    assert not os.path.exists(tmp_path / "zookeeper"), "it made files before refusing"


def test_a_missing_pyspark_is_a_clear_error():
    """Without site-packages (python -S) there is no pyspark to find."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from shmlog.devtools.zookeeper import classpath\ntry:\n    classpath()\n"
         "except Exception as error:\n    print(type(error).__name__, error)", REPOSITORY],
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.stdout.startswith("ZooKeeperUnavailableError"), done.stdout + done.stderr
    assert "pyspark is not installed" in done.stdout


def test_the_commands_help_gives_the_modules_defaults():
    assert zookeeper_command.DEFAULTS_HELP == {
        "port": zookeeper_module.PORT_DEFAULT, "host": zookeeper_module.HOST_DEFAULT,
        "tick_time_ms": limits.ZOOKEEPER_TICK_TIME_MS_DEFAULT}


# Runs ``python -m shmlog ARGUMENTS`` with SIGINT ignored, as a shell starts a
# background command (the command must still stop on SIGINT).
IGNORING_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                   "os.execv(sys.executable, [sys.executable, '-m', 'shmlog', *sys.argv[1:]])")


def start_command(data_dir: str) -> tuple[subprocess.Popen, str]:
    """``shmlog zookeeper`` on a free port, started with SIGINT ignored: the process,
    once it says it serves, and the address it serves."""
    command = subprocess.Popen(
        [sys.executable, "-c", IGNORING_SIGINT, "zookeeper", "--port", "0", "--data-dir",
         data_dir, "--tick-time-ms", "500"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPOSITORY,
                                                          os.environ.get("PYTHONPATH", "")])})
    readable, _, _ = select.select([command.stdout], [], [], TIMEOUT_S)
    assert readable, f"shmlog zookeeper said nothing in {TIMEOUT_S} s"
    line = command.stdout.readline()
    assert line.startswith("ZooKeeper serves 127.0.0.1:"), line + command.stderr.read()
    return command, line.split()[2]


def end_command(command: subprocess.Popen, data_dir: str) -> None:
    """Kill what is left of a command and its JVM (a failed test's)."""
    if command.poll() is None:
        command.kill()
        command.wait(timeout=TIMEOUT_S)
    for pid in processes_running(os.path.join(data_dir, CONFIG_FILE)):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_command_serves_until_signalled(tmp_path, stop_signal):
    data_dir = str(tmp_path / "zookeeper")
    command, connect_string = start_command(data_dir)
    try:
        kazoo = KazooClient(hosts=connect_string)
        kazoo.start(timeout=TIMEOUT_S)
        kazoo.create("/served", json.dumps({"by": "shmlog zookeeper"}).encode())
        kazoo.stop()
        kazoo.close()
        command.send_signal(stop_signal)
        assert command.wait(timeout=TIMEOUT_S) == 0, command.stderr.read()
        assert "stopped" in command.stdout.read()
        assert processes_running(os.path.join(data_dir, CONFIG_FILE)) == []
    finally:
        end_command(command, data_dir)


def test_the_command_fails_when_its_server_dies(tmp_path):
    data_dir = str(tmp_path / "zookeeper")
    command, _ = start_command(data_dir)
    try:
        [jvm] = processes_running(os.path.join(data_dir, CONFIG_FILE))
        os.kill(jvm, signal.SIGKILL)
        assert command.wait(timeout=TIMEOUT_S) == 1
        assert f"exited with status -{int(signal.SIGKILL)}" in command.stderr.read()
    finally:
        end_command(command, data_dir)
