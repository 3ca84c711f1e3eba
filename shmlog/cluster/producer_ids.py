"""Producer ids of a cluster member: unique across the cluster, drawn from ZooKeeper
in blocks (Kafka's ``ProducerIdManager`` with ``/latest_producer_id_block``).

Why: a new leader dedupes a retried batch by its producer id and sequence, with the
producer state it replicated. Two brokers handing out one id would make it merge two
producers: a new producer's first batch taken for a duplicate of another's, and
acknowledged with that one's offset, its records never appended.

Rules
-----
* Every id comes from a block of ``zk_paths.PRODUCER_ID_BLOCK_SIZE`` ids this broker
  took by a conditional write of ``/latest_producer_id_block``
  (``ClusterZooKeeper.next_producer_id_block``): no two brokers, and no two runs of
  one broker, ever hold the same block. Ids left in a block when the broker stops
  are never used (as in Kafka).
* The first block is drawn when the broker joins (it may wait for ZooKeeper there).
* **The loop never waits for ZooKeeper**: the next block is drawn on a thread of
  its own once ``limits.PRODUCER_ID_PREFETCH_REMAINING`` ids of the current one are
  left. A broker that runs out of ids before the draw is done (ZooKeeper
  unreachable through the last ``PRODUCER_ID_PREFETCH_REMAINING`` registrations)
  refuses with :class:`~shmlog.common.errors.ProducerIdsUnavailableError` (retriable)
  rather than blocking its loop, and draws again. Kafka 2.8 instead blocks a
  request handler thread on ZooKeeper; we have one loop.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from ..common import limits
from ..common.errors import ProducerIdsUnavailableError, ShmlogError

log = logging.getLogger("shmlog.broker")

__all__ = ["ClusterProducerIds"]


class ClusterProducerIds:
    """Cluster-wide producer ids for ``broker_id`` (see the module's rules); the same
    ``allocate()`` as ``producer_registry.ProducerIds``.

    Parameters
    ----------
    zookeeper : ClusterZooKeeper
        Started; its ``next_producer_id_block`` takes a block.
    broker_id : int

    Raises
    ------
    ShmlogError
        The first block cannot be drawn (ZooKeeper unreachable, the ids used up).
    """

    def __init__(self, zookeeper, broker_id: int):
        self._zookeeper = zookeeper
        self.broker_id = broker_id
        block = zookeeper.next_producer_id_block(broker_id)
        self._next, self._end = block.block_start, block.block_end + 1
        self._drawing: Future | None = None
        self._drawer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shmlog-producer-ids")

    def allocate(self) -> int:
        """A producer id no broker of the cluster handed out before.

        Raises
        ------
        ProducerIdsUnavailableError
            This block is used up and the next one is not drawn yet.
        """
        if self._next == self._end:
            self._take_drawn()
        producer_id = self._next
        self._next += 1
        if self._end - self._next <= limits.PRODUCER_ID_PREFETCH_REMAINING \
                and self._drawing is None:
            self._drawing = self._drawer.submit(self._zookeeper.next_producer_id_block,
                                                self.broker_id)
        return producer_id

    def _take_drawn(self) -> None:
        drawing = self._drawing
        if drawing is not None and drawing.done():
            self._drawing = None
            try:
                block = drawing.result()
            except ShmlogError as error:
                log.warning("cannot draw producer ids from ZooKeeper: %s", error)
            else:
                self._next, self._end = block.block_start, block.block_end + 1
                return
        if self._drawing is None:
            self._drawing = self._drawer.submit(self._zookeeper.next_producer_id_block,
                                                self.broker_id)
        raise ProducerIdsUnavailableError(
            f"broker {self.broker_id} has used its producer ids and is drawing more from "
            f"ZooKeeper: retry")

    def close(self) -> None:
        """Stop drawing, without waiting for a draw under way (close the ZooKeeper
        session first: the draw then fails at once); a block drawn is never used."""
        self._drawer.shutdown(wait=False, cancel_futures=True)
