"""State-change notices: how every broker learns each partition state written, a
batch at a time (sans-I/O; Kafka's controller sends LeaderAndIsr and UpdateMetadata
requests, and its leaders write ``/isr_change_notification`` for the controller).

Each multi-op that writes partition states also creates one sequential znode under
``/state_changes`` naming every state it wrote, with the zkVersion each now has::

    /state_changes/change-0000000042   {"version":1,"states":[
                                          ["<topic>","<topic id>",<partition>,<zkVersion>,
                                           {"version":1,"leader":1,"leader_epoch":4,
                                            "isr":[1,2],"controller_epoch":7}], ...]}

Rules
-----
* **Every state write announces itself, in its own multi**: an op that writes a
  state carries a :class:`StateWrite` (``state_set_op``, ``state_create_op``), and
  whoever commits ops that carry one adds :func:`notice_op` to the same multi, so
  the notice exists exactly when the states it names do. A state written without
  one would be learned by no broker until its next reconnection:
  ``ControllerElection`` refuses such ops.
* **The state inside is the znode's body as written**, byte for byte, so a notice
  costs no encoding of its own, and is decoded and checked as the znode is
  (``paths.decode_partition_state``).
* **A notice names the topic's id**: a topic deleted and created again restarts
  its versions at 0, and an old notice read late must not pass for the new topic.
* A notice is kept ``limits.STATE_CHANGE_RETENTION_S`` after the controller first
  lists it, then deleted by the controller; a reader that cannot have read every
  notice since its last look (it reconnected) reads every state it holds again.

Theory of operation
-------------------
Before notices, each broker kept a data watch on every partition state: a failover
at 10,000 partitions sent each broker 10,000 notifications and took 10,000 reads
back, one Python packet each, on the same two cores as the elections. Now a
failover is a handful of multis, each broker hears a handful of children events,
and reads a handful of notices in one pipeline (``watches.ClusterWatch``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, NamedTuple

from ...common.errors import ZnodeFormatError
from . import paths as zk_paths
from .paths import PartitionState
from .session import CreateOp, Op, SetDataOp

__all__ = ["STATE_CHANGES_PATH", "STATE_CHANGE_PREFIX", "STATE_CHANGE_VERSION", "StateWrite",
           "StateChange", "state_set_op", "state_create_op", "notice_op", "encode_notice",
           "decode_notice", "notice_sequence", "is_state_path"]

STATE_CHANGES_PATH = zk_paths.STATE_CHANGES_PATH
STATE_CHANGE_PREFIX = f"{STATE_CHANGES_PATH}/change-"
STATE_CHANGE_VERSION = 1
_STATE_SUFFIX = "/state"


@dataclasses.dataclass(frozen=True)
class StateWrite:
    """What a state-writing op tells the brokers: which partition of which topic
    incarnation, and the zkVersion its state has once the op is applied."""
    topic: str
    topic_id: str
    partition: int
    zk_version: int


class StateChange(NamedTuple):
    """One state a notice names, decoded."""
    topic: str
    topic_id: str
    partition: int
    state: PartitionState
    zk_version: int


def state_set_op(topic: str, topic_id: str, partition: int, state: PartitionState,
                 version: int) -> SetDataOp:
    """The op that writes ``state`` over the one at zkVersion ``version``."""
    return SetDataOp(zk_paths.partition_state_path(topic, partition),
                     zk_paths.encode_partition_state(state), version,
                     notice=StateWrite(topic, topic_id, partition, version + 1))


def state_create_op(topic: str, topic_id: str, partition: int,
                    state: PartitionState) -> CreateOp:
    """The op that creates a partition's first state (zkVersion 0)."""
    return CreateOp(zk_paths.partition_state_path(topic, partition),
                    zk_paths.encode_partition_state(state),
                    notice=StateWrite(topic, topic_id, partition, 0))


def notice_op(ops: Iterable[Op]) -> CreateOp | None:
    """The notice of the states ``ops`` write, to go in their multi; None when they
    write none."""
    written = [(op.notice, op.body) for op in ops if getattr(op, "notice", None) is not None]
    if not written:
        return None
    return CreateOp(STATE_CHANGE_PREFIX, encode_notice(written), sequential=True)


def encode_notice(written: Iterable[tuple[StateWrite, bytes]]) -> bytes:
    """A notice's body: each (write, the state's znode body)."""
    entries = b",".join(
        b"[%s,%s,%d,%d,%s]" % (json.dumps(write.topic).encode(),
                               json.dumps(write.topic_id).encode(),
                               write.partition, write.zk_version, body)
        for write, body in written)
    return b'{"version":%d,"states":[%s]}' % (STATE_CHANGE_VERSION, entries)


def decode_notice(body: bytes, what: str = "state-change notice") -> tuple[StateChange, ...]:
    """The states a notice names, each checked as its znode's body would be.

    Raises
    ------
    ZnodeFormatError
        The notice (or one state in it) is not as written here.
    """
    try:
        fields = json.loads(bytes(body).decode("utf-8"))
    except (TypeError, UnicodeDecodeError, ValueError) as error:
        raise ZnodeFormatError(f"{what}: not JSON ({error})") from None
    if not isinstance(fields, dict) or fields.get("version") != STATE_CHANGE_VERSION or \
            not isinstance(fields.get("states"), list):
        raise ZnodeFormatError(f"{what}: not a version {STATE_CHANGE_VERSION} notice "
                               f"with a list of states")
    return tuple(_change(entry, what) for entry in fields["states"])


def _change(entry, what: str) -> StateChange:
    if not (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str)
            and isinstance(entry[1], str) and _count(entry[2]) and _count(entry[3])
            and isinstance(entry[4], dict)):
        raise ZnodeFormatError(f"{what}: an entry is not [topic, topic id, partition, "
                               f"zkVersion, state]: {str(entry)[:200]}")
    topic, topic_id, partition, version, state = entry
    state_what = f"{what}: {zk_paths.partition_state_path(topic, partition)}"
    return StateChange(topic, topic_id, partition,
                       zk_paths.partition_state_from_fields(state, state_what), version)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31


def notice_sequence(name: str) -> int | None:
    """A notice's sequence number from its znode name (``change-0000000042``); None
    for a child that is not a notice."""
    prefix = STATE_CHANGE_PREFIX.rsplit("/", 1)[1]
    digits = name[len(prefix):] if name.startswith(prefix) else ""
    return int(digits) if digits.isdigit() else None


def is_state_path(path: str) -> bool:
    """Whether ``path`` is a partition's state znode."""
    return path.startswith(zk_paths.TOPICS_PATH + "/") and path.endswith(_STATE_SUFFIX) \
        and "/partitions/" in path
