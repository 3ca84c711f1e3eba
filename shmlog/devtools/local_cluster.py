"""A cluster on one machine: a ZooKeeper and N brokers, each on a loopback address of
its own (127.0.0.1, 127.0.0.2, ...), for development, tests and benchmarks.

Rules
-----
* Everything lives under one directory: ``zookeeper/``, and per broker
  ``broker-<id>/`` (its data) and ``broker-<id>.toml`` (its config, the file an
  operator would write: ``shmlog broker --config broker-<id>.toml``).
* Brokers talk CurveZMQ (the cluster default): ``keys/`` holds a key pair per
  broker (``broker-<id>.key``, ``broker-<id>.key_secret``, made at the first start
  and kept), each broker's config names its secret file and allows every ``.key``
  file of ``keys/``. ``curve=False`` writes ``security.inter.broker.protocol =
  "plaintext"`` instead.
* A broker keeps its replication port across restarts (its peers and ZooKeeper
  know it by it).
* :meth:`LocalCluster.stop` stops every broker (SIGTERM, then SIGKILL) and the
  ZooKeeper it started; a ZooKeeper given to it (``zookeeper_connect``) is left
  running. A broker paused (:meth:`LocalCluster.pause`, SIGSTOP) is resumed first,
  so it can take its SIGTERM.
* A broker may live elsewhere than on its loopback address: ``hosts`` gives its
  address and ``launch_prefixes`` the command it is started under (a network
  namespace: ``["ip", "netns", "exec", "<ns>"]``). Clients reach every broker
  through its data directory (the control socket is a file, shared memory is
  /dev/shm's), so only replication and ZooKeeper traffic crosses the network.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from typing import Mapping, Sequence

from ..common import access, limits
from ..common.errors import ShmlogError
from ..common.paths import shared_memory_prefix
from ..config import curve_keys
from ..protocol.control_client import request
from ..server.broker import Broker
from ..shm import shared_memory
from .zookeeper import ZooKeeperServer

__all__ = ["LocalCluster", "poll_until"]


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _toml_value(value) -> str:
    """A setting's value as TOML writes it."""
    return str(value).lower() if isinstance(value, bool) else \
        repr(value) if isinstance(value, (int, float)) else f'"{value}"'


class LocalCluster:
    """ZooKeeper and ``brokers`` brokers under ``directory``.

    Parameters
    ----------
    directory : str
    brokers : int
    zookeeper_connect : str, optional
        A running ZooKeeper's ``host:port``; by default one is started here.
    chroot : str, optional
        The cluster's znode root (default: a new ``/shmlog-<hex>``).
    settings : dict
        ``[cluster]`` settings every broker gets (Kafka's dotted names or snake_case),
        e.g. ``{"zookeeper.session.timeout.ms": 2000}``.
    hosts : mapping of broker id to address, optional
        Where each broker's replication endpoint listens (default ``127.0.0.<id>``).
    launch_prefixes : mapping of broker id to a command, optional
        What each broker is started under (``Broker``'s ``launch_prefix``).
    log_files : bool
        Append each broker's output to ``broker-<id>.log`` (:meth:`log_file`)
        instead of this process's.
    broker_settings : dict, optional
        Broker settings every broker gets (``BrokerConfig`` field names, e.g.
        ``{"offsets_topic_num_partitions": 3}``), written before the ``[cluster]`` table.
    curve : bool
        Brokers talk CurveZMQ with keys made under ``keys/`` (default); False: plain
        TCP.
    kafka_security_protocol : str
        The security protocol of each broker's Kafka listener (default PLAINTEXT;
        SSL and SASL_SSL need their ``ssl_*`` and ``sasl_*`` settings in
        ``broker_settings``, a certificate valid for every broker's host).

    Each broker also gets a Kafka listener, ``PROTOCOL://<its host>:<a free port>``
    (:meth:`kafka_address`; the port is kept across its restarts), unless
    ``broker_settings`` names ``listeners``.
    """

    def __init__(self, directory: str, brokers: int = 3, *, zookeeper_connect: str | None = None,
                 chroot: str | None = None, settings: dict | None = None,
                 startup_timeout_s: float = 120.0, hosts: Mapping[int, str] | None = None,
                 launch_prefixes: Mapping[int, Sequence[str]] | None = None,
                 log_files: bool = False, broker_settings: dict | None = None,
                 curve: bool = True, kafka_security_protocol: str = "PLAINTEXT"):
        self.directory = os.path.abspath(directory)
        self.count = brokers
        self.settings = dict(settings or {})
        if brokers < 3 and not {"offsets.topic.replication.factor",
                                "offsets_topic_replication_factor"} & set(self.settings):
            # Kafka's default factor 3 would leave a smaller cluster without groups
            # (its docs tell a one-broker setup to lower it; so does this).
            self.settings["offsets.topic.replication.factor"] = brokers
        self.broker_settings = dict(broker_settings or {})
        self.chroot = chroot or f"/shmlog-{uuid.uuid4().hex[:12]}"
        self.cluster_id = f"local-{uuid.uuid4().hex[:12]}"
        self.startup_timeout_s = startup_timeout_s
        self._given_zookeeper = zookeeper_connect
        self.zookeeper: ZooKeeperServer | None = None
        self.brokers: dict[int, Broker] = {}
        self.paused: set[int] = set()
        self._hosts = dict(hosts or {})
        self._launch_prefixes = {broker_id: list(prefix)
                                 for broker_id, prefix in (launch_prefixes or {}).items()}
        self.log_files = log_files
        self.curve = curve
        self.kafka_security_protocol = kafka_security_protocol
        self._ports: dict[int, int] = {}
        self._kafka_ports: dict[int, int] = {}

    # -- naming ----------------------------------------------------------------------------
    @property
    def zookeeper_connect(self) -> str:
        """The brokers' ``zookeeper.connect`` (with the chroot)."""
        hosts = self._given_zookeeper or self.zookeeper.connect_string
        return hosts + self.chroot

    def host(self, broker_id: int) -> str:
        return self._hosts.get(broker_id, f"127.0.0.{broker_id}")

    def log_file(self, broker_id: int) -> str:
        """Where broker ``broker_id``'s output goes with ``log_files``."""
        return os.path.join(self.directory, f"broker-{broker_id}.log")

    def data_dir(self, broker_id: int) -> str:
        return os.path.join(self.directory, f"broker-{broker_id}")

    def config_file(self, broker_id: int) -> str:
        return os.path.join(self.directory, f"broker-{broker_id}.toml")

    @property
    def keys_directory(self) -> str:
        """Where the brokers' CurveZMQ key files are (with ``curve``)."""
        return os.path.join(self.directory, "keys")

    def secret_key_file(self, broker_id: int) -> str:
        """Broker ``broker_id``'s secret key file (with ``curve``)."""
        return os.path.join(self.keys_directory, f"broker-{broker_id}{curve_keys.SECRET_SUFFIX}")

    def replication_endpoint(self, broker_id: int) -> str:
        if broker_id not in self._ports:
            # An address of another network namespace cannot be probed from here:
            # any port is free there.
            self._ports[broker_id] = _free_port(self.host(broker_id)) \
                if broker_id not in self._launch_prefixes else _free_port("127.0.0.1")
        return f"tcp://{self.host(broker_id)}:{self._ports[broker_id]}"

    def kafka_address(self, broker_id: int) -> str:
        """``host:port`` of broker ``broker_id``'s Kafka listener (a Kafka client's
        bootstrap server)."""
        if broker_id not in self._kafka_ports:
            self._kafka_ports[broker_id] = _free_port(self.host(broker_id)) \
                if broker_id not in self._launch_prefixes else _free_port("127.0.0.1")
        return f"{self.host(broker_id)}:{self._kafka_ports[broker_id]}"

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's Kafka listener, comma-separated (``bootstrap.servers``)."""
        return ",".join(self.kafka_address(broker_id) for broker_id in range(1, self.count + 1))

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "LocalCluster":
        access.make_directories(self.directory)
        try:
            if self._given_zookeeper is None:
                self.zookeeper = ZooKeeperServer(os.path.join(self.directory, "zookeeper"))
                self.zookeeper.start()
            for broker_id in range(1, self.count + 1):
                self._make_keys(broker_id)
                self._write_config(broker_id)
            # Launched together, waited for after: their warm-ups overlap.
            for broker_id in range(1, self.count + 1):
                self.brokers[broker_id] = self._broker(broker_id).launch()
            for broker_id in range(1, self.count + 1):
                self.brokers[broker_id].wait_until_serving()
            self._wait_until_known(range(1, self.count + 1))
        except BaseException:
            self.stop()
            raise
        return self

    def _make_keys(self, broker_id: int) -> None:
        """A key pair for the broker, unless it has one (a restarted cluster)."""
        if self.curve and not os.path.exists(self.secret_key_file(broker_id)):
            access.make_directories(self.keys_directory)
            curve_keys.write_key_pair(self.keys_directory, f"broker-{broker_id}")

    def _write_config(self, broker_id: int) -> None:
        lines = [f"{key} = {_toml_value(value)}" for key, value in self.broker_settings.items()]
        if "listeners" not in self.broker_settings:
            lines.append(f'listeners = "{self.kafka_security_protocol}://'
                         f'{self.kafka_address(broker_id)}"')
        lines += ["[cluster]",
                 f'"cluster.id" = "{self.cluster_id}"',
                 f'"broker.id" = {broker_id}',
                 f'"zookeeper.connect" = "{self.zookeeper_connect}"',
                 f'"replication.endpoint" = "{self.replication_endpoint(broker_id)}"']
        if self.curve:
            lines += [f'"curve.secret.key.file" = "{self.secret_key_file(broker_id)}"',
                      f'"curve.allowed.public.keys.dir" = "{self.keys_directory}"']
        else:
            lines.append('"security.inter.broker.protocol" = "plaintext"')
        for key, value in self.settings.items():
            lines.append(f'"{key}" = {_toml_value(value)}')
        with open(self.config_file(broker_id), "w") as config:
            config.write("\n".join(lines) + "\n")

    def _broker(self, broker_id: int) -> Broker:
        return Broker(self.data_dir(broker_id), config_file=self.config_file(broker_id),
                      startup_timeout_s=self.startup_timeout_s,
                      launch_prefix=self._launch_prefixes.get(broker_id, ()),
                      output=self.log_file(broker_id) if self.log_files else None)

    def start_broker(self, broker_id: int) -> Broker:
        """Start (or restart) broker ``broker_id``; returns once it answers."""
        broker = self._broker(broker_id)
        self.brokers[broker_id] = broker.start()
        return broker

    def add_broker(self) -> int:
        """Start one broker more, with the next id (its config written as the others'):
        the first step of growing a cluster (docs/OPERATIONS.md). Returns its id once
        it answers."""
        self.count += 1
        broker_id = self.count
        self._make_keys(broker_id)       # the others read their keys directory again
        self._write_config(broker_id)
        self.start_broker(broker_id)
        self._wait_until_known((broker_id,))
        return broker_id

    def _wait_until_known(self, broker_ids) -> None:
        """Wait until every running broker lists ``broker_ids`` among the live brokers:
        a broker answers before its registration has reached the others' views, and a
        topic created through one that does not see them yet is refused a replication
        factor the cluster has."""
        wanted = {str(broker_id) for broker_id in broker_ids}

        def known() -> bool:
            return all(wanted <= set(request(self.data_dir(broker_id), "metadata")["brokers"])
                       for broker_id in set(self.brokers) - self.paused)
        self.wait_for(known, self.startup_timeout_s, f"brokers {sorted(broker_ids)} to be "
                      f"known to every broker", interval_s=limits.LOCAL_CLUSTER_VIEW_POLL_S)

    def kill(self, broker_id: int) -> None:
        """SIGKILL a broker (no clean leave: its session must expire)."""
        broker = self.brokers.pop(broker_id)
        self.paused.discard(broker_id)
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait(timeout=limits.LOCAL_CLUSTER_KILLED_WAIT_S)

    def pause(self, broker_id: int) -> None:
        """SIGSTOP a broker: it stops answering anyone, its session runs on until it
        expires (a zombie once it is resumed)."""
        self.brokers[broker_id].process.send_signal(signal.SIGSTOP)
        self.paused.add(broker_id)

    def resume(self, broker_id: int) -> None:
        """SIGCONT a paused broker."""
        self.brokers[broker_id].process.send_signal(signal.SIGCONT)
        self.paused.discard(broker_id)

    def stop_broker(self, broker_id: int) -> None:
        broker = self.brokers.pop(broker_id, None)
        if broker is not None:
            if broker_id in self.paused:
                self.paused.discard(broker_id)
                broker.process.send_signal(signal.SIGCONT)
            broker.stop()

    def stop(self) -> None:
        """Stop every broker and the ZooKeeper started here; remove the shared memory
        a broker killed and not restarted left (its state table, its producers'
        rings: a broker removes them only when it stops)."""
        for broker_id in list(self.brokers):
            self.stop_broker(broker_id)
        for broker_id in range(1, self.count + 1):
            for name in shared_memory.names(shared_memory_prefix(self.data_dir(broker_id))):
                shared_memory.unlink(name)
        if self.zookeeper is not None:
            self.zookeeper.stop()
            self.zookeeper = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def wait_for(self, condition, timeout_s: float, what: str, interval_s: float = 0.02):
        """Poll ``condition()`` until it returns a true value (returned), or raise
        after ``timeout_s`` (:func:`poll_until`)."""
        return poll_until(condition, timeout_s, what, interval_s)


def poll_until(condition, timeout_s: float, what: str, interval_s: float = 0.02):
    """Poll ``condition()`` every ``interval_s`` until it returns a true value, which
    is returned; raise :class:`ShmlogError` naming ``what`` after ``timeout_s``. For
    tests, tools and benchmarks that watch a cluster from outside."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ShmlogError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)

