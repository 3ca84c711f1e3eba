"""A SASL listener's logins, frame by frame (``wire.authenticator``): Kafka's order
(ApiVersions to the loop, SaslHandshake, SaslAuthenticate), anything else before
login closing the connection unanswered, failures answered SASL_AUTHENTICATION_FAILED
then closed, a mechanism not enabled answered UNSUPPORTED_SASL_MECHANISM, bare v0
tokens, and the worker threads: results delivered, a full queue refused, a check
that raises closing its connection.

Method: request frames written with kafka-python's message classes and fed to a
real Authenticator over a real credentials table; its ``work`` run here or on a real
SaslWorker whose threads are held on an Event. The listener's own tests
(``tests/wire/test_kafka_security.py``) cover the same against real clients.
"""

from __future__ import annotations

import queue
import struct
import threading

import pytest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from shmlog.wire import credentials
from shmlog.wire.authenticator import Action, Authenticator, SaslSettings, SaslWorker

WAIT_S = 30
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")


@pytest.fixture(scope="module")
def settings():
    users = credentials.Credentials({"alice": {
        "SCRAM-SHA-256": credentials.scram_credential("secret", "SCRAM-SHA-256", 4096)}})
    return SaslSettings(MECHANISMS, users)


def frame(request, correlation_id: int = 7) -> bytes:
    version = request.API_VERSION
    header = struct.pack(">hhih", request.API_KEY, version, correlation_id, 4) + b"test"
    if request.flexible_version_q(version):
        header += b"\x00"
    return header + bytes(request.encode(version=version))


def decoded(buffers, response_class, version: int):
    (answer,) = buffers
    body = answer[4 + 4:]                                    # size, correlation id
    if response_class.flexible_version_q(version):
        body = body[1:]                                      # no tagged fields
    return response_class.decode(body, version=version)


def handshake(authenticator, mechanism="PLAIN", version=1):
    action = authenticator.on_frame(frame(SaslHandshakeRequest(version=version,
                                                               mechanism=mechanism)))
    return action, decoded(action.buffers, SaslHandshakeResponse, version)


def test_kafkas_order_logs_a_client_in(settings):
    authenticator = Authenticator(settings)
    assert authenticator.on_frame(frame(_api_versions())).to_loop
    action, answer = handshake(authenticator)
    assert answer.error_code == 0 and answer.mechanisms == list(MECHANISMS) and not action.close
    action = authenticator.on_frame(frame(SaslAuthenticateRequest(
        version=2, auth_bytes=b"\0alice\0secret")))
    assert action.work is not None and not authenticator.done
    result = action.work()
    answer = decoded(result.buffers, SaslAuthenticateResponse, 2)
    assert answer.error_code == 0 and answer.session_lifetime_ms == 0 and not result.close
    assert authenticator.done and authenticator.principal == "alice"


def test_a_wrong_password_is_answered_failed_then_closed(settings):
    authenticator = Authenticator(settings)
    handshake(authenticator)
    result = authenticator.on_frame(frame(SaslAuthenticateRequest(
        version=1, auth_bytes=b"\0alice\0guess"))).work()
    answer = decoded(result.buffers, SaslAuthenticateResponse, 1)
    assert answer.error_code == 58 and "invalid username or password" in answer.error_message
    assert result.close and not authenticator.done


def test_a_mechanism_not_enabled_is_answered_with_those_enabled_then_closed(settings):
    action, answer = handshake(Authenticator(settings), "SCRAM-SHA-512")
    assert answer.error_code == 33 and answer.mechanisms == list(MECHANISMS)
    assert action.close and "SCRAM-SHA-512" in action.reason


@pytest.mark.parametrize("request_", [
    MetadataRequest(version=1, topics=None),
    SaslAuthenticateRequest(version=0, auth_bytes=b"\0alice\0secret"),    # before handshake
], ids=["metadata", "authenticate-first"])
def test_a_request_out_of_kafkas_order_closes_unanswered(settings, request_):
    action = Authenticator(settings).on_frame(frame(request_))
    assert action.close and not action.buffers and "before the SASL login" in action.reason


def test_a_second_handshake_or_a_bad_version_or_bytes_close_unanswered(settings):
    authenticator = Authenticator(settings)
    handshake(authenticator)
    assert authenticator.on_frame(frame(SaslHandshakeRequest(version=1,
                                                             mechanism="PLAIN"))).close
    header = struct.pack(">hhih", 17, 5, 1, 4) + b"test"
    action = Authenticator(settings).on_frame(header + b"\0\0")
    assert action.close and "versions 0 to 1" in action.reason
    assert Authenticator(settings).on_frame(b"\0").close


def test_bare_v0_tokens_log_in_and_a_wrong_one_closes_unanswered(settings):
    authenticator = Authenticator(settings)
    handshake(authenticator, version=0)
    result = authenticator.on_frame(b"\0alice\0secret").work()
    assert result.buffers == (b"\0\0\0\0",) and authenticator.done
    authenticator = Authenticator(settings)
    handshake(authenticator, version=0)
    result = authenticator.on_frame(b"\0alice\0guess").work()
    assert result.close and not result.buffers


def test_the_worker_delivers_refuses_past_its_bound_and_survives_a_failing_check():
    delivered: queue.Queue = queue.Queue()
    release = threading.Event()
    worker = SaslWorker(lambda connection_id, action: delivered.put((connection_id, action)),
                        threads=1, waiting_max=2)
    try:
        held, taken = Action(buffers=(b"held",)), threading.Event()
        assert worker.submit(1, lambda: taken.set() or release.wait(WAIT_S) and held)
        assert taken.wait(WAIT_S)
        # The one thread is held by connection 1's check; two more wait; a third is
        # refused (the listener answers it with the refusal Action).
        assert worker.submit(2, lambda: Action(buffers=(b"two",)))
        assert worker.submit(3, lambda: 1 / 0)
        assert not worker.submit(4, lambda: Action())
        release.set()
        results = dict(delivered.get(timeout=WAIT_S) for _ in range(3))
        assert results[1] is held and results[2].buffers == (b"two",)
        assert results[3].close and "could not be checked" in results[3].reason
    finally:
        release.set()
        worker.stop()


def _api_versions():
    from kafka.protocol.metadata import ApiVersionsRequest
    return ApiVersionsRequest(version=3, client_software_name="test",
                              client_software_version="1")
