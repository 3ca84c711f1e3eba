"""Cluster mode's ZooKeeper layout: every znode's path and body, in one place (sans-I/O).

Cluster metadata lives in ZooKeeper as Kafka kept it before KRaft (Kafka 2.8's
``ZkData.scala`` names), all under the chroot of ``zookeeper.connect``::

    /cluster/id                                 {"version":"1","id":"<cluster id>"}
    /brokers/ids/<id>                ephemeral  {"version":1,"host":..,"replication":"tcp://h:p",
                                                 "rack":"r1"|null,"timestamp":"<ms>","pid":n,
                                                 "curve_public_key":"<Z85>" (optional)}
    /controller                      ephemeral  {"version":1,"brokerid":1,"timestamp":"<ms>"}
    /controller_epoch                           "7"  (plain text, as Kafka)
    /brokers/topics/<t>                         {"version":3,"topic_id":"<32 hex>",
                                                 "partitions":{"0":[1,2,3]},
                                                 "adding_replicas":{},"removing_replicas":{}}
    /brokers/topics/<t>/partitions/<p>/state    {"version":1,"leader":1,"leader_epoch":4,
                                                 "isr":[1,2],"controller_epoch":7}
    /config/topics/<t>                          {"version":1,"config":{"min.insync.replicas":"2"}}
    /admin/delete_topics/<t>                    empty: the topic is to be deleted
    /admin/reassign_partitions                  {"version":1,"partitions":[{"topic":"t",
                                                 "partition":0,"replicas":[1,2,4]}]}
    /config/brokers/<id>                        {"version":1,"config":
                                                 {"leader.replication.throttled.rate":"1000"}}
    /latest_producer_id_block                   {"version":1,"broker":1,"block_start":"0",
                                                 "block_end":"999"}
    /admin/controlled_shutdown/<id>  ephemeral  {"version":1,"broker_epoch":"<czxid>"}
    /admin/preferred_replica_election           {"version":1,"partitions":
                                                 [{"topic":"t","partition":0}]}
    /state_changes/change-<seq>      sequential  {"version":1,"states":[["t","<topic id>",0,
                                                 <zkVersion>,{<the state's body>}]]}

Rules
-----
* No I/O and no kazoo: path builders and ``encode_*``/``decode_*`` pairs over bytes.
  ``client`` (its parts) does the reading and writing.
* A body read from ZooKeeper came from another broker (or an operator): every
  decoder checks each field's type and range and raises :class:`ZnodeFormatError`
  (a :class:`PeerProtocolError`) for anything else, never a KeyError or TypeError.
* Extra fields are ignored, as Kafka's readers ignore them, so a newer writer's
  additions do not break an older reader; a ``version`` we do not know is refused.
* Ids in JSON are integers; Kafka writes timestamps and producer-id bounds as
  strings, and so do we (JSON readers in other languages lose 64-bit integers).
* A partition state with ``leader == NO_LEADER`` (-1) has no leader: its ISR then
  holds the replicas that were last in sync (Kafka keeps the last one), so a
  clean election can pick one of them when it comes back.
* ``/admin/controlled_shutdown/<id>`` is ours (Kafka sends the controller a
  ControlledShutdownRequest): a broker asks to have its leaderships moved before it
  leaves by creating it in its own session, so it goes when the broker does; it
  carries the broker epoch, so the controller ignores one left by an earlier
  incarnation. ``/admin/preferred_replica_election`` is Kafka's znode and body
  (``PreferredReplicaElectionZNode``): the controller elects the partitions it
  lists and deletes it.

Theory of operation
-------------------
The broker registration's czxid is the broker's epoch (KIP-380): a broker that
restarts or loses its session registers again and gets a new one, which tells the
controller that it bounced even when it comes back under the same id. The state
znodes are written only conditionally on their zkVersion, so of two writers (the
controller, the leader shrinking its ISR) the later one learns of the earlier
one's write instead of overwriting it; the controller's writes are also fenced by
the zkVersion of ``/controller_epoch`` (see ``controller_election.ControllerElection.
checked_multi``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Mapping

from ...common.errors import InvalidTopicError, ZnodeFormatError
from ...config.curve_keys import is_z85_key

__all__ = [
    "CLUSTER_PATH", "CLUSTER_ID_PATH", "BROKERS_PATH", "BROKER_IDS_PATH", "TOPICS_PATH",
    "CONTROLLER_PATH", "CONTROLLER_EPOCH_PATH", "CONFIG_PATH", "TOPIC_CONFIGS_PATH",
    "ADMIN_PATH", "DELETE_TOPICS_PATH", "PRODUCER_ID_BLOCK_PATH", "BASE_PATHS", "NO_LEADER",
    "REASSIGN_PARTITIONS_PATH", "BROKER_CONFIGS_PATH", "broker_config_path",
    "encode_reassignment", "decode_reassignment", "encode_broker_config",
    "decode_broker_config",
    "CONTROLLED_SHUTDOWN_PATH", "PREFERRED_REPLICA_ELECTION_PATH", "controlled_shutdown_path",
    "encode_controlled_shutdown", "decode_controlled_shutdown",
    "encode_preferred_replica_election", "decode_preferred_replica_election",
    "PRODUCER_ID_BLOCK_SIZE", "PRODUCER_ID_MAX",
    "broker_path", "topic_path", "partitions_path", "partition_path", "partition_state_path",
    "topic_config_path", "delete_topic_path", "new_topic_id",
    "BrokerRegistration", "ControllerRegistration", "PartitionState", "TopicAssignment",
    "ProducerIdBlock",
    "encode_cluster_id", "decode_cluster_id", "encode_broker_registration",
    "decode_broker_registration", "encode_controller", "decode_controller",
    "encode_controller_epoch", "decode_controller_epoch", "encode_topic_assignment",
    "decode_topic_assignment", "encode_topic_config", "decode_topic_config",
    "encode_partition_state", "decode_partition_state", "partition_state_from_fields",
    "STATE_CHANGES_PATH", "encode_producer_id_block",
    "decode_producer_id_block", "decode_broker_id", "decode_partition_number",
]

CLUSTER_PATH = "/cluster"
CLUSTER_ID_PATH = "/cluster/id"
BROKERS_PATH = "/brokers"
BROKER_IDS_PATH = "/brokers/ids"
TOPICS_PATH = "/brokers/topics"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
CONFIG_PATH = "/config"
TOPIC_CONFIGS_PATH = "/config/topics"
ADMIN_PATH = "/admin"
DELETE_TOPICS_PATH = "/admin/delete_topics"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
# An operator's request to move replicas (Kafka's ReassignPartitionsZNode); the
# controller removes each partition from it as its move completes.
REASSIGN_PARTITIONS_PATH = "/admin/reassign_partitions"
# Dynamic broker configs (Kafka's ConfigEntityZNode for brokers): the replication
# throttle rates.
BROKER_CONFIGS_PATH = "/config/brokers"
CONTROLLED_SHUTDOWN_PATH = "/admin/controlled_shutdown"
PREFERRED_REPLICA_ELECTION_PATH = "/admin/preferred_replica_election"
# Each multi-op that writes partition states leaves a notice of them here
# (``state_changes``): how the brokers learn them.
STATE_CHANGES_PATH = "/state_changes"
# What every broker makes sure exists at start (Kafka's createTopLevelPaths); the
# producer-id block starts empty, which reads as "no block handed out yet".
BASE_PATHS = (BROKER_IDS_PATH, TOPICS_PATH, TOPIC_CONFIGS_PATH, DELETE_TOPICS_PATH,
              CLUSTER_PATH, PRODUCER_ID_BLOCK_PATH, CONTROLLED_SHUTDOWN_PATH, STATE_CHANGES_PATH)

# The leader of a partition that has none (Kafka's LeaderAndIsr.NoLeader).
NO_LEADER = -1
# Producer ids a broker takes per write of /latest_producer_id_block (Kafka's
# ProducerIdManager.PidBlockSize).
PRODUCER_ID_BLOCK_SIZE = 1000
# The largest producer id: a batch header's producer id is a signed int64.
PRODUCER_ID_MAX = (1 << 63) - 1
# Broker ids are Kafka's non-negative int32.
BROKER_ID_MAX = (1 << 31) - 1

CLUSTER_ID_VERSION = "1"            # Kafka writes this one as a string
BROKER_VERSION = 1
CONTROLLER_VERSION = 1
TOPIC_VERSION = 3                   # Kafka 2.8's: the first with a topic id
TOPIC_CONFIG_VERSION = 1
PARTITION_STATE_VERSION = 1
PRODUCER_ID_BLOCK_VERSION = 1
REASSIGNMENT_VERSION = 1
BROKER_CONFIG_VERSION = 1
CONTROLLED_SHUTDOWN_VERSION = 1
PREFERRED_REPLICA_ELECTION_VERSION = 1

_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def _topic_segment(topic: str) -> str:
    """``topic`` as one path segment. The full naming rules are the log manager's
    (checked when a topic is created); this refuses only what would leave the
    topic's own znode."""
    if not isinstance(topic, str) or not topic or "/" in topic or topic in (".", ".."):
        raise InvalidTopicError(f"{topic!r} cannot name a topic's znode")
    return topic


def broker_path(broker_id: int) -> str:
    """``/brokers/ids/<id>``: the broker's ephemeral registration."""
    return f"{BROKER_IDS_PATH}/{int(broker_id)}"


def topic_path(topic: str) -> str:
    """``/brokers/topics/<t>``: the topic's replica assignment."""
    return f"{TOPICS_PATH}/{_topic_segment(topic)}"


def partitions_path(topic: str) -> str:
    """``/brokers/topics/<t>/partitions``."""
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    """``/brokers/topics/<t>/partitions/<p>``."""
    return f"{partitions_path(topic)}/{int(partition)}"


def partition_state_path(topic: str, partition: int) -> str:
    """``/brokers/topics/<t>/partitions/<p>/state``: leader, epoch and ISR."""
    return f"{partition_path(topic, partition)}/state"


def topic_config_path(topic: str) -> str:
    """``/config/topics/<t>``: the topic's configuration overrides."""
    return f"{TOPIC_CONFIGS_PATH}/{_topic_segment(topic)}"


def delete_topic_path(topic: str) -> str:
    """``/admin/delete_topics/<t>``: the marker asking the controller to delete ``t``."""
    return f"{DELETE_TOPICS_PATH}/{_topic_segment(topic)}"


def broker_config_path(broker_id: int) -> str:
    """``/config/brokers/<id>``: the broker's dynamic configs (throttle rates)."""
    return f"{BROKER_CONFIGS_PATH}/{int(broker_id)}"
def controlled_shutdown_path(broker_id: int) -> str:
    """``/admin/controlled_shutdown/<id>``: broker ``id`` asks to have its leaderships
    moved before it leaves (ephemeral, in its session)."""
    return f"{CONTROLLED_SHUTDOWN_PATH}/{int(broker_id)}"


def new_topic_id() -> str:
    """A new cluster-wide topic id: 32 lowercase hex digits (a random UUID), the form
    ``state.topic_key`` derives a ring entry's topic key from."""
    return uuid.uuid4().hex


# --- the bodies -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BrokerRegistration:
    """What ``/brokers/ids/<id>`` says of a live broker.

    ``host`` is the name clients and Spark see; ``replication_endpoint`` the
    ``tcp://host:port`` its peers fetch from; ``rack`` None when not rack-aware;
    ``curve_public_key`` the CurveZMQ public key (Z85) its endpoint serves with, None
    when it talks plain TCP. Peers connect only to a key they were configured to
    allow: ZooKeeper is not trusted with keys, the field only says which one it is.
    """
    broker_id: int
    host: str
    replication_endpoint: str
    rack: str | None = None
    timestamp_ms: int = 0
    pid: int = 0
    curve_public_key: str | None = None
    #: Where Kafka clients reach it: its advertised listeners, ``PROTOCOL://host:port``
    #: (Kafka's ``endpoints``); empty when it has no Kafka listener.
    kafka_endpoints: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ControllerRegistration:
    """What ``/controller`` says: the elected controller's broker id."""
    broker_id: int
    timestamp_ms: int = 0


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """A partition's leader (``NO_LEADER`` when none), leader epoch, in-sync replicas
    (leader included) and the epoch of the controller that last wrote it (Kafka's
    LeaderIsrAndControllerEpoch)."""
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self):
        object.__setattr__(self, "isr", tuple(self.isr))

    @property
    def has_leader(self) -> bool:
        """Whether a leader is named (``leader != NO_LEADER``)."""
        return self.leader != NO_LEADER


@dataclasses.dataclass(frozen=True)
class TopicAssignment:
    """A topic's cluster-wide id and its replicas, partition by partition, in
    preferred order (the first is the preferred leader). While a partition is
    reassigned (KIP-455), ``adding_replicas`` and ``removing_replicas`` name the
    replicas of its list that are joining and leaving; partitions not moving are
    absent from both."""
    topic: str
    topic_id: str
    partitions: Mapping[int, tuple[int, ...]]
    adding_replicas: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("partitions", "adding_replicas", "removing_replicas"):
            object.__setattr__(self, name, {int(partition): tuple(replicas) for
                                            partition, replicas in
                                            sorted(getattr(self, name).items())})


@dataclasses.dataclass(frozen=True)
class ProducerIdBlock:
    """Producer ids ``block_start..block_end`` (both included), taken by ``broker_id``."""
    broker_id: int
    block_start: int
    block_end: int


def _dumps(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _object(body: bytes | None, what: str) -> dict:
    """``body`` as a JSON object, or ZnodeFormatError."""
    if not isinstance(body, (bytes, bytearray)):
        raise ZnodeFormatError(f"{what}: no body (got {type(body).__name__})")
    try:
        value = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ZnodeFormatError(f"{what}: not JSON ({error}): {bytes(body)[:200]!r}") from None
    if not isinstance(value, dict):
        raise ZnodeFormatError(f"{what}: a JSON {type(value).__name__}, expected an object")
    return value


def _field(body: dict, name: str, kind: type | tuple, what: str, default: Any = ...) -> Any:
    if name not in body:
        if default is not ...:
            return default
        raise ZnodeFormatError(f"{what}: no {name!r} field in {body}")
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ZnodeFormatError(f"{what}: {name!r} is {value!r}, expected "
                               f"{getattr(kind, '__name__', kind)}")
    return value


def _integer(body: dict, name: str, what: str, low: int, high: int = PRODUCER_ID_MAX,
             default: Any = ...) -> int:
    value = _field(body, name, int, what, default)
    if not low <= value <= high:
        raise ZnodeFormatError(f"{what}: {name!r} is {value}, expected {low}..{high}")
    return value


def _decimal(body: dict, name: str, what: str, default: Any = ...) -> int:
    """A non-negative integer Kafka writes as a decimal string (timestamps, ids)."""
    text = _field(body, name, str, what, default)
    if text is default:
        return text
    if not _DECIMAL.fullmatch(text) or int(text) > PRODUCER_ID_MAX:
        raise ZnodeFormatError(f"{what}: {name!r} is {text!r}, expected a decimal int64")
    return int(text)


def _version(body: dict, expected: Any, what: str) -> None:
    if body.get("version") != expected:
        raise ZnodeFormatError(f"{what}: version {body.get('version')!r}, this broker reads "
                               f"version {expected!r}")


def _broker_ids(value: Any, name: str, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(item, bool) or not isinstance(item, int)
                                          or not 0 <= item <= BROKER_ID_MAX for item in value):
        raise ZnodeFormatError(f"{what}: {name} is {value!r}, expected a list of broker ids")
    if len(set(value)) != len(value):
        raise ZnodeFormatError(f"{what}: {name} {value} names a broker twice")
    return tuple(value)


def decode_broker_id(name: str) -> int:
    """A child name of ``/brokers/ids`` as a broker id."""
    if not isinstance(name, str) or not _DECIMAL.fullmatch(name) or int(name) > BROKER_ID_MAX:
        raise ZnodeFormatError(f"{BROKER_IDS_PATH}/{name!r} does not name a broker id")
    return int(name)


def decode_partition_number(name: str, what: str = "partition") -> int:
    """A partition number written as a decimal string (a JSON key, a child name)."""
    if not isinstance(name, str) or not _DECIMAL.fullmatch(name) or int(name) > BROKER_ID_MAX:
        raise ZnodeFormatError(f"{what}: {name!r} is not a partition number")
    return int(name)


def encode_cluster_id(cluster_id: str) -> bytes:
    """``/cluster/id``'s body."""
    return _dumps({"version": CLUSTER_ID_VERSION, "id": cluster_id})


def decode_cluster_id(body: bytes) -> str:
    """The cluster id in ``/cluster/id``'s body."""
    what = CLUSTER_ID_PATH
    fields = _object(body, what)
    _version(fields, CLUSTER_ID_VERSION, what)
    cluster_id = _field(fields, "id", str, what)
    if not cluster_id:
        raise ZnodeFormatError(f"{what}: the cluster id is empty")
    return cluster_id


def encode_broker_registration(registration: BrokerRegistration) -> bytes:
    """``/brokers/ids/<id>``'s body (the id is the path, not the body)."""
    body = {"version": BROKER_VERSION, "host": registration.host,
            "replication": registration.replication_endpoint, "rack": registration.rack,
            "timestamp": str(registration.timestamp_ms), "pid": registration.pid}
    if registration.curve_public_key is not None:      # optional: older readers ignore it
        body["curve_public_key"] = registration.curve_public_key
    if registration.kafka_endpoints:                   # optional too
        body["endpoints"] = list(registration.kafka_endpoints)
    return _dumps(body)


def decode_broker_registration(broker_id: int, body: bytes) -> BrokerRegistration:
    """The registration of broker ``broker_id`` from its znode's body."""
    what = broker_path(broker_id)
    fields = _object(body, what)
    _version(fields, BROKER_VERSION, what)
    rack = fields.get("rack")
    if rack is not None and not isinstance(rack, str):
        raise ZnodeFormatError(f"{what}: 'rack' is {rack!r}, expected a string or null")
    public_key = fields.get("curve_public_key")
    if public_key is not None and not is_z85_key(public_key):
        raise ZnodeFormatError(f"{what}: 'curve_public_key' is {public_key!r:.100}, expected "
                               f"a CURVE public key in Z85 (40 characters) or absent")
    endpoints = fields.get("endpoints", [])
    if not isinstance(endpoints, list) or not all(isinstance(entry, str) and "://" in entry
                                                  for entry in endpoints):
        raise ZnodeFormatError(f"{what}: 'endpoints' is {endpoints!r:.100}, expected a list of "
                               f"PROTOCOL://host:port")
    return BrokerRegistration(broker_id, _field(fields, "host", str, what),
                              _field(fields, "replication", str, what), rack,
                              _decimal(fields, "timestamp", what, 0),
                              _integer(fields, "pid", what, 0, default=0), public_key,
                              tuple(endpoints))


def encode_controller(registration: ControllerRegistration) -> bytes:
    """``/controller``'s body."""
    return _dumps({"version": CONTROLLER_VERSION, "brokerid": registration.broker_id,
                   "timestamp": str(registration.timestamp_ms)})


def decode_controller(body: bytes) -> ControllerRegistration:
    """Who ``/controller`` names."""
    what = CONTROLLER_PATH
    fields = _object(body, what)
    _version(fields, CONTROLLER_VERSION, what)
    return ControllerRegistration(_integer(fields, "brokerid", what, 0, BROKER_ID_MAX),
                                  _decimal(fields, "timestamp", what, 0))


def encode_controller_epoch(epoch: int) -> bytes:
    """``/controller_epoch``'s body: the epoch in decimal, as Kafka writes it."""
    assert epoch >= 0, epoch
    return str(epoch).encode()


def decode_controller_epoch(body: bytes) -> int:
    """The epoch in ``/controller_epoch``'s body."""
    text = bytes(body or b"").decode("ascii", "replace").strip()
    if not _DECIMAL.fullmatch(text) or int(text) > BROKER_ID_MAX:
        raise ZnodeFormatError(f"{CONTROLLER_EPOCH_PATH}: {bytes(body or b'')[:40]!r} is not a "
                               f"controller epoch")
    return int(text)


def encode_topic_assignment(assignment: TopicAssignment) -> bytes:
    """``/brokers/topics/<t>``'s body (Kafka's TopicZNode version 3, its topic id ours)."""
    def listed(partitions: Mapping[int, tuple[int, ...]]) -> dict:
        return {str(partition): list(replicas) for partition, replicas in partitions.items()
                if replicas}
    return _dumps({"version": TOPIC_VERSION, "topic_id": assignment.topic_id,
                   "partitions": listed(assignment.partitions),
                   "adding_replicas": listed(assignment.adding_replicas),
                   "removing_replicas": listed(assignment.removing_replicas)})


def decode_topic_assignment(topic: str, body: bytes) -> TopicAssignment:
    """Topic ``topic``'s assignment from its znode's body."""
    what = topic_path(topic)
    fields = _object(body, what)
    _version(fields, TOPIC_VERSION, what)
    topic_id = _field(fields, "topic_id", str, what)
    if not _TOPIC_ID.fullmatch(topic_id):
        raise ZnodeFormatError(f"{what}: topic_id {topic_id!r} is not 32 lowercase hex digits")
    raw = _field(fields, "partitions", dict, what)
    if not raw:
        raise ZnodeFormatError(f"{what}: no partitions")
    partitions = {decode_partition_number(key, what): _broker_ids(replicas, f"partition {key}",
                                                                   what)
                  for key, replicas in raw.items()}
    if sorted(partitions) != list(range(len(partitions))):
        raise ZnodeFormatError(f"{what}: partitions {sorted(partitions)} are not 0..n-1")
    if any(not replicas for replicas in partitions.values()):
        raise ZnodeFormatError(f"{what}: a partition has no replicas: {raw}")
    moving = [_moving_replicas(fields, name, partitions, what)
              for name in ("adding_replicas", "removing_replicas")]
    return TopicAssignment(topic, topic_id, partitions, *moving)


def _moving_replicas(fields: dict, name: str, partitions: Mapping[int, tuple[int, ...]],
                     what: str) -> dict[int, tuple[int, ...]]:
    """``adding_replicas`` or ``removing_replicas`` (absent: none, as an older writer
    leaves them): each a subset of its partition's replicas."""
    raw = _field(fields, name, dict, what, {})
    moving = {decode_partition_number(key, what): _broker_ids(replicas, f"{name} {key}", what)
              for key, replicas in raw.items()}
    for partition, replicas in moving.items():
        if not set(replicas) <= set(partitions.get(partition, ())):
            raise ZnodeFormatError(f"{what}: {name} of partition {partition} {list(replicas)} "
                                   f"are not all among its replicas")
    return {partition: replicas for partition, replicas in moving.items() if replicas}


def encode_topic_config(config: Mapping[str, str]) -> bytes:
    """``/config/topics/<t>``'s body: Kafka-named overrides, values as strings."""
    return _encode_config(TOPIC_CONFIG_VERSION, config)


def decode_topic_config(topic: str, body: bytes) -> dict[str, str]:
    """Topic ``topic``'s configuration overrides (Kafka names, string values)."""
    return _decode_config(body, TOPIC_CONFIG_VERSION, topic_config_path(topic))


def _encode_config(version: int, config: Mapping[str, str]) -> bytes:
    """A config znode's body (Kafka's ConfigEntityZNode): string values."""
    return _dumps({"version": version,
                   "config": {str(name): str(value) for name, value in config.items()}})


def _decode_config(body: bytes, version: int, what: str) -> dict[str, str]:
    fields = _object(body, what)
    _version(fields, version, what)
    config = _field(fields, "config", dict, what)
    if any(not isinstance(value, str) for value in config.values()):
        raise ZnodeFormatError(f"{what}: config values must be strings: {config}")
    return dict(config)


def encode_partition_state(state: PartitionState) -> bytes:
    """A partition's ``state`` body (Kafka's TopicPartitionStateZNode)."""
    return _dumps({"version": PARTITION_STATE_VERSION, "leader": state.leader,
                   "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                   "controller_epoch": state.controller_epoch})


def decode_partition_state(body: bytes, what: str = "partition state") -> PartitionState:
    """A partition's ``state`` body; ``what`` (its path) names it in errors."""
    return partition_state_from_fields(_object(body, what), what)


def partition_state_from_fields(fields: dict, what: str) -> PartitionState:
    """A partition state from its body's JSON object (a state-change notice carries
    them so), checked as :func:`decode_partition_state` checks a body."""
    _version(fields, PARTITION_STATE_VERSION, what)
    leader = _integer(fields, "leader", what, NO_LEADER, BROKER_ID_MAX)
    isr = _broker_ids(_field(fields, "isr", list, what), "isr", what)
    if leader != NO_LEADER and leader not in isr:
        raise ZnodeFormatError(f"{what}: leader {leader} is not in the ISR {list(isr)}")
    return PartitionState(leader, _integer(fields, "leader_epoch", what, 0, BROKER_ID_MAX), isr,
                          _integer(fields, "controller_epoch", what, 0, BROKER_ID_MAX))


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    """``/latest_producer_id_block``'s body (Kafka's ProducerIdBlockZNode)."""
    return _dumps({"version": PRODUCER_ID_BLOCK_VERSION, "broker": block.broker_id,
                   "block_start": str(block.block_start), "block_end": str(block.block_end)})


def decode_producer_id_block(body: bytes) -> ProducerIdBlock | None:
    """The last block handed out, or None while the znode is empty (none yet)."""
    if not body:
        return None
    what = PRODUCER_ID_BLOCK_PATH
    fields = _object(body, what)
    _version(fields, PRODUCER_ID_BLOCK_VERSION, what)
    block = ProducerIdBlock(_integer(fields, "broker", what, 0, BROKER_ID_MAX),
                            _decimal(fields, "block_start", what),
                            _decimal(fields, "block_end", what))
    if block.block_end < block.block_start:
        raise ZnodeFormatError(f"{what}: block_end {block.block_end} < block_start "
                               f"{block.block_start}")
    return block


def encode_reassignment(partitions: Mapping[tuple[str, int], tuple[int, ...]]) -> bytes:
    """``/admin/reassign_partitions``' body: each partition's target replicas
    (Kafka's ReassignPartitionsZNode, version 1)."""
    return _dumps({"version": REASSIGNMENT_VERSION,
                   "partitions": [{"topic": topic, "partition": partition,
                                   "replicas": list(replicas)}
                                  for (topic, partition), replicas in sorted(partitions.items())]})


def decode_reassignment(body: bytes, what: str = REASSIGN_PARTITIONS_PATH
                        ) -> dict[tuple[str, int], tuple[int, ...]]:
    """The target replicas of each partition a reassignment request names (also
    the body of ``--reassignment-json-file``: ``what`` names it in errors). A
    partition named twice, an empty or repeating replica list is refused."""
    fields = _object(body, what)
    _version(fields, REASSIGNMENT_VERSION, what)
    entries = _field(fields, "partitions", list, what)
    partitions: dict[tuple[str, int], tuple[int, ...]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ZnodeFormatError(f"{what}: a partition entry is {entry!r}, expected an object")
        topic = _field(entry, "topic", str, what)
        partition = _integer(entry, "partition", what, 0, BROKER_ID_MAX)
        replicas = _broker_ids(_field(entry, "replicas", list, what),
                               f"replicas of {topic}-{partition}", what)
        if not replicas:
            raise ZnodeFormatError(f"{what}: {topic}-{partition} has no replicas")
        if (topic, partition) in partitions:
            raise ZnodeFormatError(f"{what}: {topic}-{partition} is named twice")
        partitions[(topic, partition)] = replicas
    return partitions


def encode_broker_config(config: Mapping[str, str]) -> bytes:
    """``/config/brokers/<id>``'s body: Kafka-named dynamic configs, string values."""
    return _encode_config(BROKER_CONFIG_VERSION, config)


def decode_broker_config(broker_id: int, body: bytes) -> dict[str, str]:
    """Broker ``broker_id``'s dynamic configs."""
    return _decode_config(body, BROKER_CONFIG_VERSION, broker_config_path(broker_id))
# --- controlled shutdown and preferred election -----------------------------------------

def encode_controlled_shutdown(broker_epoch: int) -> bytes:
    """``/admin/controlled_shutdown/<id>``'s body: the asking incarnation's broker epoch
    (a string, as Kafka writes 64-bit numbers)."""
    assert broker_epoch >= 0, broker_epoch
    return _dumps({"version": CONTROLLED_SHUTDOWN_VERSION, "broker_epoch": str(broker_epoch)})


def decode_controlled_shutdown(broker_id: int, body: bytes) -> int:
    """The broker epoch in broker ``broker_id``'s controlled-shutdown znode."""
    what = controlled_shutdown_path(broker_id)
    fields = _object(body, what)
    _version(fields, CONTROLLED_SHUTDOWN_VERSION, what)
    return _decimal(fields, "broker_epoch", what)


def encode_preferred_replica_election(partitions) -> bytes:
    """``/admin/preferred_replica_election``'s body (Kafka's
    ``PreferredReplicaElectionZNode``) for (topic, partition) pairs."""
    return _dumps({"version": PREFERRED_REPLICA_ELECTION_VERSION,
                   "partitions": [{"topic": _topic_segment(topic), "partition": int(partition)}
                                  for topic, partition in partitions]})


def decode_preferred_replica_election(body: bytes) -> tuple[tuple[str, int], ...]:
    """The (topic, partition) pairs a preferred replica election asks for, sorted,
    each once (Kafka refuses duplicates at the command; the controller needs each
    once)."""
    what = PREFERRED_REPLICA_ELECTION_PATH
    fields = _object(body, what)
    _version(fields, PREFERRED_REPLICA_ELECTION_VERSION, what)
    listed = _field(fields, "partitions", list, what)
    pairs = set()
    for entry in listed:
        if not isinstance(entry, dict):
            raise ZnodeFormatError(f"{what}: {entry!r} is not a {{topic, partition}} object")
        topic = _field(entry, "topic", str, what)
        try:
            _topic_segment(topic)
        except InvalidTopicError as error:
            raise ZnodeFormatError(f"{what}: {error}") from None
        pairs.add((topic, _integer(entry, "partition", what, 0, BROKER_ID_MAX)))
    return tuple(sorted(pairs))
