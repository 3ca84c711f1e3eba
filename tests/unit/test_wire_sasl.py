"""SASL for Kafka clients: the server's PLAIN and SCRAM-SHA-256/512 against kafka-python's
own client side.

Goal: a Kafka client logs in with the right password over each mechanism (and
checks the server's signature, so the server proved it holds the credential), and
is refused with a wrong password or an unknown name alike; the SCRAM exchange is
RFC 7677's byte for byte; every malformed or out-of-turn message a client can send
is a typed ``SaslAuthenticationError`` (or its ``SaslMessageError``), never another
exception; a mechanism not enabled is an ``UnsupportedSaslMechanismError``.

Method: kafka-python 3.0.12's ``SaslMechanismScram`` and ``SaslMechanismPlain``
(the classes its connections use) exchange messages with ``sasl.server_for``'s state
machines in-process, as a connection's SaslAuthenticate requests would carry them;
RFC 7677's example with the server's nonce fixed; hand-made and mutated messages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random

import pytest
from kafka.net.sasl.plain import SaslMechanismPlain
from kafka.net.sasl.scram import SaslMechanismScram

from shmlog.common import limits
from shmlog.common.errors import (
    InvalidConfigError,
    SaslAuthenticationError,
    SaslMessageError,
    UnsupportedSaslMechanismError,
)
from shmlog.wire import credentials, sasl

SCRAMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ALL = sasl.MECHANISMS


@pytest.fixture(scope="module")
def users():
    """alice has both SCRAM credentials, "b,=b" (a name SCRAM escapes) SHA-256 only."""
    return credentials.parse(credentials.user_entry("alice", "alice-secret")
                             + credentials.user_entry("b,=b", "pässword", ("SCRAM-SHA-256",),
                                                      iterations=4096))


def scram_login(users, mechanism, user, password, wire_name=None):
    """kafka-python's client against the server: the principal, or the server's error."""
    client = SaslMechanismScram(sasl_plain_username=wire_name or user,
                                sasl_plain_password=password, sasl_mechanism=mechanism)
    server = sasl.server_for(mechanism, users, ALL)
    first = server.respond(client.auth_bytes())
    assert not first.done
    client.receive(first.response)
    final = server.respond(client.auth_bytes())
    client.receive(final.response)              # raises if the server's signature is wrong
    assert client.is_done() and client.is_authenticated() and final.done
    return final.principal


def plain_login(users, user, password):
    client = SaslMechanismPlain(sasl_plain_username=user, sasl_plain_password=password)
    step = sasl.server_for("PLAIN", users, ALL).respond(client.auth_bytes())
    client.receive(step.response)
    assert client.is_authenticated() and step.done
    return step.principal


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_logs_kafka_python_in_with_the_right_password(users, mechanism):
    assert scram_login(users, mechanism, "alice", "alice-secret") == "alice"


def test_scram_names_with_commas_and_equals_travel_escaped(users):
    # kafka-python sends the name as given: the escaped form is what a client sends.
    assert scram_login(users, "SCRAM-SHA-256", "b,=b", "pässword", "b=2C=3Db") == "b,=b"


@pytest.mark.parametrize("mechanism", SCRAMS)
@pytest.mark.parametrize("user, password", [
    ("alice", "wrong"), ("alice", "alice-secreT"), ("alice", ""), ("nobody", "alice-secret"),
    ("b=3Db", "pässword")])
def test_scram_refuses_a_wrong_password_and_an_unknown_name_alike(users, mechanism, user,
                                                                  password):
    with pytest.raises(SaslAuthenticationError) as caught:
        scram_login(users, mechanism, user, password)
    assert type(caught.value) is SaslAuthenticationError
    assert str(caught.value) == "Authentication failed: invalid username or password"


def test_scram_sha_512_has_no_credential_for_a_sha_256_only_user(users):
    with pytest.raises(SaslAuthenticationError):
        scram_login(users, "SCRAM-SHA-512", "b,=b", "pässword", "b=2C=3Db")


def test_an_unknown_name_gets_a_salt_that_does_not_change(users):
    def server_first(user):
        server = sasl.server_for("SCRAM-SHA-256", users, ALL)
        fields = dict(field.split(b"=", 1) for field in
                      server.respond(b"n,,n=" + user + b",r=abc").response.split(b","))
        return fields[b"s"], fields[b"i"], fields[b"r"]

    salt, iterations, nonce = server_first(b"nobody")
    assert server_first(b"nobody")[:2] == (salt, iterations)
    assert server_first(b"nobody2")[0] != salt
    assert len(base64.b64decode(salt)) == 32 and int(iterations) >= 4096
    assert nonce.startswith(b"abc") and len(nonce) >= 3 + limits.SCRAM_NONCE_SIZE
    assert server_first(b"nobody")[2] != nonce           # a new nonce every exchange


def test_scram_sha_256_is_rfc_7677s_example_byte_for_byte(monkeypatch):
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    users = credentials.Credentials({"user": {"SCRAM-SHA-256": credentials.scram_credential(
        "pencil", "SCRAM-SHA-256", 4096, salt)}})
    monkeypatch.setattr(sasl.secrets, "token_urlsafe",
                        lambda size: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server = sasl.server_for("SCRAM-SHA-256", users, ALL)
    first = server.respond(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first.response == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                              b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = server.respond(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == sasl.Step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", "user")


def test_plain_logs_kafka_python_in_against_the_scram_credential(users):
    assert plain_login(users, "alice", "alice-secret") == "alice"
    assert plain_login(users, "b,=b", "pässword") == "b,=b"      # its SHA-256 credential


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("nobody", "alice-secret"),
                                            ("alice", "alice-secret\0")])
def test_plain_refuses_a_wrong_password_and_an_unknown_name_alike(users, user, password):
    with pytest.raises(SaslAuthenticationError) as caught:
        plain_login(users, user, password)
    assert isinstance(caught.value, SaslAuthenticationError)


def test_plain_takes_an_authorization_id_only_its_own(users):
    server = sasl.server_for("PLAIN", users, ALL)
    assert server.respond(b"\0alice\0alice-secret").principal == "alice"
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        sasl.server_for("PLAIN", users, ALL).respond(b"admin\0alice\0alice-secret")


@pytest.mark.parametrize("message", [
    b"", b"alice", b"alice\0alice-secret", b"\0\0alice\0alice-secret", b"a\0alice\0",
    b"\0\0secret", b"\0al\xffice\0x", b"\0alice\0\xff", b"\0" * 5,
    b"\0alice\0" + b"x" * limits.SASL_MESSAGE_SIZE_MAX, "\0alice\0alice-secret", None, 42])
def test_malformed_plain_messages_are_typed(users, message):
    with pytest.raises(SaslMessageError):
        sasl.server_for("PLAIN", users, ALL).respond(message)


@pytest.mark.parametrize("first", [
    b"", b"n,,", b"y,,n=alice,r=abc", b"p=tls-unique,,n=alice,r=abc", b"n,,n=alice",
    b"n,,n=,r=abc", b"n,,n=al=ice,r=abc", b"n,,n=al=2Xice,r=abc", b"n,,n=alice,r=",
    b"n,,n=alice,r=a\x7fc", b"n,,n=alice,r=abc,", b"n,,n=\xff,r=abc", b"n,,r=abc,n=alice",
    b"n,,n=alice,r=abc,=x", b"n,n=alice,r=abc", b",,n=alice,r=abc", b"n,,n=alice,r=abc\0",
    b"n,a=al=ice,n=alice,r=abc", bytearray(b"n,,n=alice,r=") + b"a" * 9000, "n,,n=alice,r=abc"])
@pytest.mark.parametrize("mechanism", SCRAMS)
def test_malformed_scram_first_messages_are_typed(users, mechanism, first):
    with pytest.raises(SaslMessageError):
        sasl.server_for(mechanism, users, ALL).respond(first)


@pytest.mark.parametrize("first, words", [
    (b"n,a=admin,n=alice,r=abc", "authorization id"),
    (b"n,,n=alice,r=abc,tokenauth=true", "not supported"),
    (b"n,,n=alice,r=abc,m=must", "not supported")])
def test_scram_refuses_another_identity_and_delegation_tokens(users, first, words):
    with pytest.raises(SaslAuthenticationError, match=words):
        sasl.server_for("SCRAM-SHA-256", users, ALL).respond(first)


def test_scram_takes_an_authorization_id_of_its_own_name_and_other_extensions(users):
    # kafka-python sends neither: RFC 5802's client, written out, does.
    gs2, bare = b"n,a=alice,", b"n=alice,r=client-nonce,ext=1"
    server = sasl.server_for("SCRAM-SHA-256", users, ALL)
    server_first = server.respond(gs2 + bare).response
    fields = dict(field.split(b"=", 1) for field in server_first.split(b","))
    salted = credentials.salted_password("alice-secret".encode(), base64.b64decode(fields[b"s"]),
                                         int(fields[b"i"]), "sha256")
    # The channel binding repeats the GS2 header: base64 of "n,a=alice,".
    without_proof = b"c=" + base64.b64encode(gs2) + b",r=" + fields[b"r"]
    proof = client_proof(salted, b",".join((bare, server_first, without_proof)), "sha256")
    final = server.respond(without_proof + b",p=" + base64.b64encode(proof))
    assert final.principal == "alice"


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_takes_librdkafka_2_0s_doubled_client_nonce_and_no_other_prefix(users, mechanism):
    """librdkafka 2.0.0-2.0.2 (Debian 12's kcat) send the client's nonce, then the
    combined nonce; Kafka's brokers took it (their check was endsWith)."""
    hash_name = credentials.SCRAM_HASHES[mechanism]
    for prefix, logs_in in ((b"abc", True), (b"abd", False), (b"", True)):
        server, nonce = started(users, mechanism)
        salt, iterations = users.scram("alice", mechanism).salt, \
            users.scram("alice", mechanism).iterations
        salted = credentials.salted_password(b"alice-secret", salt, iterations, hash_name)
        server_first = b"r=%s,s=%s,i=%d" % (nonce, base64.b64encode(salt), iterations)
        without_proof = b"c=biws,r=" + prefix + nonce
        proof = client_proof(salted, b",".join((b"n=alice,r=abc", server_first,
                                                without_proof)), hash_name)
        final = without_proof + b",p=" + base64.b64encode(proof)
        if logs_in:
            assert server.respond(final).principal == "alice"
        else:
            with pytest.raises(SaslMessageError, match="nonce"):
                server.respond(final)


def client_proof(salted: bytes, auth_message: bytes, hash_name: str) -> bytes:
    """RFC 5802's ClientProof: ClientKey xor HMAC(H(ClientKey), AuthMessage)."""
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    stored_key = hashlib.new(hash_name, client_key).digest()
    signature = hmac.digest(stored_key, auth_message, hash_name)
    return bytes(a ^ b for a, b in zip(client_key, signature))


def started(users, mechanism):
    """A server past client-first, and its answer's nonce."""
    server = sasl.server_for(mechanism, users, ALL)
    answer = server.respond(b"n,,n=alice,r=abc").response
    return server, answer.split(b",")[0][2:]


@pytest.mark.parametrize("mechanism", SCRAMS)
@pytest.mark.parametrize("final", [
    b"", b"c=biws", b"c=biws,r={nonce}", b"c=biws,r={nonce},p=", b"c=biws,r={nonce},p=%%%%",
    b"c=biws,r={nonce},p=AAAA", b"c=biws,r=abc,p=AAAA", b"c=biws,r={nonce}x,p=AAAA",
    b"c=eSws,r={nonce},p=" + base64.b64encode(bytes(64)), b"c=,r={nonce},p=AAAA",
    b"r={nonce},c=biws,p=AAAA", b"c=biws,r={nonce},p=AAAA,x=1", b"c=biws,r={nonce},p=AA\xff=",
    b"c=biws,r={nonce},p=" + b"A" * 9000])
def test_malformed_scram_final_messages_are_typed(users, mechanism, final):
    server, nonce = started(users, mechanism)
    with pytest.raises(SaslMessageError):
        server.respond(final.replace(b"{nonce}", nonce))


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_a_wrong_proof_of_the_right_length_fails_authentication(users, mechanism):
    server, nonce = started(users, mechanism)
    size = 32 if mechanism == "SCRAM-SHA-256" else 64
    with pytest.raises(SaslAuthenticationError) as caught:
        server.respond(b"c=biws,r=" + nonce + b",p=" + base64.b64encode(bytes(size)))
    assert type(caught.value) is SaslAuthenticationError


@pytest.mark.parametrize("mechanism", ALL)
def test_a_message_after_the_exchange_ended_is_out_of_turn(users, mechanism):
    client = (SaslMechanismPlain if mechanism == "PLAIN" else SaslMechanismScram)(
        sasl_plain_username="alice", sasl_plain_password="alice-secret",
        sasl_mechanism=mechanism)
    server = sasl.server_for(mechanism, users, ALL)
    step = server.respond(client.auth_bytes())
    while not step.done:
        client.receive(step.response)
        step = server.respond(client.auth_bytes())
    with pytest.raises(SaslMessageError, match="ended"):
        server.respond(b"n,,n=alice,r=abc")
    failed = sasl.server_for(mechanism, users, ALL)
    with pytest.raises(SaslAuthenticationError):
        failed.respond(b"\0alice\0wrong" if mechanism == "PLAIN" else b"garbage")
    with pytest.raises(SaslMessageError, match="ended"):
        failed.respond(client.auth_bytes() if mechanism == "PLAIN" else b"n,,n=alice,r=abc")


@pytest.mark.parametrize("mechanism", ALL)
def test_mutated_messages_give_typed_errors_only(users, mechanism):
    """Every byte of a real exchange's messages changed, dropped or doubled in turn:
    the server answers or raises a SaslAuthenticationError, never anything else."""
    randomness = random.Random(f"{mechanism} 28")
    client = (SaslMechanismPlain if mechanism == "PLAIN" else SaslMechanismScram)(
        sasl_plain_username="alice", sasl_plain_password="alice-secret",
        sasl_mechanism=mechanism)
    messages, server = [], sasl.server_for(mechanism, users, ALL)
    step = sasl.Step(b"")
    while not step.done:
        messages.append(client.auth_bytes())
        step = server.respond(messages[-1])
        if not step.done:
            client.receive(step.response)
    tried = 0
    for index, message in enumerate(messages):
        for position in range(0, len(message), 1 if mechanism == "PLAIN" else 2):
            for mutated in (message[:position] + bytes([randomness.randrange(256)])
                            + message[position + 1:],
                            message[:position] + message[position + 1:],
                            message[:position] + b"," + message[position:]):
                server = sasl.server_for(mechanism, users, ALL)
                try:
                    for earlier in messages[:index]:
                        server.respond(earlier)
                    server.respond(mutated)
                except SaslAuthenticationError:
                    pass
                tried += 1
    assert tried > 60


def test_only_enabled_mechanisms_are_served(users):
    for mechanism in ("GSSAPI", "OAUTHBEARER", "plain", "", None):
        with pytest.raises(UnsupportedSaslMechanismError, match="not enabled"):
            sasl.server_for(mechanism, users, ALL)
    with pytest.raises(UnsupportedSaslMechanismError):
        sasl.server_for("PLAIN", users)            # not enabled by default
    with pytest.raises(UnsupportedSaslMechanismError):
        sasl.server_for("GSSAPI", users, ("GSSAPI",))
    assert isinstance(sasl.server_for("SCRAM-SHA-512", users), sasl.ScramServer)


def test_enabled_mechanisms_are_read_as_kafka_lists():
    assert sasl.enabled_mechanisms(None) == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert sasl.enabled_mechanisms("PLAIN, SCRAM-SHA-512") == ("PLAIN", "SCRAM-SHA-512")
    assert sasl.enabled_mechanisms(["SCRAM-SHA-256"]) == ("SCRAM-SHA-256",)
    for value, words in (("GSSAPI", "none of"), ("scram-sha-256", "none of"),
                         ("PLAIN,PLAIN", "once"), ("", "once"), (3, "must be")):
        with pytest.raises(InvalidConfigError, match=words) as caught:
            sasl.enabled_mechanisms(value)
        assert str(caught.value).startswith("sasl.enabled.mechanisms")
