"""Transaction requests between brokers (TRANSACTION messages): a client's request
forwarded to its coordinator, and the brokers' own (verifications, expectations,
markers), each carried as its control frame's text, as group requests are.

Rules
-----
* A request to another broker goes over the replication endpoint and waits
  ``forward_request_timeout_ms`` for its reply; no reply, a peer that cannot be
  reached or refuses the message, is ``CoordinatorNotAvailableError`` (retriable).
* A request this broker would send to itself is served in place, as a peer's would
  be: one code path whichever broker coordinates or leads.
* A request or reply longer than ``limits.GROUP_FORWARD_TEXT_LENGTH_MAX`` characters
  is refused before it is sent, with a typed error.
* A peer's request is answered through its :class:`PeerTicket`, now or later; a
  request served in place through its :class:`CallbackTicket`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from ..common import limits
from ..common.errors import CoordinatorNotAvailableError, LocalProtocolError, ShmlogError
from ..protocol.control import decode_reply, encode_request, encode_result, handle_frame
from ..zmq_replication import ReceivedRequest
from .replication.messages import Error, TransactionRequest, TransactionResponse
from .replication.replica_service import ReplicaService

log = logging.getLogger("shmlog.transactions")

__all__ = ["TransactionChannel", "PeerTicket", "CallbackTicket"]

Answered = Callable[[dict | ShmlogError], None]


@dataclasses.dataclass(frozen=True, eq=False)
class PeerTicket:
    """The ticket of a request a peer sent: answered over the replication endpoint."""
    request: ReceivedRequest


@dataclasses.dataclass(frozen=True, eq=False)
class CallbackTicket:
    """The ticket of a request this broker made of itself: its reply is handed to
    ``answered``."""
    answered: Answered


class TransactionChannel:
    """This broker's end of the TRANSACTION requests (see the module's rules).

    Parameters
    ----------
    replication : ReplicaService
    broker_id : int
    timeout_ms : int
        How long a request to a peer waits (``forward_request_timeout_ms``).
    handlers : callable
        ``handlers(ticket)``: the request handlers serving a peer's request (or this
        broker's own), answering later through ``ticket``.
    """

    def __init__(self, replication: ReplicaService, broker_id: int, timeout_ms: int,
                 handlers: Callable[[PeerTicket | CallbackTicket], dict]):
        self.replication = replication
        self.broker_id = broker_id
        self.timeout_ms = timeout_ms
        self.handlers = handlers

    def ask(self, broker_id: int, name: str, fields: dict, answered: Answered) -> None:
        """Send a request to ``broker_id`` (served in place when that is this
        broker); ``answered`` gets its reply, or the error it ended in."""
        if broker_id == self.broker_id:
            reply = handle_frame(encode_request(name, **fields),
                                 self.handlers(CallbackTicket(answered)))
            if reply is not None:
                answered(_decoded(reply))
            return
        text = encode_request(name, **fields).decode()
        if len(text) > limits.GROUP_FORWARD_TEXT_LENGTH_MAX:
            answered(LocalProtocolError(
                f"a {name} of {len(text)} characters is longer than a forwarded request "
                f"carries ({limits.GROUP_FORWARD_TEXT_LENGTH_MAX})"))
            return

        def on_reply(body) -> None:
            if isinstance(body, TransactionResponse):
                answered(_decoded(body.reply.encode()))
            elif body is None:
                answered(CoordinatorNotAvailableError(
                    f"broker {broker_id} did not answer a {name} in time"))
            else:
                detail = body.message if isinstance(body, Error) else type(body).__name__
                answered(CoordinatorNotAvailableError(
                    f"broker {broker_id} refused a {name}: {detail}"))
        try:
            self.replication.ask(broker_id, TransactionRequest(text), self.timeout_ms, on_reply)
        except ShmlogError as error:
            answered(CoordinatorNotAvailableError(f"cannot reach broker {broker_id}: {error}"))

    def gather(self, name: str, fields: dict, answered: Answered) -> None:
        """Ask every live broker (this one too); ``answered`` gets their
        ``transactions`` merged and sorted by id, the brokers that did not answer
        (``unreachable_brokers``), and the union of their ``loaded`` partitions of
        ``__transaction_state`` (those whose coordinators answered)."""
        brokers = sorted(self.replication.view.brokers) or [self.broker_id]
        gathered: list = []
        unreachable: list = []
        loaded: set = set()
        waiting = set(brokers)

        def one(broker_id: int, result: dict | ShmlogError) -> None:
            waiting.discard(broker_id)
            if isinstance(result, ShmlogError):
                unreachable.append(broker_id)
            else:
                gathered.extend(result.get("transactions", ()))
                loaded.update(result.get("loaded", ()))
            if not waiting:
                answered({"transactions": sorted(gathered,
                                                 key=lambda entry: entry["transactional_id"]),
                          "unreachable_brokers": sorted(unreachable),
                          "loaded": sorted(loaded)})
        for broker_id in brokers:
            self.ask(broker_id, name, fields, lambda result, broker_id=broker_id:
                     one(broker_id, result))

    def serve(self, request: ReceivedRequest, now: int) -> None:
        """Serve a peer's TRANSACTION request: answered now, or later through its
        :class:`PeerTicket`."""
        reply = handle_frame(request.message.body.request.encode(),
                             self.handlers(PeerTicket(request)))
        if reply is not None:
            self._send(request, reply.decode())

    def reply(self, ticket: PeerTicket | CallbackTicket, result: dict | ShmlogError) -> None:
        """Answer a request served later."""
        if isinstance(ticket, CallbackTicket):
            ticket.answered(result)
            return
        text = encode_result(result).decode()
        if len(text) > limits.GROUP_FORWARD_TEXT_LENGTH_MAX:
            text = encode_result(LocalProtocolError(
                f"a reply of {len(text)} characters is longer than a forwarded reply "
                f"carries ({limits.GROUP_FORWARD_TEXT_LENGTH_MAX})")).decode()
        self._send(ticket.request, text)

    def _send(self, request: ReceivedRequest, text: str) -> None:
        try:
            self.replication.endpoint.reply(request, TransactionResponse(text))
        except ShmlogError as error:
            log.warning("cannot answer a transaction request: %s", error)


def _decoded(frame: bytes) -> dict | ShmlogError:
    try:
        return decode_reply(frame)
    except ShmlogError as error:
        return error
