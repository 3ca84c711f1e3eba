"""Kafka listeners: ``listeners``, ``advertised.listeners`` and
``listener.security.protocol.map`` read as Kafka reads them, and the issue's rule.

Goal: every form Kafka takes is taken (names in any case, an empty host for every
interface, IPv6 in brackets, custom names through the map, advertised listeners by
default the listeners); every form Kafka refuses is refused with an
``InvalidConfigError`` naming the setting; a listener other hosts reach is
SASL_SSL unless the operator's own settings name its protocol, and one that gets
a weaker protocol from a default is an ``InsecureListenerError``.

Method: ``listeners.resolve`` and friends on strings, lists and tables.
"""

from __future__ import annotations

import pytest

from shmlog.common.errors import InsecureListenerError, InvalidConfigError
from shmlog.wire import listeners
from shmlog.wire.listeners import Listener, resolve


def test_kafkas_forms_are_read_with_their_protocols():
    found = resolve("sasl_ssl://:9093, PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9094,"
                    "SASL_PLAINTEXT://broker-1.example.com:9095")
    assert [(item.name, item.host, item.port, item.security_protocol)
            for item in found.bound] == [
        ("SASL_SSL", "", 9093, "SASL_SSL"), ("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"),
        ("SSL", "::1", 9094, "SSL"), ("SASL_PLAINTEXT", "broker-1.example.com", 9095,
                                      "SASL_PLAINTEXT")]
    assert found.advertised == found.bound
    assert [(item.tls, item.sasl) for item in found.bound] == \
        [(True, True), (False, False), (True, False), (False, True)]
    assert str(found.bound[2]) == "SSL://[::1]:9094"


def test_custom_names_take_their_protocol_from_the_map():
    found = resolve(["INTERNAL://127.0.0.1:9092", "EXTERNAL://0.0.0.0:9093"],
                    "INTERNAL://localhost:9092,EXTERNAL://kafka.example.com:19093",
                    "internal:plaintext, EXTERNAL:SASL_SSL")
    assert [(item.name, item.security_protocol) for item in found.bound] == \
        [("INTERNAL", "PLAINTEXT"), ("EXTERNAL", "SASL_SSL")]
    assert found.advertised_for("external").host == "kafka.example.com"
    assert found.advertised_for("EXTERNAL").port == 19093
    assert found.advertised_for("INTERNAL").security_protocol == "PLAINTEXT"
    table = resolve("EXTERNAL://:9093", protocol_map={"EXTERNAL": "SASL_SSL"})
    assert table.bound[0].security_protocol == "SASL_SSL"


def test_the_default_is_plaintext_on_loopback():
    found = resolve()
    assert [str(item) for item in found.bound] == [listeners.LISTENERS_DEFAULT]
    assert found.bound[0].loopback and not found.bound[0].written


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("LocalHost", True), ("", False), ("0.0.0.0", False), ("::", False),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False),
    ("broker-1", False), ("localhost.example.com", False)])
def test_loopback_is_an_address_or_localhost_never_a_guess(host, loopback):
    assert listeners.is_loopback(host) is loopback


@pytest.mark.parametrize("value", [
    "PLAINTEXT://0.0.0.0:9092", "PLAINTEXT://:9092", "SSL://10.0.0.1:9093",
    "SASL_PLAINTEXT://[::]:9094", "plaintext://broker-1:9092"])
def test_a_protocol_written_in_listeners_is_served_anywhere(value):
    advertised = value.split("://")[0] + "://broker-1:9092"
    listener = resolve(value, advertised).bound[0]
    assert listener.written and not listener.loopback


def test_a_protocol_written_in_the_map_is_served_anywhere():
    listener = resolve("EXTERNAL://0.0.0.0:9092", "EXTERNAL://broker-1:9092",
                       "EXTERNAL:PLAINTEXT").bound[0]
    assert (listener.security_protocol, listener.written) == ("PLAINTEXT", True)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL", "SASL_PLAINTEXT"])
def test_a_default_protocol_off_loopback_is_refused(protocol):
    for host in ("", "0.0.0.0", "10.1.2.3", "broker-1"):
        with pytest.raises(InsecureListenerError, match="TLS and SASL") as caught:
            listeners.check_exposure(Listener(protocol, host, 9092, protocol, written=False))
        assert isinstance(caught.value, InvalidConfigError)
        assert "listeners" in str(caught.value)
    listeners.check_exposure(Listener(protocol, "127.0.0.1", 9092, protocol, written=False))
    listeners.check_exposure(Listener(protocol, "", 9092, protocol, written=True))
    listeners.check_exposure(Listener("X", "", 9092, "SASL_SSL", written=False))


@pytest.mark.parametrize("value, words", [
    ("", "names no listener"), (" , ", "names no listener"), (42, "must be a string"),
    ("PLAINTEXT:/0.0.0.0:9092", "NAME://HOST:PORT"), ("PLAINTEXT://0.0.0.0", "NAME://HOST:PORT"),
    ("PLAINTEXT://0.0.0.0:", "NAME://HOST:PORT"), ("PLAINTEXT://::1:9092", "NAME://HOST:PORT"),
    ("PLAINTEXT://0.0.0.0:65536", "not a TCP port"), ("PLAINTEXT://0.0.0.0:-1", "NAME://"),
    ("://0.0.0.0:9092", "listener name"), ("PLAIN TEXT://0.0.0.0:9092", "listener name"),
    ("PLAINTEXT://[10.0.0.1]:9092", "not an IPv6"), ("PLAINTEXT://[zz]:9092", "not an IPv6"),
    ("PLAINTEXT://a b:9092", "not a host"), ("PLAINTEXT://h/x:9092", "not a host"),
    ("UNMAPPED://127.0.0.1:9092", "no security protocol"),
    ("PLAINTEXT://127.0.0.1:9092,plaintext://127.0.0.1:9093", "different name"),
    ("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.2:9092", "different port")])
def test_invalid_listeners_are_refused_naming_the_setting(value, words):
    with pytest.raises(InvalidConfigError, match=words) as caught:
        resolve(value)
    assert str(caught.value).startswith("listeners")


def test_port_zero_may_repeat_for_ports_the_kernel_picks():
    found = resolve("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0")
    assert [item.port for item in found.bound] == [0, 0]


@pytest.mark.parametrize("value, words", [
    ("INTERNAL:PLAINTEXT,internal:SSL", "twice"), ("INTERNAL", "NAME:PROTOCOL"),
    ("INTERNAL:TLS", "none of"), ("IN TERNAL:SSL", "listener name"), (["x"], "must be a string"),
    ({"INTERNAL": 3}, "none of")])
def test_invalid_protocol_maps_are_refused(value, words):
    with pytest.raises(InvalidConfigError, match=words) as caught:
        resolve("INTERNAL://127.0.0.1:9092", protocol_map=value)
    assert str(caught.value).startswith("listener.security.protocol.map")


def test_a_written_map_replaces_the_default_as_in_kafka():
    with pytest.raises(InvalidConfigError, match="no security protocol"):
        resolve("PLAINTEXT://127.0.0.1:9092", protocol_map="INTERNAL:PLAINTEXT")


@pytest.mark.parametrize("advertised, words", [
    ("SSL://broker-1:9093", "listeners does not define"),
    ("PLAINTEXT://0.0.0.0:9092", "unroutable"), ("PLAINTEXT://[::]:9092", "unroutable"),
    ("PLAINTEXT://a:9092,PLAINTEXT://b:9093", "different name"),
    ("PLAINTEXT://a", "NAME://HOST:PORT")])
def test_invalid_advertised_listeners_are_refused(advertised, words):
    with pytest.raises(InvalidConfigError, match=words) as caught:
        resolve("PLAINTEXT://127.0.0.1:9092", advertised)
    assert str(caught.value).startswith("advertised.listeners")


def test_advertised_listeners_copied_from_all_interfaces_are_refused_as_in_kafka():
    with pytest.raises(InvalidConfigError, match=r"by default the listeners.*unroutable"):
        resolve("PLAINTEXT://0.0.0.0:9092")
    found = resolve("PLAINTEXT://0.0.0.0:9092", "PLAINTEXT://broker-1.example.com:9092")
    assert found.advertised[0].host == "broker-1.example.com"
    empty = resolve("PLAINTEXT://:9092")
    assert empty.advertised[0].host == ""      # the server advertises its host's name


def test_advertised_listeners_may_share_a_port_behind_different_names():
    found = resolve("A://127.0.0.1:9092,B://127.0.0.1:9093", "A://h1:9092,B://h2:9092",
                    "A:PLAINTEXT,B:PLAINTEXT")
    assert [item.port for item in found.advertised] == [9092, 9092]
