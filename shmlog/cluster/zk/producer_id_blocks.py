"""Producer-id blocks: the cluster-wide allocation of idempotent producer ids in
``/latest_producer_id_block`` (Kafka's ``ProducerIdManager.getNewProducerIdBlock``
over ``ProducerIdBlockZNode``).

Rules
-----
* **A block is taken by a conditional write**: read the last block and its
  zkVersion, write the next one at that version (or create the znode when there is
  none); a broker that lost the race to another reads again, at most
  ``ZOOKEEPER_CONFLICT_ATTEMPTS_MAX`` times (:class:`StaleStateVersionError`).
* Ids are never reused: a block is ``PRODUCER_ID_BLOCK_SIZE`` ids after the last
  one, and past ``PRODUCER_ID_MAX`` none is left (:class:`ZnodeFormatError`).

Theory of operation
-------------------
The znode holds only the last block taken; each broker hands out the ids of its
block itself (``cluster.producer_ids``) and comes back for the next. Ids left in a
block when its broker stops are never used, as in Kafka.
"""

from __future__ import annotations

from ...common import limits
from ...common.errors import StaleStateVersionError, ZnodeExistsError, ZnodeFormatError
from . import paths as zk_paths
from .paths import ProducerIdBlock
from .session import ZooKeeperSession

__all__ = ["ProducerIdBlocks"]


class ProducerIdBlocks:
    """The producer-id block allocation, in ``session``."""

    def __init__(self, session: ZooKeeperSession):
        self._session = session

    def next_producer_id_block(self, broker_id: int) -> ProducerIdBlock:
        """Take the next block of ``PRODUCER_ID_BLOCK_SIZE`` producer ids, cluster-wide
        (Kafka's ``ProducerIdManager.getNewProducerIdBlock``): read the last block
        and its version, write the next one conditionally, retry when another
        broker took one meanwhile.

        Raises
        ------
        StaleStateVersionError
            Lost the race ``ZOOKEEPER_CONFLICT_ATTEMPTS_MAX`` times.
        ZnodeFormatError
            The znode is malformed, or its last block leaves no ids.
        """
        path = zk_paths.PRODUCER_ID_BLOCK_PATH
        for _ in range(limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX):
            body, stat = self._session.get(path) or (b"", None)
            last = zk_paths.decode_producer_id_block(body)
            start = 0 if last is None else last.block_end + 1
            block = ProducerIdBlock(broker_id, start, start + zk_paths.PRODUCER_ID_BLOCK_SIZE - 1)
            if block.block_end > zk_paths.PRODUCER_ID_MAX:
                raise ZnodeFormatError(f"{path}: the last block ends at {start - 1}: no "
                                       f"producer ids are left")
            try:
                if stat is None:
                    self._session.create(path, zk_paths.encode_producer_id_block(block))
                else:
                    self._session.set(path, zk_paths.encode_producer_id_block(block),
                                      version=stat.version)
                return block
            except (StaleStateVersionError, ZnodeExistsError):
                continue
        raise StaleStateVersionError(f"{path}: another broker took a block each of "
                                     f"{limits.ZOOKEEPER_CONFLICT_ATTEMPTS_MAX} times",
                                     path=path)
