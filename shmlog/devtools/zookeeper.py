"""A local, standalone Apache ZooKeeper server for development and tests.

Cluster mode keeps its metadata (live brokers, the controller, partition leaders and
ISRs) in ZooKeeper, as Kafka did before KRaft. In production the brokers point at
the operator's ensemble (``zookeeper.connect``); this module starts one server on
this host, from ZooKeeper 3.9's jars that PySpark ships, for ``shmlog zookeeper``
and for the tests (one per pytest session).

Rules
-----
* Light: the standard library, ``errors`` and ``limits`` only (no numpy, numba or
  ZeroMQ); kazoo is imported only while a server starts, so ``shmlog --help`` does
  not pay for it.
* Private: the data directory is 0700 and owned by this user (another user's is
  refused), files are made 0600 without following symbolic links, and the JVM runs
  with umask 077, so ZooKeeper's snapshots and transaction logs are private too.
* Closed: the client port listens on loopback unless a host is given; the
  AdminServer (an HTTP server on :8080 by default) is off; only the four-letter
  words ``ruok``, ``srvr`` and ``mntr`` (health and monitoring) are answered.
* Bounded: the heap (``ZOOKEEPER_HEAP_SIZE_MAX``), the start (``start_timeout_s``),
  the stop (SIGTERM, ``ZOOKEEPER_STOP_TIMEOUT_S``, then SIGKILL), the disk (old
  snapshots and logs purged hourly, three kept; transaction logs preallocated in
  4 MiB steps instead of 64 MiB; its own log rolled over).

Theory of operation
-------------------
:meth:`ZooKeeperServer.start` writes ``zoo.cfg`` and ``log4j2.properties`` in the
data directory and runs ``java -cp "<pyspark>/jars/*"
org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg`` there. ZooKeeper logs at
INFO to ``zookeeper.log`` (rolled over at ``ZOOKEEPER_LOG_SIZE_MAX``, one old file
kept); what the JVM itself prints goes to ``zookeeper.out``. ZooKeeper's data
(snapshots, transaction logs) is in the ``data`` subdirectory, so a server started
again on the same directory keeps its znodes. ZooKeeper cannot bind port 0 (``clientPort=0``
means "no client port"), so port 0 asks this module to pick a free one: it binds
port 0, notes the port and closes it; a JVM that then finds the port taken exits
at once, and another port is tried. The server is ready when a kazoo client's
session is established (a listening socket comes before the database is loaded);
the wait is bounded, and ends early when the JVM exits. A JVM started with C1 only
and the serial collector serves ~30% sooner on a small host; the server's load
(metadata) never needs C2's code.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import socket
import stat
import subprocess
import time

from ..common import child_process, limits
from ..common.errors import (
    InvalidConfigError,
    NotOwnedError,
    StorageError,
    ZooKeeperStartError,
    ZooKeeperUnavailableError,
)

__all__ = ["ZooKeeperServer", "classpath", "java_executable", "default_data_dir",
           "CONFIG_FILE", "LOG_FILE", "OUTPUT_FILE", "DATA_DIRECTORY",
           "PORT_DEFAULT", "HOST_DEFAULT"]

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
CONFIG_FILE = "zoo.cfg"
LOGGING_FILE = "log4j2.properties"
LOG_FILE = "zookeeper.log"
# What the JVM itself prints (a JVM that cannot start says why here), one run's worth.
OUTPUT_FILE = "zookeeper.out"
DATA_DIRECTORY = "data"
# ZooKeeper's default client port.
PORT_DEFAULT = 2181
PORT_MAX = 65535
HOST_DEFAULT = "127.0.0.1"
FOUR_LETTER_WORDS = ("ruok", "srvr", "mntr")
# Snapshots (and the transaction logs they make redundant) kept by the hourly purge:
# ZooKeeper's minimum, enough to recover from a damaged last snapshot.
SNAPSHOTS_KEPT = 3
# What ZooKeeper logs when its port is taken (java.net.BindException).
PORT_TAKEN = "Address already in use"
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-XX:-UsePerfData",          # no /tmp/hsperfdata_<user> file
               "-Djava.awt.headless=true")
# ZooKeeper's log, at INFO, in a file that rolls over once (one old file kept): the
# names are relative to the JVM's working directory, the data directory, so no path
# passes through log4j's ${...} substitution.
LOGGING = f"""\
# Written by shmlog (shmlog.devtools.zookeeper).
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {LOG_FILE}
appender.file.filePattern = {LOG_FILE}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %p %c{{1}}: %m%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = {limits.ZOOKEEPER_LOG_SIZE_MAX >> 10} KB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 1
"""


def classpath() -> str:
    """The Java class path of ZooKeeper's jars: ``<pyspark>/jars/*``.

    Raises
    ------
    ZooKeeperUnavailableError
        PySpark is not installed, or its jars hold no ZooKeeper.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ZooKeeperUnavailableError(
            "a local ZooKeeper runs from PySpark's jars, and pyspark is not installed: "
            "pip install 'shmlog[spark]', or point the brokers at a ZooKeeper ensemble")
    jars = os.path.join(list(spec.submodule_search_locations)[0], "jars")
    if not os.path.isdir(jars) or not any(name.startswith("zookeeper-") and name.endswith(".jar")
                                          for name in os.listdir(jars)):
        raise ZooKeeperUnavailableError(f"no zookeeper-*.jar in {jars}: is pyspark complete?")
    return os.path.join(jars, "*")


def java_executable() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on the PATH.

    Raises
    ------
    ZooKeeperUnavailableError
        Neither is an executable file.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if os.access(java, os.X_OK):
            return java
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperUnavailableError(
            "a local ZooKeeper needs a Java runtime (17 or later): none at $JAVA_HOME/bin/java "
            "nor on the PATH")
    return java


def default_data_dir() -> str:
    """``$XDG_DATA_HOME/shmlog-zookeeper`` (``~/.local/share/shmlog-zookeeper``): beside
    a broker's default data directory, never inside one (a broker owns all of its)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return os.path.join(base, "shmlog-zookeeper")


class ZooKeeperServer:
    """A standalone ZooKeeper in a child JVM: ``with ZooKeeperServer(path) as zookeeper:``
    then ``KazooClient(zookeeper.connect_string)``.

    Parameters
    ----------
    data_dir : str
        Its configuration, log and data (made 0700 if absent).
    port : int
        The client port; 0 picks a free one.
    host : str
        The address the client port listens on (loopback by default).
    tick_time_ms : int
        ZooKeeper's ``tickTime``: sessions time out after 2 to 20 ticks.
    start_timeout_s : float
        How long :meth:`start` waits for the server to serve.

    Raises
    ------
    InvalidConfigError
        The port or the tick is out of range.
    """

    def __init__(self, data_dir: str, *, port: int = 0, host: str = HOST_DEFAULT,
                 tick_time_ms: int = limits.ZOOKEEPER_TICK_TIME_MS_DEFAULT,
                 start_timeout_s: float = limits.ZOOKEEPER_START_TIMEOUT_S):
        if not 0 <= port <= PORT_MAX:
            raise InvalidConfigError(f"ZooKeeper's port {port} is not in 0..{PORT_MAX}")
        if tick_time_ms <= 0:
            raise InvalidConfigError(f"ZooKeeper's tick_time_ms {tick_time_ms} is not positive")
        self.data_dir = os.path.abspath(data_dir)
        self.requested_port = port
        self.port = port
        self.host = host
        self.tick_time_ms = tick_time_ms
        self.start_timeout_s = start_timeout_s
        self.log_path = os.path.join(self.data_dir, LOG_FILE)
        self.output_path = os.path.join(self.data_dir, OUTPUT_FILE)
        self.process: subprocess.Popen | None = None
        #: Seconds from the JVM's start to the first session (set by :meth:`start`).
        self.start_time_s: float | None = None

    @property
    def connect_string(self) -> str:
        """``host:port``, as kazoo's ``hosts`` and Kafka's ``zookeeper.connect`` take it."""
        return f"{self.host}:{self.port}"

    def start(self) -> "ZooKeeperServer":
        """Start the JVM and wait until a client's session is established.

        Raises
        ------
        ZooKeeperUnavailableError
            No pyspark jars or no java.
        ZooKeeperStartError
            The server exited, its port is taken, or it did not serve within
            ``start_timeout_s``; no process is left.
        NotOwnedError, StorageError
            The data directory is another user's, a symbolic link, or cannot be made.
        """
        assert self.process is None, "this ZooKeeperServer was started already"
        heap = f"-Xmx{limits.ZOOKEEPER_HEAP_SIZE_MAX >> 20}m"
        command = [java_executable(), heap, *JVM_OPTIONS,
                   f"-Dlog4j2.configurationFile={os.path.join(self.data_dir, LOGGING_FILE)}",
                   "-cp", classpath(), MAIN_CLASS, os.path.join(self.data_dir, CONFIG_FILE)]
        _make_private_directory(self.data_dir)
        _write_private(os.path.join(self.data_dir, LOGGING_FILE), LOGGING)
        attempts = limits.ZOOKEEPER_PORT_ATTEMPTS_MAX if self.requested_port == 0 else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start_on(self.requested_port or _free_port(self.host), command)
                return self
            except _PortTakenError:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_on(self, port: int, command: list[str]) -> None:
        """One attempt on ``port``; no process is left when it raises."""
        self.port = port
        _check_port_free(self.host, port)      # else the wait could meet another's server
        _write_private(os.path.join(self.data_dir, CONFIG_FILE), self.config_text())
        log_size = _size(self.log_path)
        started = time.monotonic()
        self._spawn(command)
        try:
            self._wait_until_serving(started + self.start_timeout_s)
        except BaseException as error:                # an interrupt too: leave no JVM
            self.stop()
            self.process = None
            if isinstance(error, ZooKeeperStartError) and self._log_says(PORT_TAKEN, log_size):
                raise _PortTakenError(f"{error} (its port was taken)") from None
            raise
        self.start_time_s = time.monotonic() - started

    def config_text(self) -> str:
        """The ``zoo.cfg`` this server runs with (the port chosen)."""
        settings = {
            "tickTime": self.tick_time_ms,
            "dataDir": os.path.join(self.data_dir, DATA_DIRECTORY),
            "clientPort": self.port,
            "clientPortAddress": self.host,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": ",".join(FOUR_LETTER_WORDS),
            "autopurge.snapRetainCount": SNAPSHOTS_KEPT,
            "autopurge.purgeInterval": limits.ZOOKEEPER_PURGE_INTERVAL_HOURS,
            "preAllocSize": limits.ZOOKEEPER_LOG_PREALLOCATE_STEP_KIB,
        }
        return "# Written by shmlog (shmlog.devtools.zookeeper).\n" + "".join(
            f"{name}={value}\n" for name, value in settings.items())

    def stop(self, timeout_s: float = limits.ZOOKEEPER_STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout_s``); the JVM's exit status
        (143 after a SIGTERM: the JVM's shutdown hooks ran). No process is left."""
        if self.process is None:
            return 0
        return child_process.stop(self.process, timeout_s)

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _spawn(self, command: list[str]) -> None:
        """Run the JVM in the data directory with umask 077, its output to the output file."""
        output = os.open(self.output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        try:
            self.process = subprocess.Popen(command, cwd=self.data_dir, stdin=subprocess.DEVNULL,
                                            stdout=output, stderr=subprocess.STDOUT, umask=0o077)
        finally:
            os.close(output)

    def _wait_until_serving(self, deadline: float) -> None:
        """Wait for the port to accept, then for a kazoo session; bounded by
        ``deadline``, and ended as soon as the JVM exits (what accepted may be
        another process that took the port, which would never answer)."""
        interval_s = limits.ZOOKEEPER_PROBE_INTERVAL_S
        while not self._accepts():
            self._check_alive(deadline)
            time.sleep(interval_s)
        from kazoo.client import KazooClient
        # A session refused while the database loads is expected here: kazoo's
        # warning about it is noise, so the probe logs through its own logger.
        probe_log = logging.getLogger(f"{__name__}.probe")
        probe_log.setLevel(logging.ERROR)
        client = KazooClient(hosts=self.connect_string, logger=probe_log,
                             timeout=limits.ZOOKEEPER_PROBE_SESSION_TIMEOUT_S,
                             connection_retry={"max_tries": -1, "delay": interval_s,
                                               "backoff": 1, "max_jitter": 0.0})
        try:
            connected = client.start_async()
            while not connected.wait(interval_s):
                self._check_alive(deadline)
        finally:
            client.stop()
            client.close()
        self._check_alive()                   # a session, and from our JVM

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port),
                                          timeout=limits.ZOOKEEPER_PROBE_INTERVAL_S):
                return True
        except OSError:
            return False

    def _check_alive(self, deadline: float = math.inf) -> None:
        """Raise if the JVM exited, or if ``deadline`` passed."""
        if self.process.poll() is not None:
            raise ZooKeeperStartError(
                f"ZooKeeper exited with status {self.process.returncode} while starting on "
                f"{self.connect_string}: see {self.log_path} and {self.output_path}")
        if time.monotonic() > deadline:
            raise ZooKeeperStartError(
                f"ZooKeeper did not serve on {self.connect_string} within "
                f"{self.start_timeout_s} s: see {self.log_path} and {self.output_path}")

    def _log_says(self, text: str, since_size: int) -> bool:
        """Whether the log, past its first ``since_size`` bytes, holds ``text``."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(since_size)
                return text.encode() in log.read()
        except FileNotFoundError:                      # the JVM died before it logged
            return False


def _free_port(host: str) -> int:
    """A port nobody listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class _PortTakenError(ZooKeeperStartError):
    """The port was taken: with a port picked here, another is tried."""


def _check_port_free(host: str, port: int) -> None:
    """Raise if something listens on ``host:port`` (binding it is refused)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the JVM binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise _PortTakenError(f"ZooKeeper cannot listen on {host}:{port}: {error}") \
                from error


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _make_private_directory(path: str) -> None:
    """Make ``path`` (0700), or check that it is a directory of this user's (not a
    symbolic link) and give it mode 0700.

    Raises
    ------
    StorageError
        It cannot be made.
    NotOwnedError
        It is another user's, or not a directory.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        status = os.stat(path, follow_symlinks=False)
    except OSError as error:
        raise StorageError(f"cannot make ZooKeeper's data directory {path}: {error}") from error
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
        raise NotOwnedError(f"{path} is not a directory of this user's (uid {os.geteuid()}): "
                            f"give ZooKeeper a data directory of its own")
    os.chmod(path, 0o700)


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (0600, never through a symbolic link)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
