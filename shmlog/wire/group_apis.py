"""Kafka's classic consumer-group protocol over shmlog's group coordinator:
FindCoordinator (0-3), JoinGroup (0-9), SyncGroup (0-5), Heartbeat (0-4) and
LeaveGroup (0-5). Offsets and group listings are in ``group_offsets_apis``.

Rules
-----
* **One coordinator for both kinds of member.** Every request goes to the broker's
  own group service, as shmlog's own consumers' requests do (a cluster member
  forwards it to the group's coordinator), so one group may mix shmlog Consumers
  and Kafka clients, and ``shmlog groups`` shows Kafka clients' groups and lag.
* **The coordinator assigns** (shmlog's design; KIP-848's too). A Kafka member's
  join carries its subscription (Kafka's ConsumerProtocolSubscription: topics, owned
  partitions, generation) under each assignor it offers; the coordinator picks an
  assignor every member offers (range, roundrobin, cooperative-sticky; kafkajs's
  RoundRobinAssigner is roundrobin) and computes
  the assignment. The JoinGroup response therefore names a leader that is no
  member, so every client is a follower, and SyncGroup hands each member the
  coordinator's assignment (a ConsumerProtocolAssignment), whatever a client sends.
  A member offering none of those assignors, or a protocol type other than
  ``consumer`` (Kafka Connect's), gets INCONSISTENT_GROUP_PROTOCOL.
* FindCoordinator names the group's coordinator: in a cluster the leader of the
  group's ``__consumer_offsets`` partition (COORDINATOR_NOT_AVAILABLE while it has
  none, or the topic is being made, which the first FindCoordinator starts, as in
  Kafka); on one broker, itself. A member that asks another broker anyway is still
  served: that broker forwards to the coordinator. For a transactional id (key
  type 1) it names the id's transaction coordinator (``transaction_apis``): in a
  cluster the leader of its ``__transaction_state`` partition, made on the first
  FindCoordinator as the offsets topic is; on one broker, itself.
* Static membership (``group.instance.id``, KIP-345) is the coordinator's
  (``broker/static_members.py``): every request that carries an instance id passes
  it on; a restarted member gets its assignment back without a rebalance, a
  replaced one gets FENCED_INSTANCE_ID, and LeaveGroup (v3+) may name the instance.
* A join waits for its rebalance (held, answered when the coordinator completes
  it); every other request is answered at once, or when its forward returns (a
  LeaveGroup of several members once every one of them has left).
"""

from __future__ import annotations

from ..client.assignors import ASSIGNORS
from ..common.errors import ShmlogError
from . import codec
from .apis import LATER
from .error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    NONE,
    for_error,
)
from .tickets import Gather, ask_service

__all__ = ["GroupApis", "GroupServiceArea", "ServiceArea", "call_service", "COORDINATOR_LEADER"]

FIND_COORDINATOR_KEY = 10
JOIN_GROUP_KEY = 11
HEARTBEAT_KEY = 12
LEAVE_GROUP_KEY = 13
SYNC_GROUP_KEY = 14
CONSUMER_PROTOCOL = "consumer"
TRANSACTION_KEY_TYPE = 1
#: Clients' names for the assignors shmlog runs (the protocol name a client offers,
#: answered back as it offered it): kafkajs calls round robin its RoundRobinAssigner.
ASSIGNOR_ALIASES = {"RoundRobinAssigner": "roundrobin"}
#: The leader every JoinGroup response names: no member, so no client assigns.
COORDINATOR_LEADER = "shmlog-coordinator"


def call_service(core, handler, respond, **fields):
    """Ask a broker service's control ``handler``; the reply (a dict) or the refusal
    (a ShmlogError) goes to ``respond``, which returns the response: now, or
    :data:`LATER` when the service answers later."""
    try:
        reply = ask_service(core, handler, respond, **fields)
    except ShmlogError as refused:
        return respond(refused)
    if reply is None:
        return LATER
    return respond(reply)


class ServiceArea:
    """An area whose requests a broker service answers (its control ``handlers``):
    ``respond`` sends a response that comes later (``KafkaApis.respond``)."""

    def __init__(self, core, respond, handlers: dict) -> None:
        self.core = core
        self._respond = respond
        self._handlers = handlers

    def _call(self, name: str, request, header, build, **fields):
        """Ask the service; ``build(result)`` makes the response, returned now or sent
        once the service answers (then :data:`LATER` is returned). A ``build`` that
        itself asks again later returns :data:`LATER`: its own call sends."""
        answered = []

        def respond(result):
            response = build(result)
            if answered and response is not LATER:    # the service answered later
                self._respond(request, header, response)
            return response

        outcome = call_service(self.core, self._handlers[name], respond, **fields)
        answered.append(True)
        return outcome


class GroupServiceArea(ServiceArea):
    """An area whose requests the broker's group service answers."""

    def __init__(self, core, respond) -> None:
        super().__init__(core, respond, core.groups.handlers())


class GroupApis(GroupServiceArea):
    """The membership APIs on broker ``core``: ``metadata`` names a group's
    coordinator (a LocalMetadata or ClusterMetadata), ``respond`` sends a held
    response (``KafkaApis.respond``)."""

    def __init__(self, core, metadata, respond) -> None:
        super().__init__(core, respond)
        self.metadata = metadata

    def apis(self) -> dict:
        return {FIND_COORDINATOR_KEY: (0, 3, self.find_coordinator),
                JOIN_GROUP_KEY: (0, 9, self.join_group),
                SYNC_GROUP_KEY: (0, 5, self.sync_group),
                HEARTBEAT_KEY: (0, 4, self.heartbeat),
                LEAVE_GROUP_KEY: (0, 5, self.leave_group)}

    # -- FindCoordinator ---------------------------------------------------------------
    def find_coordinator(self, request, header, body):
        cls = codec.response_class(FIND_COORDINATOR_KEY)
        if getattr(body, "key_type", 0) == TRANSACTION_KEY_TYPE:
            coordinator = self.metadata.transaction_coordinator(body.key, request.listener)
        else:
            coordinator = self.metadata.coordinator(body.key, request.listener)
        if coordinator is None:
            return cls(version=header.api_version, throttle_time_ms=0,
                       error_code=COORDINATOR_NOT_AVAILABLE,
                       error_message="the coordinator is not available yet",
                       node_id=-1, host="", port=-1)
        node_id, host, port = coordinator
        return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                   error_message=None, node_id=node_id, host=host, port=port)

    # -- JoinGroup ---------------------------------------------------------------------
    def join_group(self, request, header, body):
        cls = codec.response_class(JOIN_GROUP_KEY)
        version = header.api_version

        def refused(code: int):
            return cls(version=version, throttle_time_ms=0, error_code=code, generation_id=-1,
                       protocol_type=None, protocol_name="", leader="", skip_assignment=False,
                       member_id=body.member_id, members=[])

        offered = [protocol for protocol in body.protocols
                   if ASSIGNOR_ALIASES.get(protocol.name, protocol.name) in ASSIGNORS]
        if body.protocol_type != CONSUMER_PROTOCOL or not offered:
            return refused(INCONSISTENT_GROUP_PROTOCOL)
        try:
            subscription = codec.decode_subscription(offered[0].metadata)
        except ShmlogError:
            return refused(INCONSISTENT_GROUP_PROTOCOL)

        def build(result):
            if isinstance(result, ShmlogError):
                return refused(for_error(result))
            chosen = next((protocol.name for protocol in offered
                           if ASSIGNOR_ALIASES.get(protocol.name, protocol.name) ==
                           result["protocol"]), result["protocol"])
            return cls(version=version, throttle_time_ms=0, error_code=NONE,
                       generation_id=result["generation"], protocol_type=CONSUMER_PROTOCOL,
                       protocol_name=chosen, leader=COORDINATOR_LEADER,
                       skip_assignment=False, member_id=result["member_id"], members=[])

        session = body.session_timeout_ms
        config = self.core.config
        if not config.group_min_session_timeout_ms <= session <= \
                config.group_max_session_timeout_ms:
            return refused(INVALID_SESSION_TIMEOUT)
        rebalance = getattr(body, "rebalance_timeout_ms", -1)
        return self._call("join_group", request, header, build, group_id=body.group_id,
                          member_id=body.member_id, client_id=header.client_id or "",
                          topics=subscription.topics,
                          assignors=[ASSIGNOR_ALIASES.get(protocol.name, protocol.name)
                                     for protocol in offered],
                          session_timeout_ms=session,
                          rebalance_timeout_ms=rebalance if rebalance > 0 else session,
                          owned=subscription.owned, generation=subscription.generation,
                          client_host=request.peer,
                          group_instance_id=getattr(body, "group_instance_id", None))

    # -- SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------
    def sync_group(self, request, header, body):
        cls = codec.response_class(SYNC_GROUP_KEY)

        def build(result):
            if isinstance(result, ShmlogError):
                return cls(version=header.api_version, throttle_time_ms=0,
                           error_code=for_error(result), protocol_type=None, protocol_name=None,
                           assignment=b"")
            return cls(version=header.api_version, throttle_time_ms=0, error_code=NONE,
                       protocol_type=CONSUMER_PROTOCOL, protocol_name=result["protocol"],
                       assignment=codec.encode_assignment(result["assignment"]))

        return self._call("sync_group", request, header, build, group_id=body.group_id,
                          member_id=body.member_id, generation=body.generation_id,
                          group_instance_id=getattr(body, "group_instance_id", None))

    def heartbeat(self, request, header, body):
        cls = codec.response_class(HEARTBEAT_KEY)

        def build(result):
            code = for_error(result) if isinstance(result, ShmlogError) else NONE
            return cls(version=header.api_version, throttle_time_ms=0, error_code=code)

        return self._call("heartbeat", request, header, build, group_id=body.group_id,
                          member_id=body.member_id, generation=body.generation_id,
                          group_instance_id=getattr(body, "group_instance_id", None))

    def leave_group(self, request, header, body):
        cls = codec.response_class(LEAVE_GROUP_KEY)
        version = header.api_version
        # v3+: members by id, or by instance id (a static member's)
        members = [(member.member_id, member.group_instance_id) for member in body.members] \
            if version >= 3 else [(body.member_id, None)]

        def complete(results: dict):
            codes = [for_error(results[index]) if isinstance(results[index], ShmlogError)
                     else NONE for index in range(len(members))]
            return cls(version=version, throttle_time_ms=0,
                       error_code=codes[0] if version < 3 else NONE,
                       members=[cls.MemberResponse(member_id=member_id,
                                                   group_instance_id=instance, error_code=code)
                                for (member_id, instance), code in zip(members, codes)])

        gather = Gather(len(members), complete,
                        lambda response: self._respond(request, header, response))
        for index, (member_id, instance) in enumerate(members):  # a forward's comes later
            def put(result, index=index):
                gather.put(index, result)
                return result
            call_service(self.core, self._handlers["leave_group"], put, group_id=body.group_id,
                         member_id=member_id, group_instance_id=instance)
        return gather.outcome()
