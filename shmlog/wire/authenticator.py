"""SASL logins on a Kafka listener (Kafka's ``SaslServerAuthenticator``): what the
listener's socket server does with a connection's requests until its client is
logged in.

Rules
-----
* Until a connection of a SASL listener (SASL_PLAINTEXT, SASL_SSL) is logged in,
  each request it sends goes to its :class:`Authenticator`, never straight to the
  broker's loop: ApiVersions goes on to the loop (clients ask it first, to learn the
  SASL APIs' versions); SaslHandshake (v0-1) and SaslAuthenticate (v0-2) are
  answered here; any other request, or one out of turn, closes the connection
  unanswered, as Kafka does ("Unexpected Kafka request of type ... during SASL
  handshake"). Before login a request frame may be at most
  ``limits.KAFKA_UNAUTHENTICATED_REQUEST_SIZE_MAX`` (Kafka's
  ``sasl.server.max.receive.size``); the socket server closes on a larger one.
* Kafka's order: SaslHandshake names a mechanism of ``sasl.enabled.mechanisms`` (one
  not enabled is answered UNSUPPORTED_SASL_MECHANISM with the enabled ones, then the
  connection is closed); then the mechanism's messages, each in a SaslAuthenticate
  request after a v1 handshake, or, after a v0 handshake, as bare size-prefixed
  tokens answered the same way (Kafka 0.10's framing, which Kafka still serves).
* Checking a message (PLAIN's PBKDF2 costs milliseconds) runs on a
  :class:`SaslWorker` thread, never on the broker's loop (which serves every
  other connection). The workers are few
  (``limits.SASL_WORKER_THREADS_COUNT``) and their queue bounded
  (``limits.SASL_LOGINS_WAITING_MAX``): a login over it is refused as failed, saying
  the broker is busy.
* A failed login is answered SASL_AUTHENTICATION_FAILED with its message (a bare v0
  token gets no answer: Kafka closes then too), and the connection is closed once
  the answer is written. The message never says whether the user exists.
* No re-authentication (KIP-368): SaslAuthenticate v1+ answers
  ``session_lifetime_ms`` 0, which tells a client its session does not expire
  (Kafka's default, ``connections.max.reauth.ms`` 0), so it never logs in again on
  a connection. A SaslHandshake or SaslAuthenticate after login (or on a listener
  without SASL) reaches the broker's loop, which answers ILLEGAL_SASL_STATE
  (:class:`SaslStateApi`), as Kafka's ``KafkaApis`` does.

Theory of operation
-------------------
The socket server asks :meth:`Authenticator.on_frame` what to do with each frame of
a connection not logged in; the :class:`Action` says: answer these buffers (and
perhaps close), close, pass the frame to the loop, or run ``work`` on a worker,
whose result is another Action (delivered back to the loop through the socket
server's outbox). A connection has one request handled at a time, so the worker and
the loop never touch one Authenticator at once. :attr:`Authenticator.done`
turns true on the worker when the mechanism's last step verifies; the socket
server reads it after the result came back, and from then on hands the
connection's requests to the loop.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import struct
import threading
from typing import Callable

from ..common import limits
from ..common.errors import (
    InvalidConfigError,
    KafkaRequestError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from . import codec
from .credentials import Credentials
from .credentials import load as load_credentials
from .error_codes import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
)
from .sasl import SaslServer, enabled_mechanisms, server_for

__all__ = ["SASL_HANDSHAKE_KEY", "SASL_AUTHENTICATE_KEY", "SaslSettings", "Action",
           "Authenticator", "SaslWorker", "SaslStateApi"]

log = logging.getLogger("shmlog.broker.kafka")

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
_HANDSHAKE_VERSIONS = (0, 1)
_AUTHENTICATE_VERSIONS = (0, 2)
_SIZE = struct.Struct(">i")


@dataclasses.dataclass(frozen=True, repr=False)
class SaslSettings:
    """What a SASL listener logs clients in with: the mechanisms it enables and the
    users' credentials."""
    mechanisms: tuple[str, ...]
    credentials: Credentials

    def __repr__(self) -> str:
        return f"SaslSettings({', '.join(self.mechanisms)}; {self.credentials!r})"

    @classmethod
    def from_config(cls, mechanisms, credentials_file: str | None) -> "SaslSettings":
        """The settings of ``sasl_enabled_mechanisms`` and ``sasl_credentials_file``
        (the file read and checked now, when the broker starts).

        Raises
        ------
        InvalidConfigError
            No credentials file, or it or the mechanisms are invalid.
        """
        if not credentials_file:
            raise InvalidConfigError(
                "sasl_credentials_file is required for a SASL listener (SASL_SSL, "
                "SASL_PLAINTEXT): the users' credentials (python -m shmlog.wire.credentials "
                "USER prints an entry for it)")
        enabled = enabled_mechanisms(mechanisms, "sasl_enabled_mechanisms")
        return cls(enabled, load_credentials(credentials_file, "sasl_credentials_file"))


@dataclasses.dataclass(frozen=True)
class Action:
    """What the socket server does with a frame of a connection not logged in:
    write ``buffers`` (a framed answer), then close if ``close``; or pass the frame
    to the broker's loop (``to_loop``); or run ``work`` on a worker (its result is
    the Action), doing ``refusal`` instead when the workers are too busy."""
    buffers: tuple = ()
    close: bool = False
    to_loop: bool = False
    work: Callable[[], "Action"] | None = None
    refusal: "Action | None" = None
    reason: str = ""                   # why it closes, for the log


class Authenticator:
    """One connection's login, from its first request until it is logged in."""

    def __init__(self, settings: SaslSettings) -> None:
        self._settings = settings
        self._server: SaslServer | None = None
        self._raw = False                   # after a v0 handshake: bare tokens
        #: The user logged in as (Kafka's principal is ``User:`` and it); None before.
        self.principal: str | None = None

    @property
    def done(self) -> bool:
        return self.principal is not None

    @property
    def mechanism(self) -> str | None:
        return None if self._server is None else self._server.mechanism

    def on_frame(self, frame: bytes) -> Action:
        """What to do with the connection's next request frame."""
        if self._raw:
            return Action(work=functools.partial(self._token, frame),
                          refusal=Action(close=True, reason=_busy()))
        try:
            header = codec.read_header(memoryview(frame))
            if header.api_key == codec.API_VERSIONS_KEY:
                return Action(to_loop=True)
            if header.api_key == SASL_HANDSHAKE_KEY and self._server is None:
                return self._handshake(header, frame)
            if header.api_key == SASL_AUTHENTICATE_KEY and self._server is not None:
                return self._authenticate(header, frame)
            return Action(close=True, reason=f"{header.describe()} before the SASL login "
                                             f"finished (Kafka's order: ApiVersions, "
                                             f"SaslHandshake, SaslAuthenticate)")
        except KafkaRequestError as error:
            return Action(close=True, reason=str(error))

    # -- the broker's loop ------------------------------------------------------------
    def _handshake(self, header: codec.RequestHeader, frame: bytes) -> Action:
        _check_version(header, _HANDSHAKE_VERSIONS)
        body = codec.decode_request(header, memoryview(frame))
        enabled = list(self._settings.mechanisms)
        cls = codec.response_class(SASL_HANDSHAKE_KEY)
        try:
            self._server = server_for(body.mechanism, self._settings.credentials,
                                      self._settings.mechanisms)
        except UnsupportedSaslMechanismError as error:
            answer = cls(version=header.api_version, error_code=UNSUPPORTED_SASL_MECHANISM,
                         mechanisms=enabled)
            return Action((codec.encode_response(header, answer),), close=True,
                          reason=str(error))
        self._raw = header.api_version == 0
        answer = cls(version=header.api_version, error_code=NONE, mechanisms=enabled)
        return Action((codec.encode_response(header, answer),))

    def _authenticate(self, header: codec.RequestHeader, frame: bytes) -> Action:
        _check_version(header, _AUTHENTICATE_VERSIONS)
        body = codec.decode_request(header, memoryview(frame))
        busy = _busy()
        refusal = Action((_authenticate_answer(header, SASL_AUTHENTICATION_FAILED, busy),),
                         close=True, reason=busy)
        return Action(work=functools.partial(self._check, header, bytes(body.auth_bytes)),
                      refusal=refusal)

    # -- a worker thread -----------------------------------------------------------------
    def _check(self, header: codec.RequestHeader, message: bytes) -> Action:
        try:
            step = self._server.respond(message)
        except SaslAuthenticationError as error:
            return Action((_authenticate_answer(header, SASL_AUTHENTICATION_FAILED,
                                                str(error)),),
                          close=True, reason=f"SASL {self.mechanism} login failed: {error}")
        answer = _authenticate_answer(header, NONE, None, step.response)
        self.principal = step.principal
        return Action((answer,))

    def _token(self, token: bytes) -> Action:
        try:
            step = self._server.respond(token)
        except SaslAuthenticationError as error:
            return Action(close=True, reason=f"SASL {self.mechanism} login (v0 tokens) "
                                             f"failed: {error}")
        if step.done:
            self._raw = False
        self.principal = step.principal
        return Action((_SIZE.pack(len(step.response)) + step.response,))


def _check_version(header: codec.RequestHeader, versions: tuple[int, int]) -> None:
    if not versions[0] <= header.api_version <= versions[1]:
        raise KafkaRequestError(f"{header.describe()}: this broker serves versions "
                                f"{versions[0]} to {versions[1]} of it (see ApiVersions)")


def _authenticate_answer(header: codec.RequestHeader, error_code: int,
                         message: str | None, auth_bytes: bytes = b"") -> bytes:
    answer = codec.response_class(SASL_AUTHENTICATE_KEY)(
        version=header.api_version, error_code=error_code, error_message=message,
        auth_bytes=auth_bytes, session_lifetime_ms=0)
    return codec.encode_response(header, answer)


def _busy() -> str:
    return (f"the broker has {limits.SASL_LOGINS_WAITING_MAX} SASL logins waiting "
            f"(limits.SASL_LOGINS_WAITING_MAX): connect again")


class SaslWorker:
    """Threads that run logins' checks (:attr:`Action.work`), handing each result to
    ``deliver(connection_id, action)`` (the socket server's outbox)."""

    def __init__(self, deliver: Callable[[int, Action], None],
                 threads: int = limits.SASL_WORKER_THREADS_COUNT,
                 waiting_max: int = limits.SASL_LOGINS_WAITING_MAX) -> None:
        self._deliver = deliver
        self._queue: queue.Queue = queue.Queue(waiting_max)
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"shmlog-kafka-sasl-{number}",
                                          daemon=True) for number in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, connection_id: int, work: Callable[[], Action]) -> bool:
        """Queue ``work`` for the connection; False when the queue is full."""
        try:
            self._queue.put_nowait((connection_id, work))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self._queue.get()
            if item is None:
                return
            connection_id, work = item
            try:
                action = work()
            except Exception:              # noqa: BLE001 - a bug must not end the thread
                log.exception("Kafka listener: checking a SASL message failed; the "
                              "connection is closed")
                action = Action(close=True, reason="its SASL message could not be checked")
            self._deliver(connection_id, action)

    def stop(self) -> None:
        """End the threads (logins waiting are dropped: their connections close)."""
        self._stopping.set()
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass                       # a thread sees _stopping after its item
        for thread in self._threads:
            thread.join(timeout=10)


class SaslStateApi:
    """SaslHandshake and SaslAuthenticate as the broker's loop answers them: only for
    a connection already logged in, or on a listener without SASL (the listener's
    thread answers them before login), so ILLEGAL_SASL_STATE, as Kafka's
    ``KafkaApis`` does (no re-authentication: see the module's rules)."""

    def apis(self) -> dict:
        return {SASL_HANDSHAKE_KEY: (*_HANDSHAKE_VERSIONS, self.handshake),
                SASL_AUTHENTICATE_KEY: (*_AUTHENTICATE_VERSIONS, self.authenticate)}

    def handshake(self, request, header, body):
        return codec.response_class(SASL_HANDSHAKE_KEY)(
            version=header.api_version, error_code=ILLEGAL_SASL_STATE, mechanisms=[])

    def authenticate(self, request, header, body):
        return codec.response_class(SASL_AUTHENTICATE_KEY)(
            version=header.api_version, error_code=ILLEGAL_SASL_STATE,
            error_message="this connection is logged in already, or its listener has no "
                          "SASL: a SASL login happens once, before other requests",
            auth_bytes=b"", session_lifetime_ms=0)
