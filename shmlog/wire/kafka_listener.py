"""The Kafka listener of one broker: its sockets (``socket_server``) and the APIs it
serves (``apis`` and the area modules), put together for the broker's loop.

Rules
-----
* Off unless ``listeners`` is set, in Kafka's syntax (``listeners``: names,
  ``listener.security.protocol.map``'s defaults, and the exposure rule); PLAINTEXT
  listeners only so far (port 0: a free one). Clients are told the first
  listener's advertised address (``advertised_listeners``, by default the listener).
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
from .config_apis import ConfigApis
from .fetch_api import FetchApi
from .group_apis import GroupApis
from .group_offsets_apis import GroupOffsetsApis
from .listeners import resolve
from .local_metadata import LocalMetadata
from .metadata_api import MetadataApi
from .offsets_api import OffsetsApi
from .produce_api import ProduceApi
from .socket_server import KafkaSocketServer
from .tickets import WireTicket

__all__ = ["KafkaListener"]

log = logging.getLogger("shmlog.broker.kafka")

_SERVED = ("PLAINTEXT",)


def _bind_addresses(config) -> tuple[list[tuple[str, int]], object]:
    """[(host, port)] to bind, and the advertised listener, of ``config``'s
    ``listeners`` and ``advertised_listeners`` (Kafka's syntax and rules:
    ``listeners.resolve``).

    Raises
    ------
    InvalidConfigError
        A setting is malformed, or names a protocol not served yet.
    """
    resolved = resolve(config.listeners, config.advertised_listeners)
    for listener in resolved.bound:
        if listener.security_protocol not in _SERVED:
            raise InvalidConfigError(
                f"listeners: {listener} is {listener.security_protocol}; this broker serves "
                f"{', '.join(_SERVED)} listeners only so far (TLS and SASL are to come): "
                f"keep the listener on loopback")
    return [(listener.host or "0.0.0.0", listener.port) for listener in resolved.bound], \
        resolved.advertised_for(resolved.bound[0].name)


class KafkaListener:
    """The Kafka listener a broker's ``config`` asks for: bound at construction (so
    a cluster member registers the ports it got), serving from :meth:`serve`."""

    def __init__(self, config) -> None:
        endpoints, advertised = _bind_addresses(config)
        self.server = KafkaSocketServer(
            endpoints, request_size_max=config.socket_request_max_bytes,
            idle_ms=config.connections_max_idle_ms,
            connections_per_address_max=config.max_connections_per_ip)
        self.addresses = self.server.addresses
        # A port 0 (any free one) is advertised as the one bound, an empty host (all
        # interfaces) as the host's name, as Kafka does.
        self.advertised = (advertised.host or socket.getfqdn(),
                           advertised.port or self.addresses[0][1])
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
        self.apis.add_area(GroupApis(core, metadata, self.apis.respond))
        self.apis.add_area(GroupOffsetsApis(core, self.apis.respond))
        self.apis.add_area(AdminApis(core, metadata, self.apis.respond))
        self.apis.add_area(ConfigApis(core, metadata.broker_id, self.apis.respond))
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
