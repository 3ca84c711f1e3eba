"""The Kafka listener of one broker: its sockets (``socket_server``) and the APIs it
serves (``apis`` and the area modules), put together for the broker's loop.

Rules
-----
* Off unless ``listeners`` is set. Each listener is ``PLAINTEXT://host:port`` (port
  0: a free one); ``advertised_listeners`` gives what clients are told, in the same
  order, when it differs.
* The admin APIs (``admin_apis``, ``config_apis``) are a single broker's: a cluster
  member's topic service answers topic changes once ZooKeeper carried them out,
  which those handlers do not wait for, so a member does not advertise them.
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
from .config_apis import ConfigApis
from .local_metadata import LocalMetadata
from .metadata_api import MetadataApi
from .socket_server import KafkaSocketServer

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
    """The Kafka listener of broker ``core`` (a BrokerCore), as its config says."""

    def __init__(self, core) -> None:
        config = core.config
        endpoints = parse_endpoints(config.listeners, "listeners")
        advertised = parse_endpoints(config.advertised_listeners, "advertised_listeners") \
            if config.advertised_listeners else None
        if advertised is not None and len(advertised) != len(endpoints):
            raise InvalidConfigError(f"advertised_listeners names {len(advertised)} listeners "
                                     f"and listeners {len(endpoints)}: give one per listener")
        self.server = KafkaSocketServer(
            endpoints, core.host.table.appender_doorbell,
            request_size_max=config.socket_request_max_bytes,
            idle_ms=config.connections_max_idle_ms,
            connections_per_address_max=config.max_connections_per_ip)
        self.addresses = self.server.addresses
        self.advertised = advertised[0] if advertised else _reachable(self.addresses[0])
        metadata = LocalMetadata(core, self.advertised)
        areas = [MetadataApi(metadata)]
        if core.cluster is None:       # a member's topic changes are answered later
            areas += [AdminApis(core, metadata), ConfigApis(core, metadata.brokers()[0][0])]
        self.apis = KafkaApis(self.server, areas)
        log.info("broker %d: Kafka listener on %s", os.getpid(),
                 ", ".join(f"{host}:{port}" for host, port in self.addresses))

    @property
    def waiting(self) -> bool:
        return self.apis.waiting

    def answer(self) -> bool:
        return self.apis.answer()

    def poll(self, now: int) -> None:
        self.apis.poll(now)

    def next_deadline(self) -> int | None:
        return self.apis.next_deadline()

    def stop(self) -> None:
        self.server.stop()
