"""The TLS a Kafka listener serves (SSL, SASL_SSL): a server ``ssl.SSLContext`` from
PEM files.

Rules
-----
* Settings are named as librdkafka names them, since Kafka's name JKS keystores
  (``ssl.keystore.location``) and shmlog reads PEM: ``ssl.certificate.location`` (the
  server's certificate chain, leaf first), ``ssl.key.location`` (its private key),
  ``ssl.key.password`` (when the key is encrypted), ``ssl.ca.location`` (the CAs
  client certificates are checked against); Kafka's own names where the meaning is
  Kafka's: ``ssl.client.auth`` (``none``, ``requested``, ``required``; default
  none), ``ssl.enabled.protocols`` (a subset of TLSv1.2 and TLSv1.3, Kafka's
  default both) and ``ssl.cipher.suites`` (OpenSSL's cipher list for TLS 1.2, as
  librdkafka's; TLS 1.3's suites are OpenSSL's defaults). Kafka's JKS names are
  refused with the PEM name to use; another ``ssl.*`` name is refused as unknown.
* TLS 1.2 at least, whatever is written (TLSv1 and TLSv1.1 are refused: RFC 8996
  deprecates them); TLS renegotiation off (``OP_NO_RENEGOTIATION``), compression off.
  Python's server defaults give the rest (its cipher list: forward secrecy, AEAD).
* The private key is a secret (``wire.files``: owner only, the broker's user's or
  root's; it may be a symbolic link, as certbot's are, and the file it names is
  checked); certificates may be read by anyone. OpenSSL reads each file through the
  descriptor that was checked. An encrypted key without ``ssl.key.password`` is an
  error, never a prompt on the broker's terminal.
* Client authentication (``requested``, ``required``) needs ``ssl.ca.location``:
  without it no client certificate could verify.
* Every refusal is an :class:`~shmlog.common.errors.InvalidConfigError` naming the
  setting and saying what OpenSSL found wrong.

Theory of operation
-------------------
:meth:`TlsSettings.from_mapping` reads the ``ssl.*`` names of a listener's settings;
:func:`server_context` builds the context once, when the broker starts (a bad file
fails the start, not a client's handshake). The socket server wraps each accepted
connection of an SSL or SASL_SSL listener with it (``server_side=True``); with
client authentication, ``getpeercert()`` then gives the client's certificate.
"""

from __future__ import annotations

import dataclasses
import ssl
from typing import Any, Mapping

from ..common import limits
from ..common.errors import InvalidConfigError
from . import files

__all__ = ["CLIENT_AUTH", "PROTOCOLS", "TlsSettings", "server_context"]

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}
PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_OLD_PROTOCOLS = ("SSLv2", "SSLv3", "TLSv1", "TLSv1.1")
_NAMES = {"ssl.certificate.location": "certificate_location",
          "ssl.key.location": "key_location", "ssl.key.password": "key_password",
          "ssl.ca.location": "ca_location", "ssl.client.auth": "client_auth",
          "ssl.enabled.protocols": "enabled_protocols", "ssl.cipher.suites": "cipher_suites"}
_JKS_NAMES = {"ssl.keystore.location": "ssl.certificate.location and ssl.key.location",
              "ssl.keystore.password": "ssl.key.password",
              "ssl.keystore.type": "ssl.certificate.location (PEM)",
              "ssl.truststore.location": "ssl.ca.location",
              "ssl.truststore.password": "nothing (a PEM CA file has none)",
              "ssl.truststore.type": "ssl.ca.location (PEM)"}


@dataclasses.dataclass(frozen=True, repr=False)
class TlsSettings:
    """A listener's TLS settings (the field of each ``ssl.*`` name, dots made ``_``)."""
    certificate_location: str
    key_location: str
    key_password: str | None = None
    ca_location: str | None = None
    client_auth: str = "none"
    enabled_protocols: tuple[str, ...] = tuple(PROTOCOLS)
    cipher_suites: str | None = None

    def __repr__(self) -> str:                   # the key's password stays out of logs
        return (f"TlsSettings(certificate={self.certificate_location!r}, "
                f"key={self.key_location!r}, ca={self.ca_location!r}, "
                f"client_auth={self.client_auth!r}, protocols={self.enabled_protocols})")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> "TlsSettings":
        """The settings of the ``ssl.*`` names in ``settings`` (other names are not
        ours and are left alone).

        Raises
        ------
        InvalidConfigError
            An unknown or JKS ``ssl.*`` name, a value of the wrong type, or no
            certificate or key.
        """
        fields: dict[str, Any] = {}
        for name, value in settings.items():
            if not name.startswith("ssl."):
                continue
            if name not in _NAMES:
                advice = f"use {_JKS_NAMES[name]} (PEM files, librdkafka's names)" \
                    if name in _JKS_NAMES else f"the names are {', '.join(_NAMES)}"
                raise InvalidConfigError(f"{name} is not a setting shmlog reads: {advice}")
            if name == "ssl.enabled.protocols" and isinstance(value, str):
                value = tuple(item.strip() for item in value.split(",") if item.strip())
            elif name == "ssl.enabled.protocols" and isinstance(value, list):
                value = tuple(value)
            fields[_NAMES[name]] = value
        for name in ("ssl.certificate.location", "ssl.key.location"):
            if _NAMES[name] not in fields:
                raise InvalidConfigError(f"{name} is required for TLS (an SSL or SASL_SSL "
                                         f"listener): the path of a PEM file")
        settings_ = cls(**fields)
        settings_.check()
        return settings_

    def check(self) -> None:
        """Raise :class:`InvalidConfigError` for a value of the wrong kind (files are
        read by :func:`server_context`)."""
        for name in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password",
                     "ssl.ca.location", "ssl.cipher.suites"):
            value = getattr(self, _NAMES[name])
            optional = name not in ("ssl.certificate.location", "ssl.key.location")
            if not (isinstance(value, str) and value) and not (optional and value is None):
                shown = "another value" if "password" in name else repr(value)[:100]
                raise InvalidConfigError(f"{name} must be a non-empty string, got {shown}")
        if self.client_auth not in CLIENT_AUTH:
            raise InvalidConfigError(f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, "
                                     f"got {self.client_auth!r:.50}")
        if self.client_auth != "none" and self.ca_location is None:
            raise InvalidConfigError(f"ssl.client.auth={self.client_auth} needs ssl.ca.location:"
                                     f" the CAs a client's certificate is checked against")
        protocols = self.enabled_protocols
        if not isinstance(protocols, tuple) or not protocols or \
                any(protocol not in PROTOCOLS for protocol in protocols):
            old = [item for item in protocols if item in _OLD_PROTOCOLS] \
                if isinstance(protocols, tuple) else []
            reason = f" ({', '.join(old)}: deprecated by RFC 8996)" if old else ""
            raise InvalidConfigError(f"ssl.enabled.protocols must name some of "
                                     f"{', '.join(PROTOCOLS)}, got {protocols!r:.100}{reason}")


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The server context of ``settings``, its files read and checked now.

    Raises
    ------
    InvalidConfigError
        A setting is invalid, a file cannot be read or is not private enough (the
        key), OpenSSL refuses a file (not PEM, a key that does not match the
        certificate, a wrong password), or the cipher list selects nothing.
    """
    settings.check()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(PROTOCOLS[protocol] for protocol in settings.enabled_protocols)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    context.options |= ssl.OP_NO_COMPRESSION | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    if settings.cipher_suites is not None:
        try:
            context.set_ciphers(settings.cipher_suites)
        except ssl.SSLError as error:
            raise InvalidConfigError(f"ssl.cipher.suites: OpenSSL selects no cipher of "
                                     f"{settings.cipher_suites!r:.200}: {error}") from None
    _load_chain(context, settings)
    if settings.ca_location is not None:
        with files.opened(settings.ca_location, "ssl.ca.location",
                          limits.TLS_PEM_FILE_SIZE_MAX, private=False) as descriptor:
            try:
                context.load_verify_locations(cafile=files.descriptor_path(descriptor))
            except ssl.SSLError as error:
                raise InvalidConfigError(f"ssl.ca.location: {settings.ca_location} holds no "
                                         f"PEM CA certificate OpenSSL takes: {error}") from None
    context.verify_mode = CLIENT_AUTH[settings.client_auth]
    return context


def _load_chain(context: ssl.SSLContext, settings: TlsSettings) -> None:
    def password() -> str:
        if settings.key_password is None:
            raise InvalidConfigError(f"ssl.key.location: {settings.key_location} is "
                                     f"encrypted: give its password in ssl.key.password")
        return settings.key_password

    size_max = limits.TLS_PEM_FILE_SIZE_MAX
    with files.opened(settings.certificate_location, "ssl.certificate.location", size_max,
                      private=False) as certificate, \
            files.opened(settings.key_location, "ssl.key.location", size_max,
                         private=True) as key:
        try:
            context.load_cert_chain(files.descriptor_path(certificate),
                                    files.descriptor_path(key), password)
        except ssl.SSLError as error:
            raise InvalidConfigError(_chain_refusal(settings, error)) from None
        except OSError as error:
            raise InvalidConfigError(f"ssl.certificate.location, ssl.key.location: cannot "
                                     f"read {settings.certificate_location} or "
                                     f"{settings.key_location}: {error}") from None


def _chain_refusal(settings: TlsSettings, error: ssl.SSLError) -> str:
    reason = f"{error.library or ''} {error.reason or error}".strip().lower()
    if "mismatch" in reason:
        return (f"ssl.key.location: {settings.key_location} is not the key of the "
                f"certificate in {settings.certificate_location} ({error})")
    if settings.key_password is not None and ("decrypt" in reason or "pem" in reason):
        return (f"ssl.key.password: {settings.key_location} does not decrypt with it, or "
                f"is not a PEM key ({error})")
    return (f"ssl.certificate.location, ssl.key.location: OpenSSL takes no PEM certificate "
            f"chain from {settings.certificate_location} with PEM key "
            f"{settings.key_location} ({error})")
