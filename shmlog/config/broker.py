"""A broker's settings: defaults, then a TOML file, then flags, each checked.

Light: the ``shmlog`` command builds the ``broker`` verb's options from
:class:`BrokerConfig` whatever verb it runs, so this module imports neither numpy
nor numba (``broker`` imports it back under its old name).

A TOML file holds the broker's settings in a ``[broker]`` table (or at its top
level) and, for a broker that joins a cluster, a top-level ``[cluster]`` table
(:class:`~shmlog.config.cluster.ClusterConfig`). Without that table
:attr:`BrokerConfig.cluster` is None: the single-host broker, with no ZooKeeper.
"""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

from ..common import access
from ..common.documented import setting
from ..common.errors import InvalidConfigError, LocalProtocolError
from ..common.limits import (
    KAFKA_CONNECTION_SETUP_MS_DEFAULT,
    KAFKA_CONNECTIONS_IDLE_MS_DEFAULT,
    KAFKA_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
    KAFKA_REQUEST_SIZE_MAX_DEFAULT,
    METRICS_PORT_MAX,
    PRODUCERS_MAX_DEFAULT,
    TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
)
from ..common.paths import control_address, default_data_dir
from .cluster import ClusterConfig

__all__ = ["BrokerConfig", "broker_config_entries"]


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Broker settings; a TOML file and flags override the defaults."""
    data_dir: str = setting(
        default_factory=default_data_dir,
        doc="The broker's data directory: topics, group offsets, its control socket "
            "(run/control.sock). Default: $SHMLOG_DATA_DIR, else ~/.local/share/shmlog.")
    partitions_max: int = setting(
        16384, doc="Rows of the partition state table in shared memory: the most "
                   "partitions (of all topics, internal ones included) one broker hosts "
                   "(64 bytes of /dev/shm each).")
    producers_max: int = setting(
        PRODUCERS_MAX_DEFAULT,
        doc="The most producers (each with its ring in /dev/shm, which the broker maps) "
            "one broker drains at once; a producer past it is refused with "
            "TooManyProducersError at construction. Rings left by a broker that stopped "
            "are drained whatever their number.")
    retention_check_interval_ms: int = setting(
        300_000, doc="How often retention.ms and retention.bytes are applied (Kafka's "
                     "log.retention.check.interval.ms).")
    flush_check_interval_ms: int = setting(
        1_000, doc="How often idle partitions are checked against flush.ms (Kafka's "
                   "log.flush.scheduler.interval.ms; a second keeps flush.ms honest).")
    liveness_check_interval_ms: int = setting(
        1_000, doc="How often registered producers are checked for being alive; a dead "
                   "producer's ring is drained and reclaimed.")
    cleaner_backoff_ms: int = setting(
        15_000, doc="How often compacted partitions are looked at for cleaning (Kafka's "
                    "log.cleaner.backoff.ms).")
    cleaner_dedupe_buffer_size: int = setting(
        128 << 20, doc="Bytes of the cleaner's key map (Kafka's "
                       "log.cleaner.dedupe.buffer.size).")
    group_initial_rebalance_delay_ms: int = setting(
        3_000, doc="How long a new group waits for more members before its first "
                   "rebalance (Kafka's group.initial.rebalance.delay.ms); 0 allowed.")
    group_min_session_timeout_ms: int = setting(
        6_000, doc="The least session timeout a member may ask for (Kafka's "
                   "group.min.session.timeout.ms).")
    group_max_session_timeout_ms: int = setting(
        1_800_000, doc="The largest session timeout a member may ask for (Kafka's "
                       "group.max.session.timeout.ms).")
    offsets_topic_num_partitions: int = setting(
        50, doc="Partitions of __consumer_offsets, made when the first group commits "
                "(Kafka's offsets.topic.num.partitions).")
    offsets_retention_minutes: int = setting(
        10_080, doc="How long an empty group's committed offsets are kept (Kafka's "
                    "offsets.retention.minutes).")
    transaction_state_log_num_partitions: int = setting(
        50, doc="Partitions of __transaction_state, made when the first transactional "
                "producer initialises (Kafka's transaction.state.log.num.partitions).")
    transactional_id_expiration_ms: int = setting(
        TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
        doc="How long the transaction coordinator keeps a transactional id with no "
            "transaction under way after its last use (Kafka's "
            "transactional.id.expiration.ms).")
    transaction_max_timeout_ms: int = setting(
        900_000, doc="The longest transaction timeout a producer may ask for (Kafka's "
                     "transaction.max.timeout.ms).")
    data_group: str | None = setting(
        None, doc="Share the data with this Unix group (directories 0750, files and the "
                  "partition state table 0640, the control socket, rings and doorbells "
                  "0660); unset keeps it private to the broker's user.")
    metrics_port: int | None = setting(
        None, doc="Serve Prometheus metrics over HTTP on this port (0: a free one, which "
                  "shmlog status shows); off unless set.")
    metrics_address: str = setting(
        "127.0.0.1", doc="The address the metrics endpoint listens on: loopback unless "
                         "told (the metrics name topics and groups, which a host's other "
                         "users may not see).")
    listeners: str | None = setting(
        None, doc="Kafka's listeners: where Kafka clients connect, comma-separated "
                  "PROTOCOL://host:port (e.g. PLAINTEXT://127.0.0.1:9092; port 0: a free "
                  "one, which shmlog status shows). Off unless set.")
    advertised_listeners: str | None = setting(
        None, doc="Kafka's advertised.listeners: the host:port clients are told to "
                  "connect to, when it differs from listeners (behind NAT, a container).")
    socket_request_max_bytes: int = setting(
        KAFKA_REQUEST_SIZE_MAX_DEFAULT,
        doc="The largest request a Kafka client may send (Kafka's "
            "socket.request.max.bytes); a larger one closes its connection.")
    connections_max_idle_ms: int = setting(
        KAFKA_CONNECTIONS_IDLE_MS_DEFAULT,
        doc="A Kafka client's connection idle this long is closed (Kafka's "
            "connections.max.idle.ms).")
    max_connections_per_ip: int = setting(
        KAFKA_CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
        doc="The most Kafka connections one client address may hold (Kafka's "
            "max.connections.per.ip); one over it is closed at once.")
    listener_security_protocol_map: str | None = setting(
        None, doc="Kafka's listener.security.protocol.map: comma-separated NAME:PROTOCOL "
                  "(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) for listeners named otherwise "
                  "(EXTERNAL:SASL_SSL); written, it replaces the default map of each "
                  "protocol to itself. A listener off loopback must be SASL_SSL unless "
                  "its protocol is written here or in listeners.")
    connection_setup_timeout_ms: int = setting(
        KAFKA_CONNECTION_SETUP_MS_DEFAULT,
        doc="A connection to a TLS or SASL listener that has not finished its TLS "
            "handshake and SASL login within this is closed (librdkafka's client-side "
            "bound is socket.connection.setup.timeout.ms).")
    ssl_certificate_location: str | None = setting(
        None, doc="The TLS listeners' certificate chain, a PEM file, leaf first "
                  "(librdkafka's ssl.certificate.location; Kafka's JKS keystores are not "
                  "read). Required for an SSL or SASL_SSL listener.")
    ssl_key_location: str | None = setting(
        None, doc="Its private key, a PEM file readable by the broker's user only (chmod "
                  "600); a symbolic link is followed. Required for an SSL or SASL_SSL "
                  "listener.")
    ssl_key_password: str | None = setting(
        None, doc="The password of an encrypted ssl_key_location (never shown by "
                  "describe_configs).")
    ssl_ca_location: str | None = setting(
        None, doc="CA certificates (PEM) client certificates are checked against; needed "
                  "by ssl_client_auth.")
    ssl_client_auth: str | None = setting(
        None, doc="Kafka's ssl.client.auth: none, requested or required (a client "
                  "certificate signed by ssl_ca_location). Unset: none.")
    ssl_enabled_protocols: str | None = setting(
        None, doc="Kafka's ssl.enabled.protocols: TLSv1.2 and/or TLSv1.3, comma-separated; "
                  "unset: both. Older versions are refused (RFC 8996).")
    ssl_cipher_suites: str | None = setting(
        None, doc="OpenSSL's cipher list for TLS 1.2 (librdkafka's ssl.cipher.suites); "
                  "unset: Python's defaults (forward secrecy, AEAD).")
    sasl_enabled_mechanisms: str | None = setting(
        None, doc="Kafka's sasl.enabled.mechanisms for SASL listeners: PLAIN, "
                  "SCRAM-SHA-256, SCRAM-SHA-512, comma-separated. Unset: SCRAM-SHA-256 "
                  "and SCRAM-SHA-512 (PLAIN sends the password itself: written only).")
    sasl_credentials_file: str | None = setting(
        None, doc="The users SASL listeners log in (TOML of SCRAM credentials, no "
                  "passwords; python -m shmlog.wire.credentials USER prints an entry), "
                  "mode 600, no symbolic link. Required for a SASL_SSL or SASL_PLAINTEXT "
                  "listener; read when the broker starts.")
    auto_create_topics_enable: bool = setting(
        True, doc="Create a topic a Kafka client asks Metadata for, if it does not exist "
                  "(Kafka's auto.create.topics.enable), with num_partitions partitions.")
    num_partitions: int = setting(
        1, doc="Partitions of a topic created on first use (Kafka's num.partitions).")
    cluster: ClusterConfig | None = setting(
        None, doc="The [cluster] table of the config file (see Cluster settings); "
                  "without it the broker is a single-host broker, with no ZooKeeper.")

    _MAY_BE_ZERO = ("group_initial_rebalance_delay_ms", "metrics_port")
    TEXT_SETTINGS = ("data_dir", "data_group", "metrics_address", "listeners",
                     "advertised_listeners", "listener_security_protocol_map",
                     "ssl_certificate_location", "ssl_key_location", "ssl_key_password",
                     "ssl_ca_location", "ssl_client_auth", "ssl_enabled_protocols",
                     "ssl_cipher_suites", "sasl_enabled_mechanisms", "sasl_credentials_file")
    # Settings whose value is a secret: describe_broker_config never shows it.
    SECRET_SETTINGS = ("ssl_key_password",)
    BOOLEAN_SETTINGS = ("auto_create_topics_enable",)
    # Settings that are whole tables of the file, not flags.
    TABLE_SETTINGS = ("cluster",)

    def __post_init__(self):
        # Refused here, before a broker creates its directory or shared memory.
        control_address(self.data_dir)

    @classmethod
    def load(cls, path: str | None = None, **overrides: Any) -> "BrokerConfig":
        """Defaults, then the TOML file's ``[broker]`` table (or top level) and its
        ``[cluster]`` table, then ``overrides`` (None values ignored; ``cluster`` may
        be a :class:`ClusterConfig` or a table).

        Raises
        ------
        LocalProtocolError
            The file cannot be read, or a broker setting is unknown or out of range.
        InvalidConfigError
            The ``[cluster]`` table is invalid (a subclass of LocalProtocolError).
        """
        values: dict[str, Any] = {}
        if path:
            try:
                with open(path, "rb") as source:
                    document = tomllib.load(source)
            except (OSError, tomllib.TOMLDecodeError) as error:
                raise LocalProtocolError(f"cannot read broker config {path}: {error}") from None
            values.update(document.get("broker", document))
            if "broker" in document and "cluster" in values:
                raise InvalidConfigError(f"{path}: the cluster settings go in a top-level "
                                         f"[cluster] table, not in [broker]")
            if "cluster" in document:
                values["cluster"] = document["cluster"]
        values.update({key: value for key, value in overrides.items() if value is not None})
        if "cluster" in values and not isinstance(values["cluster"], ClusterConfig):
            values["cluster"] = ClusterConfig.from_mapping(values["cluster"])
        known = {field.name: field for field in dataclasses.fields(cls)}
        for key, value in values.items():
            if key in cls.TABLE_SETTINGS:
                continue
            if key not in known:
                raise LocalProtocolError(f"unknown broker setting {key!r}; known: "
                                         f"{', '.join(sorted(known))}")
            if key in cls.BOOLEAN_SETTINGS:
                values[key] = value = _boolean(key, value)
                continue
            expected = str if key in cls.TEXT_SETTINGS else int
            least = 0 if key in cls._MAY_BE_ZERO else 1
            if isinstance(value, bool) or not isinstance(value, expected) or \
                    (expected is int and value < least):
                raise LocalProtocolError(f"broker setting {key} must be "
                                         f"{'a non-negative' if least == 0 else 'a positive'} "
                                         f"{expected.__name__}, got {value!r}")
        if values.get("metrics_port") is not None and values["metrics_port"] > METRICS_PORT_MAX:
            raise LocalProtocolError(f"broker setting metrics_port must be a TCP port (at most "
                                     f"{METRICS_PORT_MAX}), got {values['metrics_port']!r}")
        if values.get("data_group") is not None:
            try:
                access.group_id_of(values["data_group"])
            except KeyError:
                raise LocalProtocolError(f"broker setting data_group names no group of this "
                                         f"host: {values['data_group']!r}") from None
        return cls(**values)

    @property
    def data_access(self) -> access.Access:
        """Who may read the data (see ``access``)."""
        return access.Access(None if self.data_group is None
                             else access.group_id_of(self.data_group))


def _boolean(key: str, value: Any) -> bool:
    """A boolean setting: true or false in TOML, or as a flag's text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise LocalProtocolError(f"broker setting {key} must be true or false, got {value!r}")


def broker_config_entries(config: BrokerConfig) -> dict[str, dict[str, Any]]:
    """The broker's settings as ``{name: {"value": ..., "source": ...}}`` (what
    ``Admin.describe_configs`` shows for a BROKER resource): ``"broker"`` when its
    file or flags set a value other than the default, else ``"default"`` (Kafka's
    STATIC_BROKER_CONFIG and DEFAULT_CONFIG; these settings are static). The
    ``[broker]`` table's settings keep their names; the ``[cluster]`` table's take
    Kafka's (``min_insync_replicas`` is ``min.insync.replicas``)."""
    entries = {}
    tables = [(config, False)] + ([(config.cluster, True)] if config.cluster is not None else [])
    for table, kafka_names in tables:
        for field in dataclasses.fields(table):
            if field.name in BrokerConfig.TABLE_SETTINGS:
                continue
            value = getattr(table, field.name)
            if field.default is not dataclasses.MISSING:
                default = field.default
            elif field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            else:
                default = dataclasses.MISSING            # required: always set
            source = "default" if value == default else "broker"
            if field.name in BrokerConfig.SECRET_SETTINGS and value is not None:
                value = None                             # Kafka's sensitive: null
            entries[field.name.replace("_", ".") if kafka_names else field.name] = {
                "value": value, "source": source}
    return entries
