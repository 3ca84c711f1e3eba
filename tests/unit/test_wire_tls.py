"""TLS for Kafka listeners: a server context from PEM settings, and handshakes with it.

Goal: the context built from ``ssl.*`` settings (librdkafka's PEM names, Kafka's
``ssl.client.auth`` and ``ssl.enabled.protocols``) completes a TLS handshake with
Python's own client, which verifies the server's certificate and name; it never
speaks below TLS 1.2; client certificates are asked for and checked as
``ssl.client.auth`` says; and every bad setting or file (a key others may read, an
encrypted key without its password, a key of another certificate, a file that is
not PEM, a JKS name) is an ``InvalidConfigError`` naming the setting, never a
prompt on the terminal.

Method: certificates made with the ``openssl`` command in a temporary directory
(self-signed: the server's for localhost and 127.0.0.1, a client's); each
handshake over a ``socket.socketpair``, the server's side in a thread, every
socket with a timeout.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from shmlog.common.errors import InvalidConfigError
from shmlog.wire.tls import TlsSettings, server_context

WAIT_S = 30          # a handshake on a loaded 2-core host takes milliseconds


def make_certificate(directory, name, subject, *extensions):
    key, certificate = directory / f"{name}.key", directory / f"{name}.pem"
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
               "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
               str(certificate), "-days", "2", "-subj", subject]
    for extension in extensions:
        command += ["-addext", extension]
    subprocess.run(command, check=True, capture_output=True, timeout=WAIT_S)
    os.chmod(key, 0o600)
    return str(certificate), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    directory = tmp_path_factory.mktemp("pki")
    server = make_certificate(directory, "server", "/CN=localhost",
                              "subjectAltName=DNS:localhost,IP:127.0.0.1")
    client = make_certificate(directory, "client", "/CN=client-1")
    other = make_certificate(directory, "other", "/CN=other")
    encrypted = directory / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", server[1], "-aes256", "-passout", "pass:hunter2",
                    "-out", str(encrypted)], check=True, capture_output=True, timeout=WAIT_S)
    os.chmod(encrypted, 0o600)
    return {"dir": directory, "server": server, "client": client, "other": other,
            "encrypted": str(encrypted)}


def settings(pki, **changes):
    fields = {"certificate_location": pki["server"][0], "key_location": pki["server"][1]}
    fields.update(changes)
    return TlsSettings(**fields)


def client_context(pki, certificate=None, maximum=None):
    context = ssl.create_default_context(cafile=pki["server"][0])
    if certificate is not None:
        context.load_cert_chain(*certificate)
    if maximum is not None:
        context.maximum_version = maximum
    return context


def handshake(server: ssl.SSLContext, client: ssl.SSLContext):
    """Echo one message upper-cased over TLS: (the client's answer or its error, the
    server's view: its error, or the TLS version and the client's certificate)."""
    left, right = socket.socketpair()
    left.settimeout(WAIT_S)
    right.settimeout(WAIT_S)
    seen: dict = {}

    def serve():
        try:
            with server.wrap_socket(left, server_side=True) as tls:
                seen["version"], seen["peer"] = tls.version(), tls.getpeercert()
                tls.sendall(tls.recv(100).upper())
        except (ssl.SSLError, OSError) as error:
            seen["error"] = error
        finally:
            left.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client.wrap_socket(right, server_hostname="localhost") as tls:
            tls.sendall(b"ping")
            answer = tls.recv(100)
    except (ssl.SSLError, OSError) as error:
        answer = error
    finally:
        right.close()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return answer, seen


def test_pythons_client_verifies_the_server_and_talks_tls_1_2_or_later(pki):
    context = server_context(settings(pki))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION
    answer, seen = handshake(context, client_context(pki))
    assert answer == b"PING"
    assert seen["version"] == "TLSv1.3" and not seen["peer"]
    answer, seen = handshake(context, client_context(pki, maximum=ssl.TLSVersion.TLSv1_2))
    assert (answer, seen["version"]) == (b"PING", "TLSv1.2")


def test_a_client_older_than_tls_1_2_gets_no_connection(pki):
    context = server_context(settings(pki))
    old = client_context(pki)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    answer, seen = handshake(context, old)
    assert isinstance(answer, (ssl.SSLError, OSError)) and "error" in seen


def test_enabled_protocols_narrow_what_is_spoken(pki):
    only_13 = server_context(settings(pki, enabled_protocols=("TLSv1.3",)))
    answer, seen = handshake(only_13, client_context(pki, maximum=ssl.TLSVersion.TLSv1_2))
    assert isinstance(answer, ssl.SSLError) and "error" in seen
    only_12 = server_context(TlsSettings.from_mapping({
        "ssl.certificate.location": pki["server"][0], "ssl.key.location": pki["server"][1],
        "ssl.enabled.protocols": "TLSv1.2", "other.setting": 1}))
    assert handshake(only_12, client_context(pki))[1]["version"] == "TLSv1.2"


def test_required_client_authentication_takes_only_a_trusted_certificate(pki):
    context = server_context(settings(pki, ca_location=pki["client"][0],
                                      client_auth="required"))
    answer, seen = handshake(context, client_context(pki, pki["client"]))
    assert answer == b"PING"
    assert dict(item[0] for item in seen["peer"]["subject"])["commonName"] == "client-1"
    answer, seen = handshake(context, client_context(pki))
    assert answer != b"PING" and isinstance(seen["error"], ssl.SSLError)
    answer, seen = handshake(context, client_context(pki, pki["other"]))
    assert answer != b"PING" and isinstance(seen["error"], ssl.SSLError)


def test_requested_client_authentication_takes_a_client_without_one(pki):
    context = server_context(settings(pki, ca_location=pki["client"][0],
                                      client_auth="requested"))
    answer, seen = handshake(context, client_context(pki))
    assert answer == b"PING" and not seen["peer"]
    answer, seen = handshake(context, client_context(pki, pki["client"]))
    assert answer == b"PING" and seen["peer"]["subject"]


def test_an_encrypted_key_takes_its_password_and_never_prompts(pki):
    context = server_context(settings(pki, key_location=pki["encrypted"],
                                      key_password="hunter2"))
    assert handshake(context, client_context(pki))[0] == b"PING"
    with pytest.raises(InvalidConfigError, match="encrypted: give its password in ssl.key"):
        server_context(settings(pki, key_location=pki["encrypted"]))
    with pytest.raises(InvalidConfigError, match="^ssl.key.password: .*does not decrypt"):
        server_context(settings(pki, key_location=pki["encrypted"], key_password="hunter3"))


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604])
def test_a_key_others_may_read_is_refused(pki, tmp_path, mode):
    key = tmp_path / "server.key"
    shutil.copyfile(pki["server"][1], key)
    os.chmod(key, mode)
    with pytest.raises(InvalidConfigError, match=r"^ssl.key.location: .*chmod 600"):
        server_context(settings(pki, key_location=str(key)))


def test_links_are_followed_to_the_private_key_they_name_as_certbots_are(pki, tmp_path):
    os.symlink(pki["server"][1], tmp_path / "privkey.pem")
    os.symlink(pki["server"][0], tmp_path / "fullchain.pem")
    context = server_context(settings(pki, key_location=str(tmp_path / "privkey.pem"),
                                      certificate_location=str(tmp_path / "fullchain.pem")))
    assert handshake(context, client_context(pki))[0] == b"PING"


def test_files_openssl_cannot_take_are_refused_naming_the_setting(pki, tmp_path):
    cases = [
        (dict(key_location=pki["other"][1]), "^ssl.key.location: .*not the key of"),
        (dict(certificate_location=pki["server"][1]), "^ssl.certificate.location, ssl.key"),
        (dict(certificate_location=str(tmp_path / "missing.pem")),
         "^ssl.certificate.location: cannot open"),
        (dict(key_location=str(tmp_path)), "^ssl.key.location: .*not a regular file"),
        (dict(ca_location=pki["server"][1], client_auth="required"),
         "^ssl.ca.location: .*no PEM CA"),
        (dict(cipher_suites="NO-SUCH-CIPHER"), "^ssl.cipher.suites"),
    ]
    for changes, words in cases:
        with pytest.raises(InvalidConfigError, match=words):
            server_context(settings(pki, **changes))


@pytest.mark.parametrize("table, words", [
    ({"ssl.keystore.location": "/k.jks"}, "ssl.certificate.location and ssl.key.location"),
    ({"ssl.truststore.location": "/t.jks"}, "use ssl.ca.location"),
    ({"ssl.certificate": "x"}, "not a setting shmlog reads"),
    ({}, "ssl.certificate.location is required"),
    ({"ssl.client.auth": "maybe"}, "none, requested, required"),
    ({"ssl.client.auth": "required"}, "needs ssl.ca.location"),
    ({"ssl.enabled.protocols": "TLSv1.1,TLSv1.2"}, "RFC 8996"),
    ({"ssl.enabled.protocols": ""}, "must name some of"),
    ({"ssl.enabled.protocols": 12}, "must name some of"),
    ({"ssl.key.password": 1234}, "ssl.key.password must be a non-empty string, got another"),
    ({"ssl.ca.location": ""}, "ssl.ca.location must be a non-empty string")])
def test_settings_are_checked_by_name(pki, table, words):
    base = {"ssl.certificate.location": pki["server"][0], "ssl.key.location": pki["server"][1]}
    if table:
        base.update(table)
    else:
        base = {}
    with pytest.raises(InvalidConfigError, match=words):
        TlsSettings.from_mapping(base)


def test_the_keys_password_stays_out_of_repr(pki):
    assert "hunter2" not in repr(settings(pki, key_password="hunter2"))
