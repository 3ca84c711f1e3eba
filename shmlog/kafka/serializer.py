"""kafka-python's ``kafka.serializer``: the base classes of serializer objects.
A client calls ``serialize(topic, value)`` (``deserialize(topic, data)``) on an
object that has it, and a plain function with the value alone
(``shmlog.client.options``)."""

from __future__ import annotations

__all__ = ["Serializer", "Deserializer"]


class Serializer:
    """Turns a key or value into bytes: override :meth:`serialize`."""

    def __init__(self, **config):
        self.config = config

    def serialize(self, topic: str, value) -> bytes | None:
        raise NotImplementedError(f"{type(self).__name__} must implement serialize")

    def close(self) -> None:
        """Called by nothing in shmlog; kept for kafka-python's interface."""


class Deserializer:
    """Turns a key's or value's bytes back: override :meth:`deserialize`."""

    def __init__(self, **config):
        self.config = config

    def deserialize(self, topic: str, data: bytes | None):
        raise NotImplementedError(f"{type(self).__name__} must implement deserialize")

    def close(self) -> None:
        """Called by nothing in shmlog; kept for kafka-python's interface."""
