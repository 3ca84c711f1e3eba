"""Kafka's requests answered on the broker's loop (Kafka's ``KafkaApis``): each
request decoded, checked against the versions advertised, and handed to the API's
handler; its response encoded and passed back to the listener.

Rules
-----
* **Advertise exactly what is implemented.** The versions served are the
  handlers' own ranges (:attr:`KafkaApis.versions`); ApiVersions lists them and
  nothing else. A request of another API, or of a version outside its range, closes
  its connection (Kafka's behaviour: a client asks ApiVersions first), except
  ApiVersions itself: a version newer than served gets UNSUPPORTED_VERSION with a v0
  body listing what is served, so the client can pick (KIP-511).
* A handler returns the response (a kafka-python message, or framed buffers it
  wrote by hand), :data:`NO_RESPONSE` (acks=0), or :data:`LATER` when it keeps the
  request and answers it through :meth:`KafkaApis.respond` (a long poll, acks=all).
* A client's bytes never end the loop: a body that does not decode, or a handler
  that fails on what it was sent, closes that connection and logs why; a bug in a
  handler, or a response that does not encode, is logged with its traceback and
  closes the connection too.
* Everything runs on the broker's loop thread; handlers need no locks.

Theory of operation
-------------------
The broker's loop calls :meth:`KafkaApis.answer` every turn: it takes the requests
the listener queued, reads each header (``codec``), and dispatches by API key.
Area modules (``metadata_api``, ``produce_api``, ...) each give a table of
``{api key: (min version, max version, handler)}``; :meth:`KafkaApis.poll` lets
those that hold requests answer what became due (data appended, a timeout).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

from ..common.errors import KafkaRequestError
from . import codec
from .error_codes import UNSUPPORTED_VERSION
from .socket_server import KafkaSocketServer, WireRequest
from .tickets import LATER

__all__ = ["KafkaApis", "NO_RESPONSE", "LATER", "ApiTable", "AtVersion"]

log = logging.getLogger("shmlog.broker.kafka")

NO_RESPONSE = object()     # the request gets no response (Produce with acks=0)
# LATER: the handler keeps the request and answers it later (``tickets``).



class AtVersion(NamedTuple):
    """A response to encode at another version than its request's (ApiVersions'
    v0 answer to a version it does not serve)."""
    response: Any
    version: int


#: {api key: (min version, max version, handler(request, header, body))}
ApiTable = dict[int, tuple[int, int, Callable[..., Any]]]


class KafkaApis:
    """Answers what ``server`` receives with the handlers of ``areas`` (objects with
    ``apis() -> ApiTable``, and optionally ``poll(now_ms)`` and ``next_deadline()``)."""

    def __init__(self, server: KafkaSocketServer, areas: list) -> None:
        self.server = server
        self.areas: list = []
        self._table: ApiTable = {codec.API_VERSIONS_KEY: (0, 4, self.api_versions)}
        for area in areas:
            self.add_area(area)

    def add_area(self, area) -> None:
        """Serve ``area``'s APIs too (an area that answers later is given
        :meth:`respond` at its construction)."""
        added = area.apis()
        clashes = added.keys() & self._table.keys()
        assert not clashes, f"Kafka APIs served twice: {sorted(clashes)}"
        self._table.update(added)
        self.areas.append(area)

    @property
    def versions(self) -> dict[int, tuple[int, int]]:
        """{api key: (min, max)}: what ApiVersions advertises."""
        return {key: (low, high) for key, (low, high, _) in sorted(self._table.items())}

    # -- the loop's side ---------------------------------------------------------------
    @property
    def waiting(self) -> bool:
        return self.server.waiting

    def answer(self) -> bool:
        """Do what the sockets allow now and answer the requests read (on the loop's
        thread); whether there were any."""
        self.server.pump()
        answered = False
        while (request := self.server.take()) is not None:
            answered = True
            self._answer(request)
        return answered

    def poll(self, now: int) -> None:
        """Let the areas answer the requests they hold that came due."""
        for area in self.areas:
            poll = getattr(area, "poll", None)
            if poll is not None:
                poll(now)

    def next_deadline(self) -> int | None:
        """The earliest time (ms) an area must look at the requests it holds."""
        deadlines = [deadline for area in self.areas
                     if (deadline := getattr(area, "next_deadline", lambda: None)()) is not None]
        return min(deadlines, default=None)

    def respond(self, request: WireRequest, header: codec.RequestHeader, response) -> None:
        """Send the response to a request a handler kept (:data:`LATER`)."""
        self._send(request, header, response)

    # -- one request -------------------------------------------------------------------
    def _answer(self, request: WireRequest) -> None:
        try:
            header = codec.read_header(memoryview(request.frame))
            entry = self._table.get(header.api_key)
            if entry is None:
                raise KafkaRequestError(f"{header.describe()}: this broker does not serve "
                                        f"API {header.api_key} (see ApiVersions)")
            low, high, handler = entry
            if not low <= header.api_version <= high and \
                    header.api_key != codec.API_VERSIONS_KEY:
                raise KafkaRequestError(f"{header.describe()}: this broker serves versions "
                                        f"{low} to {high} of it (see ApiVersions)")
            body = codec.decode_request(header, memoryview(request.frame)) \
                if header.api_version <= high else None
            response = handler(request, header, body)
        except KafkaRequestError as error:
            log.warning("Kafka listener: closed the connection from %s: %s", request.peer, error)
            self.server.close(request.connection_id)
            return
        except Exception:              # noqa: BLE001 - a bug must not end the broker
            log.exception("Kafka listener: a request from %s failed; its connection is closed",
                          request.peer)
            self.server.close(request.connection_id)
            return
        if response is LATER:
            return
        self._send(request, header, response)

    def _send(self, request: WireRequest, header: codec.RequestHeader, response) -> None:
        try:
            self._write(request, header, response)
        except Exception:              # noqa: BLE001 - a bug must not end the broker
            log.exception("Kafka listener: the response to %s from %s does not encode; its "
                          "connection is closed", header.describe(), request.peer)
            self.server.close(request.connection_id)

    def _write(self, request: WireRequest, header: codec.RequestHeader, response) -> None:
        if response is NO_RESPONSE:
            self.server.no_response(request.connection_id)
        elif isinstance(response, list):
            self.server.send(request.connection_id, response)      # framed by its handler
        elif isinstance(response, AtVersion):
            self.server.send(request.connection_id,
                             [codec.encode_response(header, *response)])
        else:
            self.server.send(request.connection_id, [codec.encode_response(header, response)])

    # -- ApiVersions -------------------------------------------------------------------
    def api_versions(self, request: WireRequest, header: codec.RequestHeader, body):
        """ApiVersions 0-4: every API served, with its versions; a version newer than
        served: UNSUPPORTED_VERSION and a v0 body (the client then asks with one it
        finds there)."""
        cls = codec.response_class(codec.API_VERSIONS_KEY)
        low, high, _ = self._table[codec.API_VERSIONS_KEY]
        versions = [cls.ApiVersion(api_key=key, min_version=low, max_version=high)
                    for key, (low, high) in self.versions.items()]
        if header.api_version > high:
            return AtVersion(cls(version=0, error_code=UNSUPPORTED_VERSION, api_keys=versions), 0)
        return cls(version=header.api_version, error_code=0, api_keys=versions,
                   throttle_time_ms=0)
