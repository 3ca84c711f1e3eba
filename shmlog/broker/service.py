"""What the broker's loop asks of a service: the requests it answers, the work it
has to do at a time, and the replies it held back.

Rules
-----
* A service answers control requests by type: :meth:`Service.handlers` maps each
  type it serves to a handler called with the request's fields (checked against the
  handler's signature by ``control.handle_frame``). A handler returns the reply's
  fields, raises a :class:`~shmlog.common.errors.ShmlogError` to refuse, or returns None
  to answer later. No two services answer the same type.
* A service that answers later keeps the request's ticket
  (:attr:`RequestContext.ticket`, set by the broker while the handler runs) and
  hands the reply back from :meth:`Service.take_replies`; the broker sends those
  after every turn, and at a stop refuses the tickets of :meth:`Service.pending_tickets`.
* Time is the broker's (milliseconds, ``records.now_ms``), passed in.
  :meth:`Service.tick` runs on the loop's thread once ``now`` reached
  :meth:`Service.next_deadline`, but not while control requests wait to be
  answered: one of them (a heartbeat, say) may be what the deadline waits for, and
  a loop that was held up must hear it before it judges.
* Everything runs on the loop's thread: a service needs no locks.

Theory of operation
-------------------
``server.broker.BrokerCore`` composes a list of services: its handler table is the
union of theirs, the loop sleeps until the earliest of its periodic tasks and the
services' deadlines, and ticks and collects replies from each. The topic service
(``topic_service``), the producer service (``producer_service``) and the group
service (``group_service``) are every broker's; a cluster member adds its replica
service and puts its own topic and group services in place of the local ones. The
loop still knows of cluster mode in one place: it polls the replication transport
(``cluster.replication.poll``) after each drain, since its events are not requests.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from ..common.errors import ShmlogError

__all__ = ["Service", "ImmediateService", "RequestContext"]


class RequestContext:
    """Who sent the request being handled (the control endpoint's ticket), for the
    services that answer later; None outside a request."""

    __slots__ = ("ticket",)

    def __init__(self) -> None:
        self.ticket: Any = None


@runtime_checkable
class Service(Protocol):
    """A part of the broker that answers control requests and may keep time."""

    def handlers(self) -> dict[str, Callable[..., dict | None]]:
        """{request type: handler} for the requests this service answers."""

    def tick(self, now: int) -> None:
        """Do what was due by ``now`` (ms)."""

    def next_deadline(self) -> int | None:
        """When :meth:`tick` next has something to do (ms), or None."""

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        """Replies held back that are due now: (ticket, reply fields or error)."""

    def pending_tickets(self) -> list[Any]:
        """Tickets of requests held back and not answered yet."""


class ImmediateService:
    """The timing part of :class:`Service` for a service that answers every request
    at once and keeps no time (the topic and producer services): subclasses give
    :meth:`handlers`."""

    def tick(self, now: int) -> None:
        """Nothing is timed here."""

    def next_deadline(self) -> int | None:
        return None

    def take_replies(self) -> list[tuple[Any, dict | ShmlogError]]:
        return []

    def pending_tickets(self) -> list[Any]:
        return []
