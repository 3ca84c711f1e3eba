"""The server's side of SASL for Kafka clients: PLAIN and SCRAM-SHA-256/512, without I/O.

Rules
-----
* A connection picks a mechanism (SaslHandshake) among ``sasl.enabled.mechanisms``
  (:func:`enabled_mechanisms`; by default SCRAM-SHA-256 and SCRAM-SHA-512: PLAIN
  hands the password itself to the broker, so it is enabled only when written);
  :func:`server_for` makes that mechanism's state machine, and each SaslAuthenticate's
  ``auth_bytes`` goes to its :meth:`~SaslServer.respond`, which returns a
  :class:`Step`: the bytes to answer with, and once the client is authenticated,
  its principal (the user name; Kafka's principal is ``User:`` and the name).
* Every failure is typed: :class:`~shmlog.common.errors.SaslAuthenticationError` for
  credentials that do not verify, its :class:`~shmlog.common.errors.SaslMessageError`
  for bytes that break the mechanism's syntax or come after the exchange ended
  (both are answered SASL_AUTHENTICATION_FAILED, as Kafka answers a SaslException).
  Whatever a client sends, nothing else is raised. A state machine that failed
  stays failed: the client logs in again on a new connection, as with Kafka.
* An unknown user fails as a wrong password does, at the same step with the same
  message: SCRAM answers its first message with a salt made from the name and a
  secret of this process (so a name's salt does not change between attempts) and
  fails its proof; PLAIN derives a key at the same cost before refusing. (Kafka
  refuses an unknown SCRAM user at once, telling who exists; RFC 5802 section 9
  suggests this instead.) Secrets are compared with ``hmac.compare_digest``.
* PLAIN is RFC 4616: ``[authzid] NUL authcid NUL passwd``, the password checked
  against the user's SCRAM credential (``credentials``). SCRAM is RFC 5802 with
  RFC 7677's hashes, as Kafka's ``ScramSaslServer`` has it: no channel binding
  (GS2 header ``n,,``, or ``n,a=NAME,`` with NAME the user's own), the name's
  ``=2C``/``=3D`` escapes, extensions after the nonce ignored but for ``tokenauth``
  (delegation tokens, which shmlog does not have: refused); the server's nonce is
  ``limits.SCRAM_NONCE_SIZE`` bytes of ``secrets``, iteration counts are the
  credential's (at least 4096, the file is checked when read).
* Client-final's nonce is the one sent, or, as librdkafka 2.0.0-2.0.2 send it (the
  version of Debian 12's kcat), the client's nonce and then the one sent: Kafka's
  brokers took any nonce that *ends with* the one sent, so that bug went unseen.
  shmlog takes that one form only; either way the proof is checked over the
  message as sent, whose end is this exchange's fresh nonce, so it grants nothing
  a replay could use.
* A client message longer than ``limits.SASL_MESSAGE_SIZE_MAX`` is refused unparsed.

Theory of operation
-------------------
PLAIN is one step: the client's message in, an empty answer and the principal out.
SCRAM is two: client-first (``n,,n=NAME,r=CNONCE``) is answered with server-first
(``r=CNONCE+SNONCE,s=SALT,i=ITERATIONS``); client-final (``c=biws,r=NONCE,p=PROOF``)
is checked (the nonce is the one sent, the channel binding repeats the GS2 header,
``H(PROOF xor HMAC(StoredKey, AuthMessage)) == StoredKey``) and answered with
server-final (``v=HMAC(ServerKey, AuthMessage)``), which the client checks in turn.
AuthMessage is client-first without its header, server-first and client-final
without its proof, joined by commas.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
import secrets
from typing import Sequence

from ..common import limits
from ..common.errors import (
    InvalidConfigError,
    SaslAuthenticationError,
    SaslMessageError,
    UnsupportedSaslMechanismError,
)
from .credentials import SCRAM_HASHES, Credentials, ScramCredential

__all__ = ["MECHANISMS", "ENABLED_MECHANISMS_DEFAULT", "Step", "SaslServer", "PlainServer",
           "ScramServer", "server_for", "enabled_mechanisms"]

MECHANISMS = ("PLAIN", *SCRAM_HASHES)
ENABLED_MECHANISMS_DEFAULT = tuple(SCRAM_HASHES)
_FAILED = "Authentication failed: invalid username or password"
# RFC 5802's printable characters but ',' (a nonce), and a name's escapes.
_NONCE = re.compile(rb"[\x21-\x2b\x2d-\x7e]+")
_NAME_ESCAPE = re.compile(rb"=(?!2C|3D)")
_CLIENT_FIRST = re.compile(rb"(?P<gs2>n,(?:a=(?P<authzid>[^,]*))?,)"
                           rb"(?P<bare>n=(?P<name>[^,]*),r=(?P<nonce>[^,]*)"
                           rb"(?P<extensions>(?:,[A-Za-z][^,=]*=[^,]*)*))")
_CLIENT_FINAL = re.compile(rb"(?P<without_proof>c=(?P<binding>[^,]*),r=(?P<nonce>[^,]*)"
                           rb"(?:,[A-Za-z][^,=]*=[^,]*)*),p=(?P<proof>[A-Za-z0-9+/=]+)")
# Salts of names nobody has: stable within this process, unpredictable outside it.
_UNKNOWN_USER_KEY = secrets.token_bytes(32)


@dataclasses.dataclass(frozen=True)
class Step:
    """What to answer a client's SASL message with; ``principal`` (the user name) once
    it is authenticated, None while the exchange goes on."""
    response: bytes
    principal: str | None = None

    @property
    def done(self) -> bool:
        return self.principal is not None


class SaslServer:
    """One connection's exchange for one mechanism: feed :meth:`respond` each message."""
    mechanism = ""

    def __init__(self, credentials: Credentials):
        self._credentials = credentials
        self._over = False

    def respond(self, message: bytes) -> Step:
        """The answer to the client's next message.

        Raises
        ------
        SaslAuthenticationError
            The credentials do not verify.
        SaslMessageError
            The message is malformed, too long, or comes after the exchange ended.
        """
        if self._over:
            raise SaslMessageError(f"{self.mechanism}: the exchange has ended; "
                                   f"authenticate again on a new connection")
        if not isinstance(message, (bytes, bytearray, memoryview)):
            self._over = True
            raise SaslMessageError(f"{self.mechanism}: a message is bytes, not "
                                   f"{type(message).__name__}")
        message = bytes(message)
        if len(message) > limits.SASL_MESSAGE_SIZE_MAX:
            self._over = True
            raise SaslMessageError(f"{self.mechanism}: a message of {len(message)} bytes, "
                                   f"more than {limits.SASL_MESSAGE_SIZE_MAX}")
        try:
            step = self._step(message)
        except SaslAuthenticationError:
            self._over = True
            raise
        self._over = step.done
        return step

    def _step(self, message: bytes) -> Step:
        raise NotImplementedError


class PlainServer(SaslServer):
    """RFC 4616's PLAIN: one message, the password checked against a SCRAM credential."""
    mechanism = "PLAIN"
    # What an unknown name's password is derived against, so it costs what a known
    # name's does.
    _decoy = ScramCredential("SCRAM-SHA-512", secrets.token_bytes(limits.SCRAM_SALT_SIZE),
                             secrets.token_bytes(64), secrets.token_bytes(64),
                             limits.SCRAM_ITERATIONS_DEFAULT)

    def _step(self, message: bytes) -> Step:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise SaslMessageError("PLAIN: a message is [authzid] NUL username NUL password "
                                   f"(RFC 4616); this one has {len(parts) - 1} NULs")
        authzid, user, password = (_utf8(part, "PLAIN") for part in parts)
        if not user or not password:
            raise SaslMessageError(f"PLAIN: {'username' if not user else 'password'} "
                                   f"not given")
        if authzid and authzid != user:
            raise SaslAuthenticationError("Authentication failed: the authorization id "
                                          "differs from the username")
        credential = self._credentials.for_plain(user)
        verified = Credentials.verify_password(credential or self._decoy, parts[2])
        if credential is None or not verified:
            raise SaslAuthenticationError(_FAILED)
        return Step(b"", user)


class ScramServer(SaslServer):
    """RFC 5802's SCRAM for one hash, as Kafka's ScramSaslServer: two messages."""

    def __init__(self, credentials: Credentials, mechanism: str):
        super().__init__(credentials)
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._size = hashlib.new(self._hash).digest_size
        self._first: re.Match | None = None
        self._server_first = b""
        self._credential: ScramCredential | None = None
        self._user = ""

    def _step(self, message: bytes) -> Step:
        if self._first is None:
            return self._answer_first(message)
        return self._answer_final(message)

    def _answer_first(self, message: bytes) -> Step:
        first = _CLIENT_FIRST.fullmatch(message)
        if first is None:
            raise SaslMessageError(f"{self.mechanism}: client-first is n,,n=NAME,r=NONCE "
                                   f"(RFC 5802, no channel binding)")
        self._user = _name(first["name"], self.mechanism)
        if first["authzid"] and _name(first["authzid"], self.mechanism) != self._user:
            raise SaslAuthenticationError("Authentication failed: the authorization id "
                                          "differs from the username")
        if not _NONCE.fullmatch(first["nonce"]):
            raise SaslMessageError(f"{self.mechanism}: the client's nonce must be printable "
                                   f"ASCII without ','")
        for extension in first["extensions"].split(b",")[1:]:
            if extension.partition(b"=")[0] in (b"tokenauth", b"m"):
                raise SaslAuthenticationError(
                    f"Authentication failed: extension {extension.partition(b'=')[0]!r} "
                    f"(delegation tokens, mandatory extensions) is not supported")
        self._credential = self._credentials.scram(self._user, self.mechanism) or \
            self._unknown(self._user)
        nonce = first["nonce"] + secrets.token_urlsafe(limits.SCRAM_NONCE_SIZE).encode()
        salt = base64.b64encode(self._credential.salt)
        self._server_first = b"r=%s,s=%s,i=%d" % (nonce, salt, self._credential.iterations)
        self._first = first
        return Step(self._server_first)

    def _answer_final(self, message: bytes) -> Step:
        assert self._first is not None and self._credential is not None
        final = _CLIENT_FINAL.fullmatch(message)
        if final is None:
            raise SaslMessageError(f"{self.mechanism}: client-final is c=BINDING,r=NONCE,"
                                   f"p=PROOF (RFC 5802)")
        expected_nonce = self._server_first.split(b",", 1)[0][2:]
        if not hmac.compare_digest(final["nonce"], expected_nonce) and \
                not hmac.compare_digest(final["nonce"], self._first["nonce"] + expected_nonce):
            raise SaslMessageError(f"{self.mechanism}: client-final's nonce is not the one "
                                   f"sent")
        if final["binding"] != base64.b64encode(self._first["gs2"]):
            raise SaslMessageError(f"{self.mechanism}: client-final's channel binding does "
                                   f"not repeat the GS2 header (no channel binding here)")
        try:
            proof = base64.b64decode(final["proof"], validate=True)
        except (binascii.Error, ValueError):
            raise SaslMessageError(f"{self.mechanism}: the proof is not base64") from None
        if len(proof) != self._size:
            raise SaslMessageError(f"{self.mechanism}: a proof of {len(proof)} bytes, not "
                                   f"{self._size}")
        auth_message = b",".join((self._first["bare"], self._server_first,
                                  final["without_proof"]))
        signature = hmac.digest(self._credential.stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(),
                                   self._credential.stored_key):
            raise SaslAuthenticationError(_FAILED)
        verifier = hmac.digest(self._credential.server_key, auth_message, self._hash)
        return Step(b"v=" + base64.b64encode(verifier), self._user)

    def _unknown(self, user: str) -> ScramCredential:
        """A credential no password derives, for a name nobody has."""
        salt = hmac.digest(_UNKNOWN_USER_KEY, f"{self.mechanism}\0{user}".encode(),
                           "sha256")
        return ScramCredential(self.mechanism, salt, secrets.token_bytes(self._size),
                               secrets.token_bytes(self._size),
                               limits.SCRAM_ITERATIONS_DEFAULT)


def _utf8(data: bytes, mechanism: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslMessageError(f"{mechanism}: a name or password is not UTF-8") from None


def _name(saslname: bytes, mechanism: str) -> str:
    """A SCRAM saslname unescaped (``=2C`` is ',', ``=3D`` is '=')."""
    if not saslname or _NAME_ESCAPE.search(saslname):
        raise SaslMessageError(f"{mechanism}: a name is not empty and has '=' only in "
                               f"=2C or =3D")
    return _utf8(saslname.replace(b"=2C", b",").replace(b"=3D", b"="), mechanism)


def enabled_mechanisms(value: str | Sequence[str] | None,
                       setting: str = "sasl.enabled.mechanisms") -> tuple[str, ...]:
    """The mechanisms a ``sasl.enabled.mechanisms`` value enables (comma-separated, or
    a list), in its order; the default when None.

    Raises
    ------
    InvalidConfigError
        It names a mechanism shmlog does not have (GSSAPI, OAUTHBEARER, ...), one
        twice, or none.
    """
    if value is None:
        return ENABLED_MECHANISMS_DEFAULT
    if isinstance(value, str):
        names = [name.strip() for name in value.split(",") if name.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
        names = [name.strip() for name in value]
    else:
        raise InvalidConfigError(f"{setting} must be a comma-separated string or a list of "
                                 f"mechanisms, got {value!r:.200}")
    for name in names:
        if name not in MECHANISMS:
            raise InvalidConfigError(f"{setting}: {name!r:.50} is none of the mechanisms "
                                     f"shmlog has ({', '.join(MECHANISMS)}; names are "
                                     f"upper case, as Kafka's)")
    if len(set(names)) != len(names) or not names:
        raise InvalidConfigError(f"{setting} must name each mechanism once, and at least "
                                 f"one, got {value!r:.200}")
    return tuple(names)


def server_for(mechanism: str, credentials: Credentials,
               enabled: Sequence[str] = ENABLED_MECHANISMS_DEFAULT) -> SaslServer:
    """A new exchange for ``mechanism`` (the client's SaslHandshake), if enabled.

    Raises
    ------
    UnsupportedSaslMechanismError
        It is not among ``enabled``.
    """
    if mechanism not in enabled or mechanism not in MECHANISMS:
        raise UnsupportedSaslMechanismError(
            f"SASL mechanism {mechanism!r:.50} is not enabled here: "
            f"{', '.join(enabled) or 'none is'} (sasl.enabled.mechanisms)")
    if mechanism == "PLAIN":
        return PlainServer(credentials)
    return ScramServer(credentials, mechanism)
