"""The control protocol, sans I/O: well-formed requests reach their handler; every
malformed frame, unknown version or type, or bad field gets a typed error reply.

Method: ``handle_frame`` with plain handler functions; replies decoded with the
client's own ``decode_reply``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from shmlog.common.errors import (
    InvalidTopicError,
    LocalProtocolError,
    PeerProtocolError,
    ShmlogError,
    UnsupportedRequestError,
)
from shmlog.protocol.control import (
    REQUEST_SIZE_MAX,
    decode_entry,
    decode_reply,
    encode_request,
    error_entry,
    handle_frame,
    require,
)


def echo(name: str, count: int = 1) -> dict:
    return {"name": require(name, str, "name"), "count": require(count, int, "count")}


def refuse(name: str) -> dict:
    raise InvalidTopicError(f"no good: {name}")


HANDLERS = {"echo": echo, "refuse": refuse}


def test_a_request_reaches_its_handler():
    reply = decode_reply(handle_frame(encode_request("echo", name="t", count=3), HANDLERS))
    assert reply == {"name": "t", "count": 3}


def test_a_handler_error_travels_with_its_type():
    with pytest.raises(InvalidTopicError, match="no good: x"):
        decode_reply(handle_frame(encode_request("refuse", name="x"), HANDLERS))


@pytest.mark.parametrize("frame, message", [
    (b"\xff\xfe not utf-8", "UTF-8 JSON"),
    (b"{not json", "UTF-8 JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"version": 2, "type": "echo"}).encode(), "unsupported protocol version"),
    (json.dumps({"version": 1}).encode(), "no 'type'"),
    (encode_request("nope"), "unknown request type"),
    (encode_request("echo"), "bad fields"),
    (encode_request("echo", name="t", extra=1), "bad fields"),
    (encode_request("echo", name=7), "must be str"),
    (encode_request("echo", name="t", count=True), "must be int"),
    (b" " * (REQUEST_SIZE_MAX + 1), "over the control frame limit"),
])
def test_malformed_requests_get_error_replies(frame, message):
    with pytest.raises(LocalProtocolError, match=message):
        decode_reply(handle_frame(frame, HANDLERS))


def test_an_unknown_request_type_is_its_own_error():
    with pytest.raises(UnsupportedRequestError, match="'nope'; known: echo"):
        decode_reply(handle_frame(encode_request("nope"), HANDLERS))


def test_the_entries_of_a_reply_for_several_carry_results_or_typed_errors():
    assert decode_entry({"ok": True, "name": "a"}) == {"name": "a"}
    with pytest.raises(InvalidTopicError, match="no good"):
        decode_entry(json.loads(json.dumps(error_entry(InvalidTopicError("no good")))))
    with pytest.raises(PeerProtocolError):
        decode_entry(["not", "an", "entry"])


def test_create_topics_requests_are_cut_to_fit_their_frames_and_timeouts():
    from shmlog.client.admin import _chunks
    topics = [{"name": f"t-{index:04d}", "partitions": 10, "config": {}}
              for index in range(1000)]
    size = len(json.dumps(topics[0])) + 2
    chunks = list(_chunks(topics, 100 * size, 10 ** 6))
    assert [len(chunk) for chunk in chunks] == [100] * 10
    assert [topic for chunk in chunks for topic in chunk] == topics
    assert [len(chunk) for chunk in _chunks(topics, 10 ** 9, 4096)] == [409, 409, 182]
    assert len(list(_chunks(topics, 10 ** 9, 10 ** 6))) == 1
    assert [len(chunk) for chunk in _chunks(topics[:3], 1, 1)] == [1, 1, 1]
    odd = [{"name": "x", "partitions": "many", "config": {}}] * 2   # the broker refuses it
    assert [len(chunk) for chunk in _chunks(odd, 10 ** 9, 1)] == [1, 1]


@pytest.mark.parametrize("frame", [b"garbage", b'{"version": 9, "ok": true}', b"[]"])
def test_a_malformed_reply_is_a_peer_protocol_error(frame):
    with pytest.raises(PeerProtocolError):
        decode_reply(frame)


def test_an_unknown_error_class_arrives_as_the_root_error():
    frame = json.dumps({"version": 1, "ok": False, "error": "KeyError", "message": "x"}).encode()
    with pytest.raises(ShmlogError, match="x"):
        decode_reply(frame)


@pytest.mark.parametrize("frame", [
    b"[" * 100_000 + b"]" * 100_000,                        # past the interpreter's limit
    b'{"version": 1, "type": "echo", "name": ' + b"[" * 500 + b"]" * 500 + b"}",
    b'{"version": 1, "type": "echo", "name": ' + b'{"a": ' * 40 + b"1" + b"}" * 41,
])
def test_deeply_nested_json_is_a_local_protocol_error(frame):
    assert len(frame) <= REQUEST_SIZE_MAX
    with pytest.raises(LocalProtocolError, match="nests deeper than"):
        decode_reply(handle_frame(frame, HANDLERS))


def test_nesting_within_the_limit_reaches_the_handler():
    # A commit's offsets nest this deep: the handler, not the parser, judges the field.
    with pytest.raises(LocalProtocolError, match="must be str"):
        decode_reply(handle_frame(encode_request("echo", name=[[["t", 0, 5, "m"]]]), HANDLERS))


NO_DESCRIPTOR_CHILD = textwrap.dedent("""
    import os, resource, sys
    from shmlog.common.errors import ResourceLimitError
    from shmlog.common.paths import control_path
    from shmlog.protocol.control_client import request
    path = control_path(sys.argv[1])
    os.makedirs(os.path.dirname(path))
    open(path, "w").close()                 # a socket file to try: a broker may start
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        request(sys.argv[1], "ping", timeout_ms=100)
    except ResourceLimitError as error:
        print(error.limit, error, sep="\\n")
""")


def test_no_descriptor_for_the_requests_socket_is_a_typed_error_naming_the_limit(tmp_path):
    child = subprocess.run([sys.executable, "-c", NO_DESCRIPTOR_CHILD, str(tmp_path / "data")],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    limit, message = child.stdout.splitlines()
    assert limit == "RLIMIT_NOFILE" and "ulimit -n" in message
