"""The Kafka listener of one broker: its sockets (``socket_server``) and the APIs it
serves (``apis`` and the area modules), put together for the broker's loop.

Rules
-----
* Off unless ``listeners`` is set. Each listener is ``PLAINTEXT://host:port`` (port
  0: a free one); ``advertised_listeners`` gives what clients are told, in the same
  order, when it differs.
* Its sockets are bound before the broker joins a cluster, so the broker registers
  the ports it got (Kafka's ``endpoints`` in its broker znode), and it answers once
  the broker is warm (:meth:`KafkaListener.serve`).
* The loop drives it: :meth:`KafkaListener.answer` every turn, :meth:`KafkaListener.poll`
  after every drain (held requests may be due), and its deadline joins the loop's.
"""

from __future__ import annotations

import logging
import os
import socket

from ..common.errors import InvalidConfigError
from .admin_apis import AdminApis
from .apis import KafkaApis
from .cluster_metadata import ClusterMetadata
from .fetch_api import FetchApi
from .group_apis import GroupApis
from .group_offsets_apis import GroupOffsetsApis
from .local_metadata import LocalMetadata
from .metadata_api import MetadataApi
from .offsets_api import OffsetsApi
from .produce_api import ProduceApi
from .socket_server import KafkaSocketServer
from .tickets import WireTicket

__all__ = ["KafkaListener", "parse_endpoints"]

log = logging.getLogger("shmlog.broker.kafka")

_PROTOCOLS = ("PLAINTEXT",)


def parse_endpoints(text: str, setting: str) -> list[tuple[str, int]]:
    """[(host, port)] of a comma-separated ``PROTOCOL://host:port`` list.

    Raises
    ------
    InvalidConfigError
        An entry is not of that form, or names a protocol not served.
    """
    endpoints = []
    for entry in (part.strip() for part in text.split(",") if part.strip()):
        protocol, separator, address = entry.partition("://")
        host, colon, port = address.rpartition(":")
        if not separator or not colon or not port.isdigit() or int(port) > 65535:
            raise InvalidConfigError(f"{setting}: {entry!r} is not PROTOCOL://host:port "
                                     f"(e.g. PLAINTEXT://127.0.0.1:9092)")
        if protocol.upper() not in _PROTOCOLS:
            raise InvalidConfigError(f"{setting}: {entry!r}: this broker serves "
                                     f"{', '.join(_PROTOCOLS)} listeners")
        endpoints.append((host.strip("[]") or "0.0.0.0", int(port)))
    if not endpoints:
        raise InvalidConfigError(f"{setting} names no listener")
    return endpoints


def _reachable(address: tuple[str, int]) -> tuple[str, int]:
    """What to tell clients of a listener bound to ``address``: a wildcard address
    is no place to connect to, so the host's name (as Kafka does)."""
    host, port = address
    return (socket.getfqdn() if host in ("0.0.0.0", "::") else host), port


class KafkaListener:
    """The Kafka listener a broker's ``config`` asks for: bound at construction (so
    a cluster member registers the ports it got), serving from :meth:`serve`."""

    def __init__(self, config) -> None:
        endpoints = parse_endpoints(config.listeners, "listeners")
        advertised = parse_endpoints(config.advertised_listeners, "advertised_listeners") \
            if config.advertised_listeners else None
        if advertised is not None and len(advertised) != len(endpoints):
            raise InvalidConfigError(f"advertised_listeners names {len(advertised)} listeners "
                                     f"and listeners {len(endpoints)}: give one per listener")
        self.server = KafkaSocketServer(
            endpoints, request_size_max=config.socket_request_max_bytes,
            idle_ms=config.connections_max_idle_ms,
            connections_per_address_max=config.max_connections_per_ip)
        self.addresses = self.server.addresses
        self.advertised = advertised[0] if advertised else _reachable(self.addresses[0])
        #: What a cluster member registers: Kafka's ``endpoints``.
        self.endpoints = (f"PLAINTEXT://{self.advertised[0]}:{self.advertised[1]}",)
        self.apis: KafkaApis | None = None

    def serve(self, core) -> None:
        """Answer Kafka clients for broker ``core`` (a BrokerCore) from now on."""
        metadata = LocalMetadata(core, self.advertised) if core.cluster is None \
            else ClusterMetadata(core, self.advertised)
        self.apis = KafkaApis(self.server, [MetadataApi(metadata), OffsetsApi(core, metadata)])
        self.apis.add_area(ProduceApi(core, metadata, self.apis.respond))
        self.apis.add_area(FetchApi(core, metadata, self.apis.respond))
        node = (metadata.broker_id, *self.advertised)                 # this broker
        self.apis.add_area(GroupApis(core, node, self.apis.respond))
        self.apis.add_area(GroupOffsetsApis(core, self.apis.respond))
        self.apis.add_area(AdminApis(core, metadata, self.apis.respond))
        self.server.serve(core.host.table.appender_doorbell)
        log.info("broker %d: Kafka listener on %s (advertised as %s:%d)", os.getpid(),
                 ", ".join(f"{host}:{port}" for host, port in self.addresses),
                 *self.advertised)

    @property
    def waiting(self) -> bool:
        return self.server.waiting

    def answer(self) -> bool:
        return self.apis.answer()

    def poll(self, now: int) -> None:
        self.apis.poll(now)

    def next_deadline(self) -> int | None:
        return self.apis.next_deadline()

    def owns(self, ticket) -> bool:
        """Is ``ticket`` a Kafka request's (held by a broker service)?"""
        return isinstance(ticket, WireTicket)

    def resolve(self, ticket: WireTicket, result) -> None:
        """A held Kafka request's result came: its handler answers."""
        ticket.on_result(result)

    def stop(self) -> None:
        self.server.stop()
