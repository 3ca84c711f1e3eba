"""TLS and SASL on the Kafka listener, against real clients: librdkafka
(confluent-kafka and kcat) and kafka-python produce and consume over SASL_SSL with
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, and over SSL without SASL; a wrong password
is refused with Kafka's SASL_AUTHENTICATION_FAILED and its message, and nothing is
produced; before login no request but ApiVersions and the SASL ones is served; a
client stalled mid-handshake holds up no one and is closed after
connection_setup_timeout_ms; each listener's clients are told their own listener;
a listener that requires client certificates lets in only a client with one; and
kafka-python logs in over SASL_PLAINTEXT.

Method: one broker process for the module with three loopback listeners
(SASL_SSL, SSL, PLAINTEXT, in that order: ``shmlog status``'s stats give their
ports in order), a second with SSL requiring client certificates and
SASL_PLAINTEXT; a certificate for localhost and 127.0.0.1 made with the ``openssl``
command (the test skips, saying so, where it is absent), and a credentials file of
one user made with ``shmlog.wire.credentials``. Raw-socket requests are written
with kafka-python's message classes inside Python's ``ssl``. Every wait is bounded.
"""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaError
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from helpers import tls_and_users, unlink_shared_memory
from shmlog import Admin
from shmlog.protocol.control_client import request as control_request
from shmlog.server.broker import Broker
from shmlog.wire.credentials import user_entry

WAIT_S = 30.0
USER, PASSWORD = "alice", "alice's secret"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SETUP_TIMEOUT_MS = 2_000
KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """{"data_dir", "ca" (the server's self-signed certificate), "key" (its key),
    "SASL_SSL", "SSL", "PLAINTEXT" (host:port each)} of a broker serving the three
    listeners."""
    directory = tmp_path_factory.mktemp("kafka-security")
    certificate, key, users = tls_and_users(directory, "localhost", "DNS:localhost,IP:127.0.0.1",
                                            USER, PASSWORD, WAIT_S)
    data_dir = str(directory / "data")
    with Broker(data_dir, listeners="SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0,"
                                    "PLAINTEXT://127.0.0.1:0",
                ssl_certificate_location=str(certificate), ssl_key_location=str(key),
                sasl_credentials_file=str(users), sasl_enabled_mechanisms=",".join(MECHANISMS),
                connection_setup_timeout_ms=SETUP_TIMEOUT_MS):
        addresses = control_request(data_dir, "stats")["broker"]["kafka_listeners"]
        yield {"data_dir": data_dir, "ca": str(certificate), "key": str(key),
               **dict(zip(("SASL_SSL", "SSL", "PLAINTEXT"), addresses, strict=True))}
    unlink_shared_memory(data_dir)


def librdkafka_options(secured, mechanism=None, password=PASSWORD) -> dict:
    if mechanism is None:
        return {"bootstrap.servers": secured["SSL"], "security.protocol": "SSL",
                "ssl.ca.location": secured["ca"]}
    return {"bootstrap.servers": secured["SASL_SSL"], "security.protocol": "SASL_SSL",
            "ssl.ca.location": secured["ca"], "sasl.mechanism": mechanism,
            "sasl.username": USER, "sasl.password": password}


def librdkafka_round_trip(options: dict, topic: str, count: int = 3) -> list[bytes]:
    """Produce ``count`` records with librdkafka, then read them back."""
    producer = Producer({**options, "message.timeout.ms": int(WAIT_S * 1000)})
    failures = []
    for number in range(count):
        producer.produce(topic, f"{topic}-{number}".encode(),
                         on_delivery=lambda error, _: error and failures.append(error))
    assert producer.flush(WAIT_S) == 0 and not failures, failures
    consumer = Consumer({**options, "group.id": "security-tests", "enable.auto.commit": False})
    found = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message.value())
    finally:
        consumer.close()
    return found


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_produces_and_consumes_over_sasl_ssl(secured, mechanism):
    topic = f"librdkafka-{mechanism.lower()}"
    assert librdkafka_round_trip(librdkafka_options(secured, mechanism), topic) == \
        [f"{topic}-{number}".encode() for number in range(3)]


def test_librdkafka_produces_and_consumes_over_ssl_without_sasl(secured):
    assert librdkafka_round_trip(librdkafka_options(secured), "librdkafka-ssl") == \
        [f"librdkafka-ssl-{number}".encode() for number in range(3)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_produces_and_consumes_over_sasl_ssl(secured, mechanism):
    topic = f"kafka-python-{mechanism.lower()}"
    options = {"bootstrap_servers": secured["SASL_SSL"], "security_protocol": "SASL_SSL",
               "ssl_cafile": secured["ca"], "sasl_mechanism": mechanism,
               "sasl_plain_username": USER, "sasl_plain_password": PASSWORD,
               "request_timeout_ms": int(WAIT_S * 1000)}
    producer = KafkaProducer(**options)
    try:
        for number in range(3):
            producer.send(topic, f"{topic}-{number}".encode()).get(timeout=WAIT_S)
    finally:
        producer.close(timeout=WAIT_S)
    consumer = KafkaConsumer(**options, consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        partition = KafkaTopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        found = []
        for message in consumer:
            found.append(message.value)
            if len(found) == 3:
                break
    finally:
        consumer.close()
    assert found == [f"{topic}-{number}".encode() for number in range(3)]


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs the "
                                         "kcat package as root)")
def test_kcat_produces_and_consumes_over_sasl_ssl(secured):
    options = [KCAT, "-b", secured["SASL_SSL"], "-X", "security.protocol=SASL_SSL",
               "-X", f"ssl.ca.location={secured['ca']}", "-X", "sasl.mechanisms=SCRAM-SHA-512",
               "-X", f"sasl.username={USER}", "-X", f"sasl.password={PASSWORD}"]
    produced = subprocess.run([*options, "-P", "-t", "kcat-secured"], input="one\ntwo\n",
                              capture_output=True, text=True, timeout=WAIT_S * 2)
    assert produced.returncode == 0, produced.stderr[-2000:]
    consumed = subprocess.run([*options, "-C", "-t", "kcat-secured", "-o", "beginning", "-e",
                               "-c", "2"], capture_output=True, text=True, timeout=WAIT_S * 2)
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    assert consumed.stdout.split() == ["one", "two"]


def test_a_wrong_password_is_refused_with_its_reason_and_nothing_is_produced(secured, caplog):
    errors = []
    producer = Producer({**librdkafka_options(secured, "SCRAM-SHA-256", "not the password"),
                         "message.timeout.ms": 3000,
                         "error_cb": lambda error: errors.append(str(error))})
    reports = []
    producer.produce("refused-topic", b"never", on_delivery=lambda error, _: reports.append(error))
    producer.flush(WAIT_S)
    assert reports and reports[0] is not None          # not delivered
    assert any("Authentication failed: invalid username or password" in error
               for error in errors), errors
    del producer                              # its threads stop trying
    # kafka-python logs each refusal and tries again until max_block_ms, as it does
    # against Kafka.
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaError):
        KafkaProducer(bootstrap_servers=secured["SASL_SSL"], security_protocol="SASL_SSL",
                      ssl_cafile=secured["ca"], sasl_mechanism="PLAIN",
                      sasl_plain_username=USER, sasl_plain_password="not the password",
                      request_timeout_ms=3000, max_block_ms=3000).close()
    assert any("SaslAuthenticationFailedError" in record.getMessage() and
               "invalid username or password" in record.getMessage()
               for record in caplog.records)
    assert "refused-topic" not in Admin(secured["data_dir"]).list_topics()


# -- raw requests over TLS ------------------------------------------------------------
def tls_connection(secured) -> ssl.SSLSocket:
    host, port = secured["SASL_SSL"].rsplit(":", 1)
    context = ssl.create_default_context(cafile=secured["ca"])
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return context.wrap_socket(sock, server_hostname="localhost")


def exchange(sock, request, correlation_id: int = 1, response_class=None):
    """Send a kafka-python request; its decoded response (None: the broker closed)."""
    version = request.API_VERSION
    header = struct.pack(">hhih", request.API_KEY, version, correlation_id, 4) + b"test"
    if request.flexible_version_q(version):
        header += b"\x00"
    payload = header + bytes(request.encode(version=version))
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    frame = receive(sock)
    if frame is None:
        return None
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    offset = 5 if response_class.flexible_version_q(version) else 4
    return response_class.decode(frame[offset:], version=version)


def receive(sock) -> bytes | None:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data[4:]


def test_a_failed_login_is_answered_then_closed(secured):
    with tls_connection(secured) as sock:
        shake = exchange(sock, SaslHandshakeRequest(version=1, mechanism="PLAIN"),
                         response_class=SaslHandshakeResponse)
        assert shake.error_code == 0 and set(shake.mechanisms) == set(MECHANISMS)
        answer = exchange(sock, SaslAuthenticateRequest(
            version=2, auth_bytes=f"\0{USER}\0wrong".encode()), 2, SaslAuthenticateResponse)
        assert answer.error_code == 58                    # SASL_AUTHENTICATION_FAILED
        assert "invalid username or password" in answer.error_message
        assert sock.recv(1) == b""                         # then closed


def test_a_login_with_bare_v0_tokens_is_served_and_session_lifetime_is_zero(secured):
    with tls_connection(secured) as sock:
        shake = exchange(sock, SaslHandshakeRequest(version=0, mechanism="PLAIN"),
                         response_class=SaslHandshakeResponse)
        assert shake.error_code == 0
        token = f"\0{USER}\0{PASSWORD}".encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert receive(sock) == b""                       # an empty token: logged in
        metadata = exchange(sock, MetadataRequest(version=1, topics=None), 3,
                            MetadataResponse)
        assert [broker.port for broker in metadata.brokers] == \
            [int(secured["SASL_SSL"].rsplit(":", 1)[1])]
    with tls_connection(secured) as sock:
        exchange(sock, SaslHandshakeRequest(version=1, mechanism="PLAIN"),
                 response_class=SaslHandshakeResponse)
        answer = exchange(sock, SaslAuthenticateRequest(
            version=1, auth_bytes=f"\0{USER}\0{PASSWORD}".encode()), 2,
            SaslAuthenticateResponse)
        assert answer.error_code == 0 and answer.session_lifetime_ms == 0


def test_no_request_but_the_login_is_served_before_login(secured):
    with tls_connection(secured) as sock:
        sock.sendall(struct.pack(">i", 14) + struct.pack(">hhih", 3, 1, 1, 4) + b"test" +
                     struct.pack(">i", -1))               # Metadata v1, every topic
        assert sock.recv(1) == b""                        # closed unanswered
    with tls_connection(secured) as sock:
        shake = exchange(sock, SaslHandshakeRequest(version=1, mechanism="GSSAPI"),
                         response_class=SaslHandshakeResponse)
        assert shake.error_code == 33                     # UNSUPPORTED_SASL_MECHANISM
        assert set(shake.mechanisms) == set(MECHANISMS)
        assert sock.recv(1) == b""


def test_a_stalled_handshake_holds_up_no_one_and_is_closed(secured):
    host, port = secured["SASL_SSL"].rsplit(":", 1)
    stalled = [socket.create_connection((host, int(port)), timeout=WAIT_S) for _ in range(3)]
    try:
        stalled[0].sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes
        stalled[1].sendall(b"\x16")
        assert librdkafka_round_trip(librdkafka_options(secured, "SCRAM-SHA-256"),
                                     "beside-stalled", 1) == [b"beside-stalled-0"]
        for sock in stalled:                  # closed after connection_setup_timeout_ms
            sock.settimeout(WAIT_S)
            assert sock.recv(1) == b""
    finally:
        for sock in stalled:
            sock.close()


def test_each_listener_tells_its_clients_its_own_address(secured):
    for protocol in ("SASL_SSL", "SSL"):
        options = librdkafka_options(secured, "PLAIN" if protocol == "SASL_SSL" else None)
        listing = AdminClient(options).list_topics(timeout=WAIT_S)
        assert [f"{broker.host}:{broker.port}" for broker in listing.brokers.values()] == \
            [secured[protocol]]
    listing = AdminClient({"bootstrap.servers": secured["PLAINTEXT"]}).list_topics(
        timeout=WAIT_S)
    assert [f"{broker.host}:{broker.port}" for broker in listing.brokers.values()] == \
        [secured["PLAINTEXT"]]


# -- client certificates (ssl_client_auth) and SASL without TLS -------------------------
@pytest.fixture(scope="module")
def client_auth(secured, tmp_path_factory):
    """{"data_dir", "ca", "client" (certificate, key), "SSL", "SASL_PLAINTEXT"} of a
    broker that requires client certificates (signed by the client's own
    self-signed one) on its SSL listener."""
    directory = tmp_path_factory.mktemp("client-auth")
    client_certificate, client_key = directory / "client.pem", directory / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(client_key),
                    "-out", str(client_certificate), "-days", "2", "-subj", "/CN=client-1"],
                   check=True, capture_output=True, timeout=WAIT_S)
    users = directory / "users.toml"
    users.write_text(user_entry(USER, PASSWORD, iterations=4096))
    users.chmod(0o600)
    data_dir = str(directory / "data")
    with Broker(data_dir, listeners="SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                ssl_certificate_location=secured["ca"], ssl_key_location=secured["key"],
                ssl_client_auth="required",
                ssl_ca_location=str(client_certificate), sasl_credentials_file=str(users)):
        addresses = control_request(data_dir, "stats")["broker"]["kafka_listeners"]
        yield {"data_dir": data_dir, "ca": secured["ca"],
               "client": (str(client_certificate), str(client_key)),
               **dict(zip(("SSL", "SASL_PLAINTEXT"), addresses, strict=True))}
    unlink_shared_memory(data_dir)


def test_a_required_client_certificate_lets_its_client_in_and_no_other(client_auth):
    options = {"bootstrap.servers": client_auth["SSL"], "security.protocol": "SSL",
               "ssl.ca.location": client_auth["ca"]}
    with_certificate = {**options, "ssl.certificate.location": client_auth["client"][0],
                        "ssl.key.location": client_auth["client"][1]}
    assert librdkafka_round_trip(with_certificate, "client-certified", 2) == \
        [b"client-certified-0", b"client-certified-1"]
    errors = []
    producer = Producer({**options, "message.timeout.ms": 3000,
                         "error_cb": lambda error: errors.append(str(error))})
    reports = []
    producer.produce("uncertified", b"never", on_delivery=lambda error, _: reports.append(error))
    producer.flush(WAIT_S)
    del producer
    assert reports and reports[0] is not None
    assert errors                              # librdkafka saw the connection refused
    assert "uncertified" not in Admin(client_auth["data_dir"]).list_topics()


def test_kafka_python_logs_in_over_sasl_plaintext(client_auth):
    options = {"bootstrap_servers": client_auth["SASL_PLAINTEXT"],
               "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
               "sasl_plain_username": USER, "sasl_plain_password": PASSWORD,
               "request_timeout_ms": int(WAIT_S * 1000)}
    producer = KafkaProducer(**options)
    try:
        producer.send("sasl-plaintext", b"logged in").get(timeout=WAIT_S)
    finally:
        producer.close(timeout=WAIT_S)
    consumer = KafkaConsumer(**options, consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        partition = KafkaTopicPartition("sasl-plaintext", 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        assert next(iter(consumer)).value == b"logged in"
    finally:
        consumer.close()


def test_a_group_member_on_the_second_listener_is_sent_to_its_coordinator_there(secured):
    # FindCoordinator answers with the listener's own address: the SSL member would
    # fail to reach a coordinator named at the SASL_SSL listener.
    options = librdkafka_options(secured)
    producer = Producer({**options, "message.timeout.ms": int(WAIT_S * 1000)})
    producer.produce("grouped-over-ssl", b"for the group")
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({**options, "group.id": "ssl-group", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    found = []
    try:
        consumer.subscribe(["grouped-over-ssl"])
        deadline = time.monotonic() + WAIT_S
        while not found and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message.value())
        assert found == [b"for the group"]
        consumer.commit(asynchronous=False)          # through the coordinator
    finally:
        consumer.close()
