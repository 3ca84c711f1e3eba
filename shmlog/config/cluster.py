"""A broker's cluster settings: the ``[cluster]`` table of its TOML file.

A broker started with a ``[cluster]`` table joins a cluster: it registers in
ZooKeeper, replicates partitions with its peers over ZeroMQ and serves acks=all.
Without the table :attr:`BrokerConfig.cluster <shmlog.config.broker.BrokerConfig>`
is None and the broker is today's single-host broker, with no ZooKeeper.

Rules
-----
* Light: the standard library, ``errors``, ``limits``, ``settings``, ``curve_keys``
  and ``documented`` only (no numpy, numba, kazoo or ZeroMQ), so the ``shmlog``
  command reads a config file without paying for them.
* Names: every setting is a field of :class:`ClusterConfig` in snake_case; the table
  also takes Kafka's dotted names (``"zookeeper.connect"``, ``"broker.rack"``), quoted
  or bare (TOML reads a bare ``zookeeper.connect`` as nested tables, which are
  joined back into the dotted name). A name given twice (both forms) or a name that
  is neither is refused.
* Defaults are Kafka 2.8's (``KafkaConfig.Defaults``; each field's description,
  :func:`~shmlog.common.documented.setting`, names its Kafka setting). ``cluster_id``,
  ``broker_id``, ``zookeeper_connect`` and ``replication_endpoint`` have no default:
  a cluster member must say who it is and where its peers find it.
* Checked whole, when made: types (an int is never a bool or a float, TOML's types
  are kept, no strings for numbers), ranges, the two address forms, and Kafka's two
  cross-checks (``KafkaConfig.validateValues``): ``replica.fetch.wait.max.ms`` is at
  most ``replica.socket.timeout.ms`` and at most ``replica.lag.time.max.ms``. Every
  refusal is an :class:`~shmlog.common.errors.InvalidConfigError` naming the setting, the
  value and what is accepted.
* Security between brokers (``security.inter.broker.protocol``) is ``"curve"`` unless
  ``"plaintext"`` is written: plain TCP only when explicitly configured. With curve a
  broker must name its own secret key file (``curve.secret.key.file``) and at least
  one allowed peer (``curve.allowed.public.keys``, a list of Z85 keys, and/or
  ``curve.allowed.public.keys.dir``, a directory of ``.key`` files), or it does not
  start. The files are read when the broker starts (``zmq_replication.CurveSecurity``),
  not here.

Theory of operation
-------------------
``zookeeper_connect`` is Kafka's (and kazoo's ``hosts``) form: comma-separated
``host[:port]`` (port 2181 when left out, as ZooKeeper's ``ConnectStringParser``
does; IPv6 hosts in brackets), then optionally a chroot, the znode path every
cluster path lives under. kazoo takes the string whole; :attr:`zookeeper_hosts` and
:attr:`zookeeper_chroot` give its two parts. ``replication_endpoint`` is the ZeroMQ
address a broker binds its replication socket to *and* publishes in
``/brokers/ids/<id>`` for its peers to connect to, so a wildcard host (``*``,
``0.0.0.0``, ``::``) is refused, as Kafka refuses 0.0.0.0 in
``advertised.listeners``. ``advertised_host`` defaults to that endpoint's host
(Kafka's advertised listeners default to its listeners).

An example (the unit tests load it)::

    [cluster]
    "cluster.id" = "shmlog-dev"
    broker.id = 1
    zookeeper.connect = "127.0.0.1:2181/shmlog"
    "replication.endpoint" = "tcp://127.0.0.1:19091"
    "broker.rack" = "r1"
    "min.insync.replicas" = 2
    "default.replication.factor" = 3
    "replica.lag.time.max.ms" = 1500
    "curve.secret.key.file" = "/etc/shmlog/keys/broker-1.key_secret"
    "curve.allowed.public.keys.dir" = "/etc/shmlog/keys"
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from ..common import limits, settings
from ..common.documented import setting
from ..common.errors import InvalidConfigError
from . import curve_keys

__all__ = ["ClusterConfig", "KAFKA_NAMES", "SECURITY_PROTOCOLS", "check_zookeeper_connect"]

# Kafka types these settings as int (a few as long); a 32-bit int keeps every
# millisecond setting in range of ZeroMQ's poll and of threading's timeouts.
_INT_MAX = 2**31 - 1
_PORT_MAX = 65535
# A host name, an IPv4 address, or an IPv6 address in brackets.
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
_ZOOKEEPER_SERVER = re.compile(rf"(?P<host>{_HOST})(?::(?P<port>[0-9]{{1,5}}))?")
_ENDPOINT = re.compile(rf"tcp://(?P<host>\*|{_HOST}):(?P<port>[0-9]{{1,5}})")
_NAME = re.compile(r"[A-Za-z0-9._-]+")
# Hosts that are bind wildcards: a peer cannot connect to them.
_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "[0:0:0:0:0:0:0:0]")
# security.inter.broker.protocol: Kafka's PLAINTEXT/SSL become plain TCP/CurveZMQ.
SECURITY_PROTOCOLS = ("curve", "plaintext")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One broker's cluster settings (the ``[cluster]`` table); see the module's
    docstring for the forms and checks. Make one with :meth:`from_mapping` to accept
    Kafka's dotted names, or directly with field names."""
    cluster_id: str = setting(
        doc="The cluster's id, written at /cluster/id by its first broker; a broker with "
            "another id is refused. Required.")
    broker_id: int = setting(doc="This broker's id, unique in the cluster (broker.id). "
                                 "Required.")
    zookeeper_connect: str = setting(
        doc="ZooKeeper's host[:port] list, comma-separated, then optionally a chroot "
            "(zookeeper.connect: h1:2181,h2:2181/shmlog). Required.")
    replication_endpoint: str = setting(
        doc="tcp://host:port this broker binds for replication and publishes to its "
            "peers in /brokers/ids; a wildcard host is refused (Kafka's advertised "
            "listener). Required.")
    advertised_host: str | None = setting(
        None, doc="The host name clients and Spark see; unset: the replication "
                  "endpoint's host.")
    rack: str | None = setting(
        None, doc="This broker's rack (broker.rack): topic creation and reassignment "
                  "spread a partition's replicas over racks.")
    zookeeper_session_timeout_ms: int = setting(
        18_000, doc="ZooKeeper session timeout (zookeeper.session.timeout.ms): a broker "
                    "silent this long is taken for dead.")
    zookeeper_connection_timeout_ms: int | None = setting(
        None, doc="How long to wait for a ZooKeeper connection "
                  "(zookeeper.connection.timeout.ms); unset: the session timeout, as Kafka.")
    replica_lag_time_max_ms: int = setting(
        30_000, doc="A follower that has not caught up for this long leaves the ISR "
                    "(replica.lag.time.max.ms).")
    replica_fetch_wait_max_ms: int = setting(
        500, doc="How long a leader holds a follower's fetch when nothing is new "
                 "(replica.fetch.wait.max.ms); at most replica.socket.timeout.ms and "
                 "replica.lag.time.max.ms.")
    replica_fetch_max_bytes: int = setting(
        1 << 20, doc="Bytes a fetch asks of one partition (replica.fetch.max.bytes); at "
                     "least one batch is returned whatever its size.")
    replica_fetch_response_max_bytes: int = setting(
        10 << 20, doc="Bytes of one fetch response over all its partitions "
                      "(replica.fetch.response.max.bytes).")
    replica_socket_timeout_ms: int = setting(
        30_000, doc="How long a follower waits for a fetch response before it asks again "
                    "(replica.socket.timeout.ms).")
    replica_high_watermark_checkpoint_interval_ms: int = setting(
        5_000, doc="How often each partition's high watermark is written to disk "
                   "(replica.high.watermark.checkpoint.interval.ms).")
    default_replication_factor: int = setting(
        1, doc="Replicas of a topic created without a replication factor "
               "(default.replication.factor).")
    min_insync_replicas: int = setting(
        1, doc="The broker's default for topics that do not set min.insync.replicas: "
               "acks=all batches are refused while fewer replicas are in sync.")
    unclean_leader_election_enable: bool = setting(
        False, doc="Elect a replica that is not in sync when no in-sync one is alive, "
                   "losing what it lacks (unclean.leader.election.enable).")
    # Forwarding a local producer's batch to its partition's leader (forwarding.py).
    forward_delivery_timeout_ms: int = setting(
        120_000, doc="How long a producer's batch forwarded to its partition's leader on "
                     "another host may wait for its answer; past it the batch fails with "
                     "REQUEST_TIMED_OUT (Kafka's producer delivery.timeout.ms).")
    forward_request_timeout_ms: int = setting(
        30_000, doc="How long one forwarded produce request may wait, never past the "
                    "delivery timeout (Kafka's producer request.timeout.ms).")
    # Controlled shutdown and leader balance (leader_balance.py).
    controlled_shutdown_enable: bool = setting(
        True, doc="On SIGTERM, hand this broker's leaderships to in-sync replicas before "
                  "stopping (controlled.shutdown.enable).")
    controlled_shutdown_max_retries: int = setting(
        3, doc="Attempts at a controlled shutdown before stopping anyway "
               "(controlled.shutdown.max.retries).")
    controlled_shutdown_retry_backoff_ms: int = setting(
        5_000, doc="Wait between controlled shutdown attempts "
                   "(controlled.shutdown.retry.backoff.ms).")
    auto_leader_rebalance_enable: bool = setting(
        True, doc="The controller moves leaderships back to preferred replicas when a "
                  "broker's share is off balance (auto.leader.rebalance.enable).")
    leader_imbalance_per_broker_percentage: int = setting(
        10, doc="The percentage of a broker's partitions led by another replica that "
                "starts a rebalance (leader.imbalance.per.broker.percentage).")
    leader_imbalance_check_interval_seconds: int = setting(
        300, doc="How often the controller checks leader balance "
                 "(leader.imbalance.check.interval.seconds).")
    # Consumer groups across hosts (cluster_groups.py): while fewer brokers than the
    # replication factor are live, __consumer_offsets is not created and members hear
    # COORDINATOR_NOT_AVAILABLE, as Kafka 2.8 does.
    offsets_topic_replication_factor: int = setting(
        3, doc="Replicas of __consumer_offsets when the broker creates it "
               "(offsets.topic.replication.factor); it waits for that many live brokers.")
    offsets_commit_timeout_ms: int = setting(
        5_000, doc="How long a commit waits for its offsets to be replicated "
                   "(offsets.commit.timeout.ms).")
    # Transactions across hosts (cluster/transactions.py): __transaction_state as
    # __consumer_offsets, made on the first transactional request.
    transaction_state_log_replication_factor: int = setting(
        3, doc="Replicas of __transaction_state when the broker creates it "
               "(transaction.state.log.replication.factor); it waits for that many "
               "live brokers.")
    transaction_state_log_min_isr: int = setting(
        2, doc="min.insync.replicas of __transaction_state when the broker creates it "
               "(transaction.state.log.min.isr): a state change is taken only while "
               "that many replicas are in sync.")
    security_inter_broker_protocol: str = setting(
        "curve", doc="Between brokers: \"curve\" (CurveZMQ, authenticated and encrypted) "
                     "or \"plaintext\" (security.inter.broker.protocol).")
    curve_secret_key_file: str | None = setting(
        None, doc="This broker's secret key file (NAME.key_secret, from shmlog cluster "
                  "keys); required with curve.")
    curve_allowed_public_keys: tuple[str, ...] = setting(
        (), doc="Z85 public keys of the peers allowed to connect (with curve).")
    curve_allowed_public_keys_dir: str | None = setting(
        None, doc="A directory of peers' .key files allowed to connect (with curve), read "
                  "again when an unknown key knocks.")

    def __post_init__(self):
        if isinstance(self.curve_allowed_public_keys, list):      # as TOML gives it
            object.__setattr__(self, "curve_allowed_public_keys",
                               tuple(self.curve_allowed_public_keys))
        _check_names(self)
        _check_numbers(self)
        _check_addresses(self)
        _check_security(self)
        if self.advertised_host is None:
            object.__setattr__(self, "advertised_host", self.replication_host)
        if self.zookeeper_connection_timeout_ms is None:
            object.__setattr__(self, "zookeeper_connection_timeout_ms",
                               self.zookeeper_session_timeout_ms)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> "ClusterConfig":
        """A config from a ``[cluster]`` table: keys are field names or Kafka's dotted
        names (:data:`KAFKA_NAMES`).

        Raises
        ------
        InvalidConfigError
            An unknown key, a setting given twice, a missing required setting, or a
            value of the wrong type or range.
        """
        if not isinstance(table, Mapping):
            raise InvalidConfigError(f"the [cluster] section must be a table, got {table!r:.100}")
        values: dict[str, Any] = {}
        for key, value in _flattened(table):
            field = _FIELD_OF.get(key)
            if field is None:
                raise InvalidConfigError(f"unknown cluster setting {key!r}; known: "
                                         f"{', '.join(sorted(KAFKA_NAMES.values()))}")
            if field in values:
                raise InvalidConfigError(f"cluster setting {KAFKA_NAMES[field]} is given twice "
                                         f"(as {field} and as {KAFKA_NAMES[field]})")
            values[field] = value
        missing = [KAFKA_NAMES[name] for name in _REQUIRED if name not in values]
        if missing:
            raise InvalidConfigError(f"the [cluster] section must set {', '.join(missing)}")
        return cls(**values)

    def as_mapping(self) -> dict[str, Any]:
        """Every setting by Kafka's dotted name (None values left out): what
        :meth:`from_mapping` takes back."""
        return {KAFKA_NAMES[field.name]: list(value) if isinstance(value, tuple) else value
                for field in dataclasses.fields(self)
                if (value := getattr(self, field.name)) is not None}

    def to_toml(self) -> str:
        """The ``[cluster]`` table as TOML text (every setting, Kafka's names)."""
        lines = ["[cluster]"]
        for name, value in self.as_mapping().items():
            lines.append(f'"{name}" = {_toml_value(value)}')
        return "\n".join(lines) + "\n"

    @property
    def curve(self) -> bool:
        """Do brokers talk over CurveZMQ (else plain TCP)?"""
        return self.security_inter_broker_protocol == "curve"

    @property
    def zookeeper_hosts(self) -> str:
        """``zookeeper_connect`` without its chroot: ``"h1:2181,h2:2181"``."""
        return self.zookeeper_connect.partition("/")[0]

    @property
    def zookeeper_chroot(self) -> str | None:
        """The chroot of ``zookeeper_connect`` (``"/shmlog"``), or None."""
        _, slash, path = self.zookeeper_connect.partition("/")
        return slash + path if slash and path else None

    @property
    def replication_host(self) -> str:
        """The host part of ``replication_endpoint`` (brackets kept for IPv6)."""
        return _ENDPOINT.fullmatch(self.replication_endpoint).group("host")

    @property
    def replication_port(self) -> int:
        """The port of ``replication_endpoint``."""
        return int(_ENDPOINT.fullmatch(self.replication_endpoint).group("port"))


# Each field's Kafka name: Kafka's own where Kafka has the setting, else ours dotted.
KAFKA_NAMES: dict[str, str] = {
    field.name: field.name.replace("_", ".") for field in dataclasses.fields(ClusterConfig)}
KAFKA_NAMES["rack"] = "broker.rack"
_FIELD_OF: dict[str, str] = {**{name: name for name in KAFKA_NAMES},
                             **{dotted: name for name, dotted in KAFKA_NAMES.items()}}
_REQUIRED = tuple(field.name for field in dataclasses.fields(ClusterConfig)
                  if field.default is dataclasses.MISSING)
# Field -> the least value it takes (all up to a 32-bit int).
_INTEGER_LEAST = {
    "broker_id": 0,                     # KafkaConfig: broker.id >= 0 once generated ids are off
    "zookeeper_session_timeout_ms": 1,
    "zookeeper_connection_timeout_ms": 1,
    "replica_lag_time_max_ms": 1,
    "replica_fetch_wait_max_ms": 0,
    # Kafka takes 0 and still returns one batch (KIP-74); a fetch that may return
    # nothing would make no progress, so at least one byte is asked for.
    "replica_fetch_max_bytes": 1,
    "replica_fetch_response_max_bytes": 1,
    "replica_socket_timeout_ms": 1,
    "replica_high_watermark_checkpoint_interval_ms": 1,
    "default_replication_factor": 1,
    "min_insync_replicas": 1,           # KafkaConfig: atLeast(1)
    "forward_delivery_timeout_ms": 1,
    "forward_request_timeout_ms": 1,
    # Kafka validates none of the three below but the interval (atLeast(1)); an attempt
    # count of 0 would never ask, and a percentage is at most 100 (checked apart).
    "controlled_shutdown_max_retries": 1,
    "controlled_shutdown_retry_backoff_ms": 0,
    "leader_imbalance_per_broker_percentage": 0,
    "leader_imbalance_check_interval_seconds": 1,
    "offsets_topic_replication_factor": 1,
    "offsets_commit_timeout_ms": 1,
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_min_isr": 1,
}


def _flattened(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The (dotted name, value) pairs of a table whose bare dotted keys TOML nested."""
    pairs = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            pairs += _flattened(value, f"{name}.")
        else:
            pairs.append((name, value))
    return pairs


def _check_names(config: ClusterConfig) -> None:
    if not isinstance(config.cluster_id, str) or not _NAME.fullmatch(config.cluster_id) or \
            len(config.cluster_id) > limits.CLUSTER_ID_LENGTH_MAX:
        raise InvalidConfigError(f"cluster.id must be 1..{limits.CLUSTER_ID_LENGTH_MAX} "
                                 f"characters of [A-Za-z0-9._-], got {config.cluster_id!r:.100}")
    settings.optional_text("advertised.host", config.advertised_host)
    # Kafka takes any string; racks are names (us-east-1a), and a name cannot break
    # the TOML or JSON it is written into.
    if config.rack is not None and (not isinstance(config.rack, str)
                                    or not _NAME.fullmatch(config.rack)
                                    or len(config.rack) > limits.CLUSTER_ID_LENGTH_MAX):
        raise InvalidConfigError(f"broker.rack must be 1..{limits.CLUSTER_ID_LENGTH_MAX} "
                                 f"characters of [A-Za-z0-9._-] (or absent), "
                                 f"got {config.rack!r:.100}")
    if config.advertised_host is not None and (
            not re.fullmatch(_HOST, config.advertised_host)
            or config.advertised_host in _WILDCARD_HOSTS):
        raise InvalidConfigError(f"advertised.host must be a routable host name or address, "
                                 f"got {config.advertised_host!r:.100}")
    for name in ("unclean_leader_election_enable", "controlled_shutdown_enable",
                 "auto_leader_rebalance_enable"):
        settings.flag(KAFKA_NAMES[name], getattr(config, name))


def _check_numbers(config: ClusterConfig) -> None:
    for name, least in _INTEGER_LEAST.items():
        value = getattr(config, name)
        if value is not None or name != "zookeeper_connection_timeout_ms":
            settings.integer(KAFKA_NAMES[name], value, least, _INT_MAX)
    if config.leader_imbalance_per_broker_percentage > 100:
        raise InvalidConfigError(f"leader.imbalance.per.broker.percentage must be 0..100, got "
                                 f"{config.leader_imbalance_per_broker_percentage}")
    # KafkaConfig.validateValues: a fetch that waits longer than the socket timeout
    # times out for nothing, and one that waits longer than the lag time shrinks the
    # ISR of a follower that is caught up.
    if config.replica_fetch_wait_max_ms > config.replica_socket_timeout_ms:
        raise InvalidConfigError(
            f"replica.socket.timeout.ms ({config.replica_socket_timeout_ms}) must be at least "
            f"replica.fetch.wait.max.ms ({config.replica_fetch_wait_max_ms})")
    if config.replica_fetch_wait_max_ms > config.replica_lag_time_max_ms:
        raise InvalidConfigError(
            f"replica.fetch.wait.max.ms ({config.replica_fetch_wait_max_ms}) must be at most "
            f"replica.lag.time.max.ms ({config.replica_lag_time_max_ms})")


def _check_addresses(config: ClusterConfig) -> None:
    check_zookeeper_connect(config.zookeeper_connect)
    endpoint = config.replication_endpoint
    match = _ENDPOINT.fullmatch(endpoint) if isinstance(endpoint, str) else None
    if match is None or not 1 <= int(match.group("port")) <= _PORT_MAX:
        raise InvalidConfigError(f"replication.endpoint must be tcp://host:port (port "
                                 f"1..{_PORT_MAX}), got {endpoint!r:.100}")
    if match.group("host") in _WILDCARD_HOSTS:
        raise InvalidConfigError(f"replication.endpoint must name a host its peers can reach, "
                                 f"not the wildcard {match.group('host')!r}: {endpoint!r}")


def _check_security(config: ClusterConfig) -> None:
    protocol = config.security_inter_broker_protocol
    if protocol not in SECURITY_PROTOCOLS:
        raise InvalidConfigError(f"security.inter.broker.protocol must be one of "
                                 f"{', '.join(SECURITY_PROTOCOLS)}, got {protocol!r:.100}")
    settings.optional_text(KAFKA_NAMES["curve_secret_key_file"], config.curve_secret_key_file)
    settings.optional_text(KAFKA_NAMES["curve_allowed_public_keys_dir"],
                           config.curve_allowed_public_keys_dir)
    keys = config.curve_allowed_public_keys
    if not isinstance(keys, tuple) or not all(curve_keys.is_z85_key(key) for key in keys):
        raise InvalidConfigError(f"curve.allowed.public.keys must be a list of CURVE public "
                                 f"keys in Z85 (40 characters each), got {keys!r:.200}")
    if not config.curve:
        return
    if config.curve_secret_key_file is None:
        raise InvalidConfigError(
            "curve.secret.key.file must name this broker's secret key file (shmlog cluster "
            "keys makes one) while security.inter.broker.protocol is curve; plain TCP "
            "only with security.inter.broker.protocol = \"plaintext\"")
    if not keys and config.curve_allowed_public_keys_dir is None:
        raise InvalidConfigError(
            "curve.allowed.public.keys or curve.allowed.public.keys.dir must name the peers "
            "this broker accepts while security.inter.broker.protocol is curve; plain TCP "
            "only with security.inter.broker.protocol = \"plaintext\"")


def check_zookeeper_connect(connect: Any) -> str:
    """``connect`` if it is a valid ``zookeeper.connect``: ``host[:port],...[/chroot]``.

    Raises
    ------
    InvalidConfigError
        Not a string, no server, a server that is not ``host[:port]`` (port
        1..65535), or a chroot that is not a znode path (``/a/b``: no empty, ``.``
        or ``..`` part, no trailing slash).
    """
    if not isinstance(connect, str):
        raise InvalidConfigError(f"zookeeper.connect must be a string, got {connect!r:.100}")
    hosts, slash, path = connect.partition("/")
    for server in hosts.split(","):
        match = _ZOOKEEPER_SERVER.fullmatch(server)
        if match is None or (match.group("port") is not None
                             and not 1 <= int(match.group("port")) <= _PORT_MAX):
            raise InvalidConfigError(
                f"zookeeper.connect must be host[:port],host[:port]...[/chroot] (port "
                f"1..{_PORT_MAX}); {server!r} in {connect!r:.200} is not host[:port]")
    if slash and path and any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidConfigError(f"the chroot of zookeeper.connect must be a znode path like "
                                 f"/shmlog (no empty, '.' or '..' part), got {'/' + path!r}")
    return connect


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    assert isinstance(value, str), f"a cluster setting is a bool, int or str, not {value!r}"
    # Checked names and addresses hold no quote, backslash or control character.
    assert re.fullmatch(r"[^\"\\\x00-\x1f\x7f]*", value), f"unquotable {value!r}"
    return f'"{value}"'
