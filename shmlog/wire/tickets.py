"""Kafka requests that a broker service answers later: the services hold a control
request's ticket while they wait (a cluster's topic creation waits for ZooKeeper, a
group join for its rebalance), and a Kafka request rides the same path with a ticket
of its own.

Rules
-----
* A service handler is called for a Kafka request as the control path calls it
  (:func:`ask_service`): with the broker's request context holding a
  :class:`WireTicket`, so a handler that holds the request keeps that ticket.
* The loop hands every held result back by ticket; one whose ticket is a
  :class:`WireTicket` goes to its ``on_result`` (a dict, or the ShmlogError that
  refused it), never to the control socket.
"""

from __future__ import annotations

from typing import Any, Callable

#: What a handler returns when it answers later (``apis`` serves it under this name).
LATER = object()

__all__ = ["WireTicket", "ask_service", "Gather", "LATER"]


class WireTicket:
    """The ticket of a Kafka request a service may answer later."""

    __slots__ = ("on_result",)

    def __init__(self, on_result: Callable[[Any], None]) -> None:
        self.on_result = on_result


def ask_service(core, handler: Callable[..., dict | None], on_result: Callable[[Any], None],
                **fields) -> dict | None:
    """``handler(**fields)`` (a service's control handler on broker ``core``) for a
    Kafka request: its reply now, or None when the service holds the request and
    hands its result to ``on_result`` later (a ShmlogError it raises now propagates)."""
    core.context.ticket = WireTicket(on_result)
    try:
        return handler(**fields)
    finally:
        core.context.ticket = None


class Gather:
    """The results of a Kafka request's items, by index, some of them answered later
    by a service: ``complete(results)`` makes the response once every item is in,
    returned by :meth:`outcome` or, when it came later, passed to ``send``."""

    def __init__(self, count: int, complete, send) -> None:
        self.results: dict[int, object] = {}
        self.count = count
        self.complete = complete
        self.send = send
        self.held = False

    def put(self, index: int, result) -> None:
        self.results[index] = result
        if self.held and len(self.results) == self.count:
            self.send(self.complete(self.results))

    def outcome(self):
        if len(self.results) == self.count:
            return self.complete(self.results)
        self.held = True
        return LATER
