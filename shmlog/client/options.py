"""Kafka's client options by name: the ones shmlog's clients take and ignore, the
ones they refuse and why, and the serializer call kafka-python makes.

Rules
-----
* A program written for kafka-python passes its options as keywords. A client
  (``Producer``, ``Consumer``, ``Admin``) takes its own settings as parameters and
  hands every other keyword to :func:`check_kafka_options` before it asks the
  broker anything, as ``settings`` does for its own.
* **Ignored**: options whose Kafka meaning has nothing to act on here, because a
  shmlog client reaches its broker through shared memory and a Unix socket on the
  same host, not over a network (timeouts and retries of requests, socket buffers,
  reconnect back-offs, API version probing, metrics sampling): taken, and
  :data:`IGNORED` says why for each (the migration guide lists them).
* **Refused**: options that would change what the program means if they were
  dropped (transactions, ``read_committed``, TLS and SASL, a custom partitioner,
  static membership, a codec other than zstd): a value other than the harmless
  ones raises :class:`~shmlog.common.errors.UnsupportedKafkaOptionError` naming the option
  and why. The harmless values (``security_protocol="PLAINTEXT"``, a ``sasl_*`` or
  ``ssl_*`` option left None, ``isolation_level="read_uncommitted"``) are taken.
* Anything else is a mistake: :class:`~shmlog.common.errors.InvalidConfigError` naming the
  option and the client's own settings.
* Serializers and deserializers are called as kafka-python calls them
  (``KafkaProducer._serialize``, ``Fetcher._deserialize``): an object with a
  ``serialize(topic, data)`` (``deserialize``) method gets the topic too, a plain
  callable gets the data alone; None (a key not given) is passed through the
  function as well, as kafka-python and Kafka's Java client do.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ..common.errors import InvalidConfigError, UnsupportedKafkaOptionError

__all__ = ["IGNORED", "REFUSED", "check_kafka_options", "serializer", "deserializer"]

PRODUCER, CONSUMER, ADMIN = "Producer", "Consumer", "Admin"
_ALL = frozenset({PRODUCER, CONSUMER, ADMIN})
_PRODUCER = frozenset({PRODUCER})
_CONSUMER = frozenset({CONSUMER})

_NO_NETWORK = ("shmlog clients reach the broker on this host through shared memory and a "
               "Unix socket: there is no network connection for it to tune")
_NO_WIRE = "there is no Kafka wire protocol between client and broker, so nothing to negotiate"
_NO_SECURITY = ("shmlog clients talk to a broker on this host only (shared memory and a Unix "
                "socket): access is by file permissions (the broker's data_group setting), "
                "there is no network to encrypt or authenticate")

# option -> (the clients that take it, why it is ignored)
IGNORED: dict[str, tuple[frozenset, str]] = {
    "api_version": (_ALL, _NO_WIRE),
    "api_version_auto_timeout_ms": (_ALL, _NO_WIRE),
    "request_timeout_ms": (frozenset({PRODUCER, CONSUMER}), _NO_NETWORK),
    "retry_backoff_ms": (_ALL, _NO_NETWORK),
    "reconnect_backoff_ms": (_ALL, _NO_NETWORK),
    "reconnect_backoff_max_ms": (_ALL, _NO_NETWORK),
    "connections_max_idle_ms": (_ALL, _NO_NETWORK),
    "metadata_max_age_ms": (_ALL, "the producer reads a topic's metadata again after 5 "
                                  "minutes and whenever the broker says it changed"),
    "send_buffer_bytes": (_ALL, _NO_NETWORK),
    "receive_buffer_bytes": (_ALL, _NO_NETWORK),
    "socket_options": (_ALL, _NO_NETWORK),
    "sock_chunk_bytes": (_ALL, _NO_NETWORK),
    "sock_chunk_buffer_count": (_ALL, _NO_NETWORK),
    "selector": (_ALL, _NO_NETWORK),
    "metric_reporters": (_ALL, "shmlog keeps no kafka-python metrics registry"),
    "metrics_num_samples": (_ALL, "shmlog keeps no kafka-python metrics registry"),
    "metrics_sample_window_ms": (_ALL, "shmlog keeps no kafka-python metrics registry"),
    "metric_group_prefix": (_ALL, "shmlog keeps no kafka-python metrics registry"),
    "ssl_check_hostname": (_ALL, _NO_SECURITY),
    # producer
    "retries": (_PRODUCER, "a batch goes into a shared-memory ring the broker drains; "
                           "refused batches are sent again by the idempotent producer itself"),
    "max_in_flight_requests_per_connection": (_PRODUCER, _NO_NETWORK),
    "max_request_size": (_PRODUCER, "the topic's max.message.bytes bounds a batch"),
    "delivery_timeout_ms": (_PRODUCER, "a batch in the ring is appended or refused by the "
                                       "broker; futures wait as long as get(timeout) asks"),
    # consumer
    "fetch_min_bytes": (_CONSUMER, "a poll reads the mapped segments directly and returns "
                                   "what is there; it waits on the broker's doorbell"),
    "fetch_max_wait_ms": (_CONSUMER, "a poll waits on the broker's doorbell, up to its "
                                     "timeout_ms"),
    "max_partition_fetch_bytes": (_CONSUMER, "use fetch_max_bytes, shmlog's per-partition "
                                             "bound of a poll"),
    "check_crcs": (_CONSUMER, "batches are checked when appended; readers trust the log"),
    "exclude_internal_topics": (_CONSUMER, "internal topics are never matched by a pattern"),
    "allow_auto_create_topics": (_CONSUMER, "shmlog never creates topics on a read; "
                                            "create them with Admin"),
    "enable_incremental_fetch_sessions": (_CONSUMER, _NO_NETWORK),
    "legacy_iterator": (_CONSUMER, "iteration has one implementation"),
}

# option -> (the clients that take it, the values taken, why others are refused)
REFUSED: dict[str, tuple[frozenset, tuple, str]] = {
    "partitioner": (_PRODUCER, (None,),
                    "the partitioner is Kafka's default (murmur2 of the key, sticky for "
                    "unkeyed records); choose a partition per send instead"),
    "compression_type": (_PRODUCER, (None, "zstd"),
                         "shmlog compresses batches with zstd only (compression='zstd')"),
    "group_instance_id": (_CONSUMER, (None,),
                          "static group membership (KIP-345) is not supported"),
    "security_protocol": (_ALL, ("PLAINTEXT",), _NO_SECURITY),
    "ssl_context": (_ALL, (None,), _NO_SECURITY),
    "ssl_cafile": (_ALL, (None,), _NO_SECURITY),
    "ssl_certfile": (_ALL, (None,), _NO_SECURITY),
    "ssl_keyfile": (_ALL, (None,), _NO_SECURITY),
    "ssl_password": (_ALL, (None,), _NO_SECURITY),
    "ssl_crlfile": (_ALL, (None,), _NO_SECURITY),
    "ssl_ciphers": (_ALL, (None,), _NO_SECURITY),
    "sasl_mechanism": (_ALL, (None,), _NO_SECURITY),
    "sasl_plain_username": (_ALL, (None,), _NO_SECURITY),
    "sasl_plain_password": (_ALL, (None,), _NO_SECURITY),
    "sasl_kerberos_name": (_ALL, (None,), _NO_SECURITY),
    "sasl_kerberos_service_name": (_ALL, (None,), _NO_SECURITY),
    "sasl_kerberos_domain_name": (_ALL, (None,), _NO_SECURITY),
    "sasl_oauth_token_provider": (_ALL, (None,), _NO_SECURITY),
}


def check_kafka_options(client: str, options: Mapping[str, Any],
                        own_settings: Iterable[str]) -> None:
    """Check the keywords ``client`` (``"Producer"``, ``"Consumer"`` or ``"Admin"``)
    was given beyond its own settings (``own_settings``, named in the message).

    Raises
    ------
    UnsupportedKafkaOptionError
        A Kafka option shmlog refuses, with a value other than its harmless ones.
    InvalidConfigError
        A keyword that is neither the client's setting nor a Kafka option it takes.
    """
    for name, value in options.items():
        if name in IGNORED and client in IGNORED[name][0]:
            continue
        if name in REFUSED and client in REFUSED[name][0]:
            clients, taken, reason = REFUSED[name]
            if any(value is option or type(value) is type(option) and value == option
                   for option in taken):
                continue
            raise UnsupportedKafkaOptionError(
                f"{client} option {name}={value!r:.100} is not supported: {reason}"
                + (f" (taken: {', '.join(map(repr, taken))})" if taken != (None,) else ""))
        raise InvalidConfigError(
            f"{client} has no option {name!r}; its settings are "
            f"{', '.join(sorted(own_settings))}, and it takes these Kafka options "
            f"(ignored here: see docs/MIGRATING_FROM_KAFKA_PYTHON.md): "
            f"{', '.join(sorted(key for key, entry in IGNORED.items() if client in entry[0]))}")


def serializer(function: Any, name: str) -> Callable[[str, Any], Any] | None:
    """A ``key_serializer``/``value_serializer`` setting as ``f(topic, data)``, or
    None when none was given (kafka-python's ``_serialize``).

    Raises
    ------
    InvalidConfigError
        ``function`` is neither callable nor has a ``serialize`` method.
    """
    return _bind(function, name, "serialize")


def deserializer(function: Any, name: str) -> Callable[[str, Any], Any] | None:
    """A ``key_deserializer``/``value_deserializer`` setting as ``f(topic, data)``,
    or None when none was given (kafka-python's ``Fetcher._deserialize``)."""
    return _bind(function, name, "deserialize")


def _bind(function: Any, name: str, method: str) -> Callable[[str, Any], Any] | None:
    if function is None:
        return None
    bound = getattr(function, method, None)
    if callable(bound):
        return bound
    if not callable(function):
        raise InvalidConfigError(f"{name} must be a callable (or have a {method}(topic, data) "
                                 f"method), got {function!r:.100}")
    return lambda topic, data: function(data)
