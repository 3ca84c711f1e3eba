"""The producer requests: register a ring, unregister it, and a new producer id
(Kafka's InitProducerId), over the broker's :class:`ProducerRegistry`.

Rules
-----
* A registered ring is drained from the next turn of the loop (entries put before
  it registered included); an unregistered one is drained once more, then unmapped.
* A producer says its ``acks`` (0, 1 or -1; 1 when it does not say): with -1
  ("all") its entries complete once the partition's high watermark covers them
  (the appender's ``awaits_high_watermark``), under ``min.insync.replicas``'s
  refusals. Registering again may change it.
* A producer id comes with epoch 0; a producer that used up every epoch of its id
  (KIP-360: one bump per refused batch) asks for a new id for the same ring.

Theory of operation
-------------------
A :class:`~shmlog.broker.service.Service` with no clock of its own and nothing held back:
the registry's periodic liveness check is one of the broker's scheduled tasks.
"""

from __future__ import annotations

from typing import Callable

from ..common.errors import LocalProtocolError
from ..protocol.control import require
from .producer_registry import ProducerRegistry
from .service import ImmediateService
from .transaction_coordinator import require_transactional_id

__all__ = ["ProducerService", "ACKS"]

ACKS = (0, 1, -1)        # Kafka's: none, the leader's append, every in-sync replica ("all")


class ProducerService(ImmediateService):
    """Producer registration requests over a :class:`ProducerRegistry`."""

    def __init__(self, registry: ProducerRegistry,
                 learn_transactional_id: Callable[[int, str], None] | None = None):
        self.registry = registry
        # A cluster member's: whose coordinator verifies a transactional producer's
        # batches (one broker's own coordinator knows every producer id).
        self.learn_transactional_id = learn_transactional_id

    def handlers(self) -> dict:
        return {"register_producer": self.register_producer,
                "unregister_producer": self.unregister_producer,
                "init_producer_id": self.init_producer_id}

    def register_producer(self, ring, acks=1, transactional_id=None, producer_id=None) -> dict:
        """Start draining the producer's ring (it created it, under our prefix), its
        entries completed as ``acks`` (0, 1 or -1) asks. A transactional producer
        registering again (its broker restarted) names its transactional id and the
        producer id its coordinator gave it."""
        if require(acks, int, "acks") not in ACKS:
            raise LocalProtocolError(f"field 'acks' must be one of {ACKS}, got {acks!r}")
        if transactional_id is not None:
            require_transactional_id(transactional_id)
            require(producer_id, int, "producer_id")
            if self.learn_transactional_id is not None:
                self.learn_transactional_id(producer_id, transactional_id)
        index, producer_id = self.registry.register(require(ring, str, "ring"), acks=acks)
        return {"index": index, "producer_id": producer_id, "producer_epoch": 0}

    def init_producer_id(self, ring) -> dict:
        """A new producer id for a registered ring (Kafka's InitProducerId): its
        producer has used up every epoch of the one it had (KIP-360)."""
        return {"producer_id": self.registry.new_producer_id(require(ring, str, "ring")),
                "producer_epoch": 0}

    def unregister_producer(self, ring) -> dict:
        """Drain what the producer published, then forget its ring and unmap it."""
        self.registry.unregister(require(ring, str, "ring"))
        return {}
