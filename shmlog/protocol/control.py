"""The broker's control protocol: versioned JSON requests and replies.

One request frame in, one reply frame out (ZeroMQ REQ/REP over ``ipc://`` under the
data directory). A frame is a UTF-8 JSON object of at most ``REQUEST_SIZE_MAX``
bytes, nested at most ``limits.CONTROL_NESTING_DEPTH_MAX`` deep::

    request: {"version": 1, "type": "<request type>", ...fields}
    reply:   {"version": 1, "ok": true, ...result}
           | {"version": 1, "ok": false, "error": "<error class>", "message": "..."}

Rules: a malformed frame, an unknown version or type, or fields of the wrong shape
get an error reply, and the broker goes on serving. A frame over ``REQUEST_SIZE_MAX``
is :class:`ControlRequestTooLargeError` (:func:`request_too_large`): the client's
before it sends, the broker's for one sent anyway. Errors travel by class name,
limited to the classes in ``shmlog.common.errors``, so a client raises the same typed
error the broker did. This module is sans-I/O: bytes in, bytes out.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from ..common import errors, limits
from ..common.errors import (
    ControlRequestTooLargeError,
    LocalProtocolError,
    PeerProtocolError,
    ShmlogError,
    UnsupportedRequestError,
)

__all__ = ["PROTOCOL_VERSION", "encode_request", "decode_reply", "handle_frame",
           "encode_result", "error_entry", "decode_entry", "REQUEST_SIZE_MAX",
           "request_too_large"]

PROTOCOL_VERSION = 1
REQUEST_SIZE_MAX = limits.CONTROL_FRAME_SIZE_MAX

_ERROR_CLASSES = {name: value for name, value in vars(errors).items()
                  if isinstance(value, type) and issubclass(value, ShmlogError)}


def encode_request(request_type: str, **fields: Any) -> bytes:
    return json.dumps({"version": PROTOCOL_VERSION, "type": request_type, **fields}).encode()


def request_too_large(size: int, what: str = "a control request") -> ControlRequestTooLargeError:
    """The refusal of a request frame of ``size`` bytes, over ``REQUEST_SIZE_MAX``:
    the client's before it sends, the broker's for a frame sent anyway."""
    return ControlRequestTooLargeError(
        f"{what} of {size} bytes is over the control frame limit of {REQUEST_SIZE_MAX} "
        f"bytes (limits.CONTROL_FRAME_SIZE_MAX); nothing was done: ask for less per "
        f"request (fewer topics or configs at once)")


def _encode_reply(body: dict) -> bytes:
    return json.dumps({"version": PROTOCOL_VERSION, **body}).encode()


def error_entry(error: Exception) -> dict:
    """An error as a reply carries it (``ok`` false, its class and message): also one
    entry of a reply that answers for several things at once (create_topics)."""
    name = type(error).__name__ if type(error).__name__ in _ERROR_CLASSES else "ShmlogError"
    return {"ok": False, "error": name, "message": str(error)}


def error_reply(error: Exception) -> bytes:
    return _encode_reply(error_entry(error))


def decode_reply(frame: bytes) -> dict:
    """The result fields of a reply; raises the broker's error when it sent one.

    Raises
    ------
    PeerProtocolError
        The reply itself is malformed.
    ShmlogError (a subclass)
        The broker refused the request.
    """
    try:
        body = json.loads(frame)
    except (UnicodeDecodeError, ValueError) as error:
        raise PeerProtocolError(f"the broker sent a malformed reply ({error})") from None
    if not isinstance(body, dict) or body.get("version") != PROTOCOL_VERSION:
        raise PeerProtocolError(
            f"the broker replied with an unknown protocol version: {body!r:.200}")
    return decode_entry(body)


def decode_entry(body: dict) -> dict:
    """The result fields of a reply's body, or of one entry of a reply that answers
    for several things (``ok``, then a result or an :func:`error_entry`); raises the
    error it carries.

    Raises
    ------
    PeerProtocolError
        The entry is not an object.
    ShmlogError (a subclass)
        The entry carries the broker's refusal.
    """
    if not isinstance(body, dict):
        raise PeerProtocolError(f"the broker sent a malformed entry: {body!r:.200}")
    if body.get("ok") is True:
        return {key: value for key, value in body.items() if key not in ("version", "ok")}
    error_class = _ERROR_CLASSES.get(body.get("error"), ShmlogError)
    message = str(body.get("message", "the broker refused the request"))
    try:
        raise error_class(message)
    except TypeError:                  # error classes with required keyword fields
        raise ShmlogError(f"{body.get('error')}: {message}") from None


def _parse(frame: bytes) -> dict:
    if len(frame) > REQUEST_SIZE_MAX:
        raise request_too_large(len(frame))
    try:
        body = json.loads(frame)
    except (UnicodeDecodeError, ValueError) as error:
        raise LocalProtocolError(f"request is not UTF-8 JSON ({error})") from None
    except RecursionError:             # nested past the interpreter's limit
        too_deep = True
    else:
        too_deep = _depth_exceeds(body, limits.CONTROL_NESTING_DEPTH_MAX)
    if too_deep:
        raise LocalProtocolError(f"request nests deeper than "
                                 f"{limits.CONTROL_NESTING_DEPTH_MAX} levels")
    if not isinstance(body, dict):
        raise LocalProtocolError("request must be a JSON object")
    if body.get("version") != PROTOCOL_VERSION:
        raise LocalProtocolError(f"unsupported protocol version {body.get('version')!r}; "
                                 f"this broker speaks {PROTOCOL_VERSION}")
    if not isinstance(body.get("type"), str):
        raise LocalProtocolError("request has no 'type'")
    return body


def _depth_exceeds(value: Any, depth_max: int) -> bool:
    """Does ``value`` nest lists and objects deeper than ``depth_max``? Iterative, so a
    deep value cannot exhaust the stack here either."""
    pending = [(value, 1)]
    while pending:
        value, depth = pending.pop()
        children = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > depth_max:
                    return True
                pending.append((child, depth + 1))
    return False


def handle_frame(frame: bytes, handlers: dict[str, Callable[..., dict | None]]) -> bytes | None:
    """Parse one request frame, run its handler, and encode the reply. Never raises
    for anything a client sent: every problem becomes an error reply. A handler that
    returns None answers later (see :func:`encode_result`): so does this."""
    try:
        body = _parse(frame)
        handler = handlers.get(body["type"])
        if handler is None:
            raise UnsupportedRequestError(f"unknown request type {body['type']!r}; known: "
                                          f"{', '.join(sorted(handlers))}")
        fields = {key: value for key, value in body.items() if key not in ("version", "type")}
        try:
            inspect.signature(handler).bind(**fields)
        except TypeError as error:     # missing or unexpected fields
            raise LocalProtocolError(f"bad fields for {body['type']!r}: {error}") from None
        result = handler(**fields)
        return None if result is None else _encode_reply({"ok": True, **result})
    except ShmlogError as error:
        return error_reply(error)


def encode_result(result: dict | ShmlogError) -> bytes:
    """The reply frame for a result that was held back (a handler returned None)."""
    if isinstance(result, ShmlogError):
        return error_reply(result)
    return _encode_reply({"ok": True, **result})


def require(value: Any, kind: type | tuple, name: str) -> Any:
    """A request field of the expected JSON type, or a LocalProtocolError."""
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise LocalProtocolError(f"field {name!r} must be {getattr(kind, '__name__', kind)}, "
                                 f"got {value!r:.100}")
    return value
