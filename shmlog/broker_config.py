"""A broker's settings: defaults, then a TOML file, then flags, each checked.

Light: the ``shmlog`` command builds the ``broker`` verb's options from
:class:`BrokerConfig` whatever verb it runs, so this module imports neither numpy
nor numba (``broker`` imports it back under its old name).

A TOML file holds the broker's settings in a ``[broker]`` table (or at its top
level) and, for a broker that joins a cluster, a top-level ``[cluster]`` table
(:class:`~shmlog.cluster_config.ClusterConfig`). Without that table
:attr:`BrokerConfig.cluster` is None: the single-host broker, with no ZooKeeper.
"""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

from . import access
from .cluster_config import ClusterConfig
from .errors import InvalidConfigError, LocalProtocolError
from .limits import METRICS_PORT_MAX
from .paths import control_address, default_data_dir

__all__ = ["BrokerConfig"]


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Broker settings; a TOML file and flags override the defaults."""
    data_dir: str = dataclasses.field(default_factory=default_data_dir)
    # Rows of the partition state table: the most partitions one broker hosts.
    partitions_max: int = 4096
    # Kafka's log.retention.check.interval.ms default.
    retention_check_interval_ms: int = 300_000
    # How often flush.ms is checked for idle partitions (Kafka checks per its
    # log.flush.scheduler.interval.ms; a second keeps flush.ms honest).
    flush_check_interval_ms: int = 1_000
    # How often registered producers are checked for being alive.
    liveness_check_interval_ms: int = 1_000
    # Kafka's log.cleaner.backoff.ms: how often compacted partitions are looked at.
    cleaner_backoff_ms: int = 15_000
    # Kafka's log.cleaner.dedupe.buffer.size: the memory of the cleaner's key map.
    cleaner_dedupe_buffer_size: int = 128 << 20
    # Kafka's group settings, same names and defaults.
    group_initial_rebalance_delay_ms: int = 3_000
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_topic_num_partitions: int = 50
    offsets_retention_minutes: int = 10_080
    # Share the data with this group (directories 0750, files 0640, the control socket
    # and shared memory 0660: see ``access``); None keeps it private to the broker's user.
    data_group: str | None = None
    # The Prometheus endpoint (``prometheus``): off unless a port is given; 0 takes a
    # free port (``shmlog status`` shows which). Bound to loopback unless told: the
    # metrics name topics and groups, which a host's other users may not see.
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    # The [cluster] table: None is a single-host broker (no ZooKeeper, no replication).
    cluster: ClusterConfig | None = None

    _MAY_BE_ZERO = ("group_initial_rebalance_delay_ms", "metrics_port")
    TEXT_SETTINGS = ("data_dir", "data_group", "metrics_address")
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
