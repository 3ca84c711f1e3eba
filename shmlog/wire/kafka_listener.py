"""The Kafka listener of one broker: its sockets (``socket_server``) and the APIs it
serves (``apis`` and the area modules), put together for the broker's loop.

Rules
-----
* Off unless ``listeners`` is set, in Kafka's syntax (``listeners``: names,
  ``listener_security_protocol_map``, and the exposure rule: a listener off
  loopback is SASL_SSL unless its protocol is written); port 0: a free one. Every
  security protocol is served: TLS from the ``ssl_*`` settings (``tls``), SASL from
  ``sasl_enabled_mechanisms`` and ``sasl_credentials_file`` (``authenticator``),
  each read when the broker starts, so a bad file fails the start, not a client.
  Each listener's clients are told its advertised address (``advertised_listeners``,
  by default the listener), and a cluster member registers every listener's
  (Kafka's ``endpoints``: ``NAME://host:port``), its peers telling a listener's
  clients their endpoint of the same name.
* Its sockets are bound before the broker joins a cluster, so the broker registers
  the ports it got (Kafka's ``endpoints`` in its broker znode), and it answers once
  the broker is warm (:meth:`KafkaListener.serve`).
* The loop drives it: :meth:`KafkaListener.answer` every turn, :meth:`KafkaListener.poll`
  after every drain (held requests may be due), and its deadline joins the loop's.
"""

from __future__ import annotations

import logging
import os
import re
import socket

from ..common.errors import InvalidConfigError
from ..record.records import now_ms
from .admin_apis import AdminApis
from .apis import KafkaApis
from .authenticator import SaslSettings, SaslStateApi
from .cluster_metadata import ClusterMetadata
from .config_apis import ConfigApis
from .connections import Security
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
from .tls import TlsSettings, server_context
from .transaction_apis import TransactionApis

__all__ = ["KafkaListener"]

log = logging.getLogger("shmlog.broker.kafka")

_SSL_NAME = re.compile(r"\bssl(?:\.[a-z]+)+")
_TLS_SETTINGS = ("ssl_certificate_location", "ssl_key_location", "ssl_key_password",
                 "ssl_ca_location", "ssl_client_auth", "ssl_enabled_protocols",
                 "ssl_cipher_suites")


def _bind_addresses(config) -> tuple[list[tuple[str, int, Security]], list]:
    """[(host, port, security)] to bind, and the advertised listeners (the first is
    the one clients are told of), of ``config``'s listener settings (Kafka's syntax
    and rules: ``listeners.resolve``).

    Raises
    ------
    InvalidConfigError
        A setting is malformed, a listener breaks the exposure rule, or a TLS or SASL
        listener's settings or files are missing or invalid.
    """
    resolved = resolve(config.listeners, config.advertised_listeners,
                       config.listener_security_protocol_map)
    tls = sasl = None
    if any(listener.tls for listener in resolved.bound):
        try:
            tls = server_context(TlsSettings.from_mapping(
                {name.replace("_", "."): getattr(config, name) for name in _TLS_SETTINGS
                 if getattr(config, name) is not None}))
        except InvalidConfigError as error:
            # tls names the settings as librdkafka does; the broker's are spelt with _.
            raise InvalidConfigError(_SSL_NAME.sub(lambda match: match[0].replace(".", "_"),
                                                   str(error))) from None
    if any(listener.sasl for listener in resolved.bound):
        sasl = SaslSettings.from_config(config.sasl_enabled_mechanisms,
                                        config.sasl_credentials_file)
    for listener in resolved.bound:
        if not listener.loopback and listener.security_protocol != "SASL_SSL":
            log.warning("Kafka listener %s serves other hosts with %s, as written (%s): "
                        "their clients %s", listener, listener.security_protocol,
                        "listeners" if listener.name == listener.security_protocol
                        else "listener_security_protocol_map",
                        "are not logged in" if not listener.sasl else
                        "log in without TLS")
    bound = [(listener.host or "0.0.0.0", listener.port,
              Security(listener.security_protocol, listener.name, tls if listener.tls else None,
                       sasl if listener.sasl else None)) for listener in resolved.bound]
    return bound, [_advertised(resolved, listener) for listener in resolved.bound]


def _advertised(resolved, listener):
    """The advertised listener of bound ``listener``: itself when advertised.listeners
    does not name it (Kafka then registers none for it; shmlog registers where it is
    bound, so that every listener's clients are told a way in)."""
    try:
        return resolved.advertised_for(listener.name)
    except KeyError:
        return listener


class KafkaListener:
    """The Kafka listener a broker's ``config`` asks for: bound at construction (so
    a cluster member registers the ports it got), serving from :meth:`serve`."""

    def __init__(self, config) -> None:
        endpoints, advertised = _bind_addresses(config)
        self.server = KafkaSocketServer(
            endpoints, request_size_max=config.socket_request_max_bytes,
            idle_ms=config.connections_max_idle_ms,
            connections_per_address_max=config.max_connections_per_ip,
            setup_timeout_ms=config.connection_setup_timeout_ms)
        self.addresses = self.server.addresses
        # A port 0 (any free one) is advertised as the one bound, an empty host (all
        # interfaces) as the host's name, as Kafka does.
        addresses = [(listener.name, listener.host or socket.getfqdn(), listener.port or port)
                     for listener, (_, port) in zip(advertised, self.addresses, strict=True)]
        #: The name of the listener clients are told of by default (the first).
        self.listener_name = addresses[0][0]
        self.advertised = addresses[0][1:]
        #: {listener name: (host, port)}: each listener's clients are told their own.
        self.by_listener = {name: (host, port) for name, host, port in addresses}
        #: What a cluster member registers: Kafka's ``endpoints``, NAME://host:port.
        self.endpoints = tuple(f"{name}://[{host}]:{port}" if ":" in host
                               else f"{name}://{host}:{port}" for name, host, port in addresses)
        self.apis: KafkaApis | None = None

    def serve(self, core) -> None:
        """Answer Kafka clients for broker ``core`` (a BrokerCore) from now on."""
        metadata = LocalMetadata(core, self.advertised, self.by_listener) \
            if core.cluster is None else ClusterMetadata(core, self.advertised,
                                                         self.listener_name)
        self.apis = KafkaApis(self.server, [MetadataApi(metadata), OffsetsApi(core, metadata),
                                            SaslStateApi()])
        self.apis.add_area(ProduceApi(core, metadata, self.apis.respond))
        self.apis.add_area(FetchApi(core, metadata, self.apis.respond))
        self.apis.add_area(GroupApis(core, metadata, self.apis.respond))
        self.apis.add_area(GroupOffsetsApis(core, self.apis.respond))
        self.apis.add_area(TransactionApis(core, metadata, self.apis.respond))
        self.apis.add_area(AdminApis(core, metadata, self.apis.respond))
        self.apis.add_area(ConfigApis(core, metadata.broker_id, self.apis.respond))
        self.server.serve()
        log.info("broker %d: Kafka listener on %s (advertised as %s:%d)", os.getpid(),
                 ", ".join(f"{host}:{port}" for host, port in self.addresses),
                 *self.advertised)

    @property
    def waiting(self) -> bool:
        return self.server.waiting

    def answer(self) -> bool:
        return self.apis.answer()

    def fileno(self) -> int:
        """What the loop's sleep watches for this listener (its sockets' epoll)."""
        return self.server.fileno()

    def seconds_to_next_timer(self) -> float | None:
        """Seconds until a held request's deadline or the sockets' next timer."""
        seconds = self.server.seconds_to_next_timer()
        deadline = self.apis.next_deadline()
        if deadline is not None:
            held = max(0.0, (deadline - now_ms()) / 1000)
            seconds = held if seconds is None else min(seconds, held)
        return seconds

    def poll(self, now: int) -> None:
        self.apis.poll(now)

    def owns(self, ticket) -> bool:
        """Is ``ticket`` a Kafka request's (held by a broker service)?"""
        return isinstance(ticket, WireTicket)

    def resolve(self, ticket: WireTicket, result) -> None:
        """A held Kafka request's result came: its handler answers."""
        ticket.on_result(result)

    def stop(self) -> None:
        self.server.stop()
