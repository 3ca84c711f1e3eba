"""Kafka's classic consumer-group protocol on one broker: FindCoordinator 0-3,
JoinGroup 0-9, SyncGroup 0-5, Heartbeat 0-4, LeaveGroup 0-5, DescribeGroups 0-5 and
ListGroups 0-4, all over shmlog's own group coordinator
(``broker/group_coordinator.py``), so one group may hold shmlog consumers and Kafka
clients at once.

Rules
-----
* **The coordinator assigns** (shmlog's design, as KIP-848's protocol does; see
  ``group_coordinator``): a Kafka client's JoinGroup is turned into the
  coordinator's terms (its ConsumerProtocolSubscription's topics and owned
  partitions, its protocols that name one of ``assignors.ASSIGNORS``), and every
  member's SyncGroup is answered with the assignment the coordinator computed, as a
  ConsumerProtocolAssignment. The leader is still given every member with its
  metadata (a Kafka client's as it sent it; a shmlog consumer's encoded from its
  subscription), as the classic protocol requires, but the assignments its SyncGroup
  carries are not used: the coordinator's and a client's range, roundrobin and
  cooperative-sticky assignors share their names, not always their choices, and one
  group must have one assignment for members of both kinds.
* Only protocol type ``consumer`` is served (Kafka Connect's ``connect`` groups are
  not): another type, or protocols none of which the coordinator runs, get
  INCONSISTENT_GROUP_PROTOCOL.
* **Static membership (``group.instance.id``) is refused**: the coordinator keeps no
  member across a session's end. A request naming an instance id gets
  UNSUPPORTED_VERSION, as Kafka answers static members where its inter-broker
  version cannot keep them; the broker's log says why.
* JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED with a new id (KIP-394);
  earlier versions are given their new id here, before the coordinator sees them.
* A join waits for its rebalance (:data:`~shmlog.wire.apis.LATER`): its ticket is a
  :class:`~shmlog.broker.service.CallbackTicket` whose reply the broker hands back
  on the loop (``BrokerCore.take_replies``), and the response goes out then.
* FindCoordinator names this broker for a group; for a transactional id (key type
  1) it answers COORDINATOR_NOT_AVAILABLE: this broker has no transactions.
* Served on one broker only (``kafka_listener`` leaves these APIs out in a
  cluster, where a group's coordinator is the leader of its offsets partition).

Theory of operation
-------------------
Every handler runs on the broker's loop thread and calls the coordinator's request
methods directly, with the time and (for a join) a callback ticket; the
coordinator's :class:`~shmlog.common.errors.ShmlogError` refusals become Kafka error
codes (``error_codes.for_error``). The protocol metadata a Kafka member joined with is
kept here by member id (the coordinator needs only what it decodes to) and dropped
once the coordinator no longer has that member.
"""

from __future__ import annotations

import logging

from ..broker.service import CallbackTicket
from ..client.assignors import ASSIGNORS
from ..common.errors import GroupIdNotFoundError, KafkaRequestError, ShmlogError
from ..groups import GroupState, new_member_id
from ..record.records import now_ms
from . import codec
from .apis import LATER
from .error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_REQUEST,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    UNKNOWN_MEMBER_ID,
    UNSUPPORTED_VERSION,
    for_error,
)

__all__ = ["GroupApis", "member_metadata", "static_member"]

log = logging.getLogger("shmlog.broker.kafka")

FIND_COORDINATOR_KEY, JOIN_GROUP_KEY, HEARTBEAT_KEY, LEAVE_GROUP_KEY = 10, 11, 12, 13
SYNC_GROUP_KEY, DESCRIBE_GROUPS_KEY, LIST_GROUPS_KEY = 14, 15, 16

_GROUP_KEY_TYPE, _TRANSACTION_KEY_TYPE = 0, 1
# DescribeGroups' authorized operations when the client did not ask for them:
# kafka-python's bit set, None for Kafka's INT32_MIN ("not given").
_OPERATIONS_NOT_ASKED = None


def _protocol_type(group) -> str:
    """A group's protocol type: ``consumer`` while it has members; a group of
    committed offsets only has none (a client reads it as a simple consumer group)."""
    return codec.CONSUMER_PROTOCOL_TYPE if group.members else ""


def static_member(request, header, body) -> int | None:
    """UNSUPPORTED_VERSION for a request of a static member (group.instance.id set),
    else None."""
    instance = getattr(body, "group_instance_id", None)
    if instance is None:
        return None
    log.warning("Kafka listener: %s from %s names group.instance.id %r: this broker's "
                "coordinator has no static membership; unset group.instance.id",
                header.describe(), request.peer, instance)
    return UNSUPPORTED_VERSION


def member_metadata(coordinator, protocols: dict, member, topics, protocol) -> bytes:
    """What ``member`` joined with for the group's ``protocol``: a Kafka member's
    bytes as given (``protocols``: {member id: {protocol: metadata}}), a shmlog
    consumer's subscription encoded as Kafka's consumer protocol."""
    given = protocols.get(member.member_id)
    if given is not None:
        return given.get(protocol, b"")
    return codec.encode_subscription(coordinator.subscribed_topics(member, topics),
                                     member.owned, member.owned_generation)


class GroupApis:
    """The membership APIs of the groups of ``core`` (a BrokerCore), answered as
    broker ``node`` ((node id, host, port) of this broker)."""

    def __init__(self, core, node: tuple[int, str, int], respond) -> None:
        self.core = core
        self.coordinator = core.groups.coordinator
        self.node = node
        self.respond = respond          # KafkaApis.respond: a held join's response
        self.protocols: dict[str, dict[str, bytes]] = {}    # Kafka members' metadata

    def apis(self) -> dict:
        return {FIND_COORDINATOR_KEY: (0, 3, self.find_coordinator),
                JOIN_GROUP_KEY: (0, 9, self.join_group),
                SYNC_GROUP_KEY: (0, 5, self.sync_group),
                HEARTBEAT_KEY: (0, 4, self.heartbeat),
                LEAVE_GROUP_KEY: (0, 5, self.leave_group),
                DESCRIBE_GROUPS_KEY: (0, 5, self.describe_groups),
                LIST_GROUPS_KEY: (0, 4, self.list_groups)}

    # -- FindCoordinator -----------------------------------------------------------------
    def find_coordinator(self, request, header, body):
        cls = codec.response_class(FIND_COORDINATOR_KEY)
        key_type = body.key_type if header.api_version >= 1 else _GROUP_KEY_TYPE
        node_id, host, port = self.node
        if key_type == _GROUP_KEY_TYPE:
            return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                       error_message=None, node_id=node_id, host=host, port=port)
        error, message = (COORDINATOR_NOT_AVAILABLE, "this broker has no transaction "
                          "coordinator: shmlog does not serve Kafka transactions") \
            if key_type == _TRANSACTION_KEY_TYPE else \
            (INVALID_REQUEST, f"unknown coordinator key type {key_type}")
        log.info("Kafka listener: FindCoordinator from %s for %r: %s", request.peer,
                 body.key, message)
        return cls(version=header.api_version, throttle_time_ms=0, error_code=error,
                   error_message=message, node_id=-1, host="", port=-1)

    # -- JoinGroup -----------------------------------------------------------------------
    def join_group(self, request, header, body):
        version = header.api_version
        refused = self._refuse_join(request, header, body)
        if refused is not None:
            return self._join_refused(version, refused, body.member_id)
        protocols = {protocol.name: bytes(protocol.metadata) for protocol in body.protocols}
        offered = [name for name in protocols if name in ASSIGNORS]
        try:
            subscription = codec.decode_subscription(protocols[offered[0]])
        except KafkaRequestError as error:
            log.warning("Kafka listener: JoinGroup of group %r from %s: %s", body.group_id,
                        request.peer, error)
            return self._join_refused(version, INCONSISTENT_GROUP_PROTOCOL, body.member_id)
        member_id, new = body.member_id, not body.member_id
        if new:
            member_id = new_member_id(header.client_id or "")
            if version >= 4:      # KIP-394: the client joins again with this id
                return self._join_refused(version, MEMBER_ID_REQUIRED, member_id)
        self._forget_gone()
        self.protocols[member_id] = protocols
        ticket = CallbackTicket(lambda result: self._joined(request, header, body.group_id,
                                                            member_id, result))
        try:
            self.coordinator.join_group(
                body.group_id, member_id, header.client_id or "", subscription.topics, None,
                offered, body.session_timeout_ms,
                body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms,
                [list(entry) for entry in subscription.owned],
                -1 if new else subscription.generation, request.peer,
                ticket=ticket, now=now_ms())
        except ShmlogError as error:
            log.info("Kafka listener: JoinGroup of group %r from %s refused: %s",
                     body.group_id, request.peer, error)
            return self._join_refused(version, for_error(error), member_id)
        return LATER

    def _refuse_join(self, request, header, body) -> int | None:
        """The error code of a join this broker cannot take, else None."""
        if not body.group_id:
            why, code = "an empty group id", INVALID_GROUP_ID
        elif body.protocol_type != codec.CONSUMER_PROTOCOL_TYPE:
            why, code = f"protocol type {body.protocol_type!r} (only " \
                        f"{codec.CONSUMER_PROTOCOL_TYPE!r} is served)", INCONSISTENT_GROUP_PROTOCOL
        elif not any(protocol.name in ASSIGNORS for protocol in body.protocols):
            why, code = (f"protocols {[protocol.name for protocol in body.protocols]} "
                         f"(this broker's coordinator runs {', '.join(ASSIGNORS)})",
                         INCONSISTENT_GROUP_PROTOCOL)
        elif (code := static_member(request, header, body)) is not None:
            return code
        elif not (self.coordinator.config.group_min_session_timeout_ms
                  <= body.session_timeout_ms
                  <= self.coordinator.config.group_max_session_timeout_ms):
            why, code = (f"session timeout {body.session_timeout_ms} ms, outside the "
                         f"broker's group_min/max_session_timeout_ms", INVALID_SESSION_TIMEOUT)
        else:
            return None
        log.warning("Kafka listener: JoinGroup of group %r from %s refused: %s",
                    body.group_id, request.peer, why)
        return code

    def _join_refused(self, version: int, code: int, member_id: str):
        return codec.response_class(JOIN_GROUP_KEY)(
            version=version, throttle_time_ms=0, error_code=code, generation_id=-1,
            protocol_type=None, protocol_name=None if version >= 7 else "", leader="",
            skip_assignment=False, member_id=member_id, members=[])

    def _joined(self, request, header, group_id: str, member_id: str, result) -> None:
        """The coordinator's answer to a join it held: the JoinGroup response."""
        version = header.api_version
        if isinstance(result, ShmlogError):
            response = self._join_refused(version, for_error(result), member_id)
        else:
            cls = codec.response_class(JOIN_GROUP_KEY)
            members = []
            group = self.coordinator.groups.get(group_id)
            if result["leader"] == member_id and group is not None:
                topics = self.core.host.partition_counts()
                members = [cls.JoinGroupResponseMember(
                    member_id=member.member_id, group_instance_id=None,
                    metadata=member_metadata(self.coordinator, self.protocols, member, topics,
                                             result["protocol"]))
                    for member in group.members.values()]
            response = cls(version=version, throttle_time_ms=0, error_code=NONE,
                           generation_id=result["generation"],
                           protocol_type=codec.CONSUMER_PROTOCOL_TYPE,
                           protocol_name=result["protocol"], leader=result["leader"],
                           skip_assignment=False, member_id=member_id, members=members)
        self.respond(request, header, response)

    def _forget_gone(self) -> None:
        """Drop the metadata of Kafka members the coordinator no longer has."""
        present = {member_id for group in self.coordinator.groups.values()
                   for member_id in group.members}
        for member_id in [member_id for member_id in self.protocols
                          if member_id not in present]:
            del self.protocols[member_id]

    # -- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------
    def sync_group(self, request, header, body):
        """The member's assignment: the coordinator's (the leader's is not used)."""
        version = header.api_version
        cls = codec.response_class(SYNC_GROUP_KEY)
        error, assignment, protocol = static_member(request, header, body), b"", None
        if error is None and version >= 5 and body.protocol_type not in (
                None, codec.CONSUMER_PROTOCOL_TYPE):
            error = INCONSISTENT_GROUP_PROTOCOL
        if error is None:
            try:
                result = self.coordinator.sync_group(body.group_id, body.member_id,
                                                     body.generation_id, ticket=None,
                                                     now=now_ms())
                assignment = codec.encode_assignment(tuple(entry)
                                                     for entry in result["assignment"])
                protocol, error = result["protocol"], NONE
            except ShmlogError as refused:
                error = for_error(refused)
        return cls(version=version, throttle_time_ms=0, error_code=error,
                   protocol_type=codec.CONSUMER_PROTOCOL_TYPE if protocol else None,
                   protocol_name=protocol, assignment=assignment)

    def heartbeat(self, request, header, body):
        error = static_member(request, header, body)
        if error is None:
            try:
                self.coordinator.heartbeat(body.group_id, body.member_id, body.generation_id,
                                           ticket=None, now=now_ms())
                error = NONE
            except ShmlogError as refused:
                error = for_error(refused)
        return codec.response_class(HEARTBEAT_KEY)(version=header.api_version,
                                                   throttle_time_ms=0, error_code=error)

    def leave_group(self, request, header, body):
        """A member leaves (v3+: a batch of members, each answered)."""
        version = header.api_version
        cls = codec.response_class(LEAVE_GROUP_KEY)
        if version < 3:
            return cls(version=version, throttle_time_ms=0,
                       error_code=self._leave(body.group_id, body.member_id), members=[])
        answers = []
        for member in body.members:
            error = UNSUPPORTED_VERSION if member.group_instance_id is not None else \
                self._leave(body.group_id, member.member_id)
            answers.append(cls.MemberResponse(member_id=member.member_id,
                                              group_instance_id=member.group_instance_id,
                                              error_code=error))
        return cls(version=version, throttle_time_ms=0, error_code=NONE, members=answers)

    def _leave(self, group_id: str, member_id: str) -> int:
        self.protocols.pop(member_id, None)
        try:
            self.coordinator.leave_group(group_id, member_id, ticket=None, now=now_ms())
        except GroupIdNotFoundError:
            return UNKNOWN_MEMBER_ID             # a group that is gone has no such member
        except ShmlogError as refused:
            return for_error(refused)
        return NONE

    # -- DescribeGroups, ListGroups ------------------------------------------------------
    def describe_groups(self, request, header, body):
        cls = codec.response_class(DESCRIBE_GROUPS_KEY)
        return cls(version=header.api_version, throttle_time_ms=0,
                   groups=[self._described(cls.DescribedGroup, group_id)
                           for group_id in body.groups])

    def _described(self, described, group_id: str):
        group = self.coordinator.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:      # Kafka: Dead, no error
            return described(error_code=NONE, error_message=None, group_id=group_id,
                             group_state=GroupState.DEAD.value, protocol_type="",
                             protocol_data="", members=[],
                             authorized_operations=_OPERATIONS_NOT_ASKED)
        topics = self.core.host.partition_counts()
        return described(
            error_code=NONE, error_message=None, group_id=group_id,
            group_state=group.state.value,
            protocol_type=_protocol_type(group),
            protocol_data=group.protocol or "",
            members=[described.DescribedGroupMember(
                member_id=member.member_id, group_instance_id=None,
                client_id=member.client_id, client_host=member.client_host,
                member_metadata=member_metadata(self.coordinator, self.protocols, member,
                                                topics, group.protocol),
                member_assignment=codec.encode_assignment(member.assignment))
                for member in group.members.values()],
            authorized_operations=_OPERATIONS_NOT_ASKED)

    def list_groups(self, request, header, body):
        cls = codec.response_class(LIST_GROUPS_KEY)
        wanted = set(body.states_filter or ()) if header.api_version >= 4 else set()
        groups = [cls.ListedGroup(group_id=group.group_id,
                                  protocol_type=_protocol_type(group),
                                  group_state=group.state.value)
                  for group in sorted(self.coordinator.groups.values(),
                                      key=lambda group: group.group_id)
                  if group.state is not GroupState.DEAD
                  and (not wanted or group.state.value in wanted)]
        return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                   groups=groups)
