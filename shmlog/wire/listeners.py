"""Where a broker listens for Kafka clients, and with which security protocol.

Rules
-----
* Kafka's three settings, Kafka's syntax (``KafkaConfig``, ``EndPoint``):
  ``listeners`` is comma-separated ``NAME://HOST:PORT`` (``SASL_SSL://0.0.0.0:9093``);
  the host is a name, an IPv4 address, an IPv6 address in brackets (``[::1]``, a zone
  after ``%``), or empty for every interface; the port 0..65535, 0 for one the kernel
  picks. ``advertised.listeners`` is the same syntax: what clients are told to
  connect to (Metadata), by default the listeners themselves; its names are among
  the listeners' and it may not name the unroutable ``0.0.0.0`` or ``::``.
  ``listener.security.protocol.map`` is comma-separated ``NAME:PROTOCOL``, by default
  each of PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL to itself; a written map
  replaces the default, as in Kafka. Names are case-insensitive (upper-cased, as
  Kafka's ``ListenerName.normalised``); a TOML list of listener strings and a TOML
  table for the map are taken too.
* Kafka's checks: every listener has a security protocol, listeners have distinct
  names and distinct ports (port 0 excepted), advertised listeners distinct names.
  An IPv6 address must be in brackets (Kafka's looser pattern reads ``::1:9092``
  as host ``::1``; shmlog refuses the guess).
* The issue's rule: *a listener on a non-loopback address needs TLS and SASL, unless
  the operator writes PLAINTEXT (SSL, SASL_PLAINTEXT) for it explicitly.* A bound
  listener is on loopback when its host is a loopback address (127.0.0.0/8, ``::1``,
  IPv4-mapped ``::ffff:127.x``) or ``localhost`` (RFC 6761); every other host,
  including every interface (empty, ``0.0.0.0``, ``::``) and any other name (no DNS
  is asked: a name can resolve anywhere), is not. Such a listener may have a
  protocol other than SASL_SSL only when it is *written*: the operator's own
  ``listeners`` names it with that protocol's name (``PLAINTEXT://0.0.0.0:9092``),
  or the operator's own ``listener.security.protocol.map`` maps its name to it
  (``EXTERNAL:PLAINTEXT``). A protocol reached through a default is not written;
  a non-loopback listener with one is refused (:class:`InsecureListenerError`).
  With Kafka-style settings every listener of a written ``listeners`` has its
  protocol written (a name that is not a protocol needs the operator's map), so the
  rule bites on defaults: Kafka's default ``PLAINTEXT://:9092`` would serve every
  interface in plaintext unasked, and shmlog's default, :data:`LISTENERS_DEFAULT`,
  is plaintext on loopback (this host's clients; TLS and SASL are for other hosts).
  Which address a listener is *advertised* at does not matter: the rule is about
  where the socket accepts connections.
* Every refusal is an :class:`~shmlog.common.errors.InvalidConfigError` (or its
  :class:`~shmlog.common.errors.InsecureListenerError`) naming the setting, the
  value and what is accepted. Nothing here opens a socket or resolves a name.

Theory of operation
-------------------
:func:`resolve` parses the three settings (``None`` for one not written), gives each
bound listener its protocol from the map, checks Kafka's rules and the issue's, and
returns :class:`Listeners`: the bound listeners (the socket server binds each) and
the advertised ones (Metadata answers with them). An advertised listener with an
empty host is advertised at the broker's host name (Kafka's canonical host name),
one with port 0 (a default copied from a listener on port 0) at the port bound:
both are the server's to fill in, since only it knows them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Mapping, Sequence

from ..common.errors import InsecureListenerError, InvalidConfigError

__all__ = ["SECURITY_PROTOCOLS", "PROTOCOL_MAP_DEFAULT", "LISTENERS_DEFAULT", "Endpoint",
           "Listener", "Listeners", "parse_endpoints", "parse_protocol_map", "resolve",
           "is_loopback", "check_exposure"]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
PROTOCOL_MAP_DEFAULT = {protocol: protocol for protocol in SECURITY_PROTOCOLS}
LISTENERS_DEFAULT = "PLAINTEXT://127.0.0.1:9092"
_TCP_PORT_LAST = 65535
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ENDPOINT = re.compile(r"(?P<name>[^:/]*)://(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[^:\[\]]*))"
                       r":(?P<port>[0-9]{1,5})")
_HOST = re.compile(r"[A-Za-z0-9_.-]*")
_UNROUTABLE = {"0.0.0.0", "::"}


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One ``NAME://HOST:PORT`` as written (name upper-cased, host without brackets)."""
    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class Listener:
    """An endpoint with its security protocol; ``written`` says whether the operator's
    own settings named that protocol for it (see the module's rules)."""
    name: str
    host: str
    port: int
    security_protocol: str
    written: bool

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        return str(Endpoint(self.name, self.host, self.port))


@dataclasses.dataclass(frozen=True)
class Listeners:
    """The listeners a broker binds and those it advertises, each in written order."""
    bound: tuple[Listener, ...]
    advertised: tuple[Listener, ...]

    def advertised_for(self, name: str) -> Listener:
        """The advertised listener of bound listener ``name`` (a client that connected
        to that listener is told about the brokers' same listener, as in Kafka).

        Raises
        ------
        KeyError
            No listener of that name is advertised.
        """
        for listener in self.advertised:
            if listener.name == name.upper():
                return listener
        raise KeyError(name)


def is_loopback(host: str) -> bool:
    """Is ``host`` only reachable from this host: a loopback address (IPv4-mapped
    too) or ``localhost``? Empty (every interface) and other names are not."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def parse_endpoints(value: str | Sequence[str], setting: str) -> tuple[Endpoint, ...]:
    """The endpoints of a ``listeners``-style value: a comma-separated string (empty
    items dropped, as Kafka's ``parseCsvList`` does) or a list of strings.

    Raises
    ------
    InvalidConfigError
        An item is not ``NAME://HOST:PORT``, its host or port is invalid, or the value
        names no endpoint.
    """
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        items = [item.strip() for item in value]
    else:
        raise InvalidConfigError(f"{setting} must be a string of comma-separated "
                                 f"NAME://HOST:PORT (or a list of them), got {value!r:.200}")
    endpoints = tuple(_endpoint(item, setting) for item in items if item)
    if not endpoints:
        raise InvalidConfigError(f"{setting} names no listener ({value!r:.200}): give at "
                                 f"least one NAME://HOST:PORT, e.g. {LISTENERS_DEFAULT}")
    return endpoints


def _endpoint(item: str, setting: str) -> Endpoint:
    match = _ENDPOINT.fullmatch(item)
    if match is None:
        raise InvalidConfigError(
            f"{setting}: {item!r:.200} is not NAME://HOST:PORT (an IPv6 address in "
            f"brackets, an empty host for every interface), e.g. SASL_SSL://0.0.0.0:9093")
    name, port = match["name"], int(match["port"])
    if not _NAME.fullmatch(name):
        raise InvalidConfigError(f"{setting}: listener name {name!r:.100} in {item!r:.200} "
                                 f"must be letters, digits, '_' or '-'")
    if port > _TCP_PORT_LAST:
        raise InvalidConfigError(f"{setting}: port {port} in {item!r:.200} is not a TCP port "
                                 f"(0..{_TCP_PORT_LAST}, 0 for one the kernel picks)")
    if match["ipv6"] is not None:
        host = match["ipv6"]
        try:
            if not isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
                raise ValueError(host)
        except ValueError:
            raise InvalidConfigError(f"{setting}: [{host}] in {item!r:.200} is not an IPv6 "
                                     f"address (brackets are for IPv6 only)") from None
    else:
        host = match["host"]
        if not _HOST.fullmatch(host):
            raise InvalidConfigError(f"{setting}: host {host!r:.100} in {item!r:.200} is "
                                     f"not a host name or IPv4 address")
    return Endpoint(name.upper(), host, port)


def parse_protocol_map(value: str | Mapping[str, str],
                       setting: str = "listener.security.protocol.map") -> dict[str, str]:
    """``{LISTENER NAME: SECURITY PROTOCOL}`` of a ``NAME:PROTOCOL,...`` string (or a
    table), both sides upper-cased.

    Raises
    ------
    InvalidConfigError
        An item is not ``NAME:PROTOCOL``, names a protocol Kafka does not have, or
        names a listener twice.
    """
    if isinstance(value, str):
        pairs = []
        for item in (item.strip() for item in value.split(",")):
            if not item:
                continue
            name, colon, protocol = item.partition(":")
            if not colon:
                raise InvalidConfigError(f"{setting}: {item!r:.200} is not NAME:PROTOCOL, "
                                         f"e.g. EXTERNAL:SASL_SSL")
            pairs.append((name.strip(), protocol.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise InvalidConfigError(f"{setting} must be a string of comma-separated "
                                 f"NAME:PROTOCOL (or a table), got {value!r:.200}")
    found: dict[str, str] = {}
    for name, protocol in pairs:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidConfigError(f"{setting}: listener name {name!r:.100} must be "
                                     f"letters, digits, '_' or '-'")
        if not isinstance(protocol, str) or protocol.upper() not in SECURITY_PROTOCOLS:
            raise InvalidConfigError(f"{setting}: {name}'s protocol {protocol!r:.100} is "
                                     f"none of {', '.join(SECURITY_PROTOCOLS)}")
        if name.upper() in found:
            raise InvalidConfigError(f"{setting} maps listener {name.upper()} twice")
        found[name.upper()] = protocol.upper()
    return found


def resolve(listeners: str | Sequence[str] | None = None,
            advertised_listeners: str | Sequence[str] | None = None,
            protocol_map: str | Mapping[str, str] | None = None) -> Listeners:
    """The bound and advertised listeners of the three settings, ``None`` for one the
    operator did not write (its default is taken, and counts as not written).

    Raises
    ------
    InvalidConfigError
        A setting's syntax, a listener without a protocol, two listeners of one name
        or port, an advertised name that no listener has, an unroutable advertised
        host.
    InsecureListenerError
        A listener other hosts reach whose protocol is not SASL_SSL and not written.
    """
    mapping = PROTOCOL_MAP_DEFAULT if protocol_map is None else parse_protocol_map(protocol_map)
    bound = tuple(_listener(endpoint, mapping, "listeners", listeners is not None,
                            protocol_map is not None)
                  for endpoint in parse_endpoints(
                      LISTENERS_DEFAULT if listeners is None else listeners, "listeners"))
    _check_distinct(bound, "listeners", ports=True)
    for listener in bound:
        check_exposure(listener)
    if advertised_listeners is None:
        advertised, setting = bound, "advertised.listeners (by default the listeners)"
    else:
        setting = "advertised.listeners"
        advertised = tuple(_advertised(endpoint, bound)
                           for endpoint in parse_endpoints(advertised_listeners, setting))
        _check_distinct(advertised, setting, ports=False)
    for listener in advertised:
        if listener.host in _UNROUTABLE:
            raise InvalidConfigError(
                f"{setting}: {listener} uses the unroutable meta-address {listener.host}, "
                f"which clients cannot connect to: advertise a routable address or name "
                f"(as Kafka refuses 0.0.0.0 there)")
    return Listeners(bound, advertised)


def _listener(endpoint: Endpoint, mapping: Mapping[str, str], setting: str,
              listeners_written: bool, map_written: bool) -> Listener:
    protocol = mapping.get(endpoint.name)
    if protocol is None:
        raise InvalidConfigError(
            f"{setting}: listener {endpoint} has no security protocol: "
            f"listener.security.protocol.map maps only {', '.join(mapping) or 'nothing'} "
            f"(add {endpoint.name}:SASL_SSL, or another protocol, to it)")
    written = listeners_written and (endpoint.name == protocol or map_written)
    return Listener(endpoint.name, endpoint.host, endpoint.port, protocol, written)


def _advertised(endpoint: Endpoint, bound: Sequence[Listener]) -> Listener:
    for listener in bound:
        if listener.name == endpoint.name:
            return dataclasses.replace(listener, host=endpoint.host, port=endpoint.port)
    raise InvalidConfigError(
        f"advertised.listeners: {endpoint} names listener {endpoint.name}, which "
        f"listeners does not define ({', '.join(item.name for item in bound)}): "
        f"advertised names are among the listeners' (Kafka's rule)")


def _check_distinct(listeners: Sequence[Listener], setting: str, ports: bool) -> None:
    names: set[str] = set()
    used: dict[int, Listener] = {}
    for listener in listeners:
        if listener.name in names:
            raise InvalidConfigError(f"{setting}: listener name {listener.name} is given "
                                     f"twice: each listener must have a different name")
        names.add(listener.name)
        if ports and listener.port:
            if listener.port in used:
                raise InvalidConfigError(
                    f"{setting}: {used[listener.port]} and {listener} share port "
                    f"{listener.port}: each listener must have a different port")
            used[listener.port] = listener


def check_exposure(listener: Listener) -> None:
    """The issue's rule for one bound listener: off loopback, SASL_SSL, or a protocol
    the operator wrote for it.

    Raises
    ------
    InsecureListenerError
        It is not on loopback, not SASL_SSL, and its protocol came from a default.
    """
    if listener.loopback or listener.security_protocol == "SASL_SSL" or listener.written:
        return
    where = "every interface" if listener.host in ("", *_UNROUTABLE) else listener.host
    raise InsecureListenerError(
        f"listeners: {listener} would serve {where} with {listener.security_protocol} by "
        f"default: a listener other hosts reach needs TLS and SASL (SASL_SSL, with ssl.* "
        f"and sasl.* settings) unless its protocol is written for it: write listeners "
        f"(e.g. SASL_SSL://:9093, or {listener} to serve it so), or bind it to "
        f"127.0.0.1")
