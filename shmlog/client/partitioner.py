"""The producer's default partitioner (Kafka's ``DefaultPartitioner``): which partition
a record goes to.

Rules
-----
* A partition the caller names is taken as it is, once checked against the topic's
  partitions.
* A keyed record goes to ``toPositive(murmur2(key)) % partitions``, Kafka's rule, so a
  key lands on the same partition number as with Kafka.
* An unkeyed record sticks to one partition, chosen at random, until that partition's
  batch ships; then the next unkeyed record chooses again (Kafka's sticky partitioner,
  KIP-480). The sticky partition is kept on the topic's route (``route.sticky``, -1:
  choose one), and whoever ships a batch sets it back to -1.

Theory of operation
-------------------
A compiled call costs more than hashing a short key, so the positive hashes of recent
short keys (at most ``limits.PARTITIONER_CACHE_KEY_SIZE_MAX`` bytes) are kept in an
LRU cache of ``limits.PARTITIONER_CACHE_KEYS_MAX`` keys (:func:`cached_positive_hash`);
a longer key's hash is computed each time. ``Producer.send`` runs the common cases
(a sticky partition already chosen, a short key) inline with the same rules, so a
record costs no call into this module there; :func:`choose_partition` does the rest.
"""

from __future__ import annotations

import functools
import random

import numpy as np

from ..common import limits
from ..common.errors import UnknownTopicOrPartitionError
from ..native.jit import kernel

__all__ = ["murmur2", "cached_positive_hash", "partition_for_key", "choose_partition"]

_CACHED_KEY_SIZE_MAX = limits.PARTITIONER_CACHE_KEY_SIZE_MAX


@kernel
def _murmur2(data):
    mask = 0xFFFFFFFF
    multiplier = 0x5BD1E995
    length = len(data)
    hash_value = (0x9747B28C ^ length) & mask
    tail = length - length % 4
    for index in range(0, tail, 4):
        word = (np.int64(data[index]) | (np.int64(data[index + 1]) << 8)
                | (np.int64(data[index + 2]) << 16) | (np.int64(data[index + 3]) << 24))
        word = (word * multiplier) & mask
        word ^= word >> 24
        word = (word * multiplier) & mask
        hash_value = ((hash_value * multiplier) & mask) ^ word
    extra = length % 4
    if extra >= 3:
        hash_value ^= np.int64(data[tail + 2]) << 16
    if extra >= 2:
        hash_value ^= np.int64(data[tail + 1]) << 8
    if extra >= 1:
        hash_value ^= np.int64(data[tail])
        hash_value = (hash_value * multiplier) & mask
    hash_value ^= hash_value >> 13
    hash_value = (hash_value * multiplier) & mask
    hash_value ^= hash_value >> 15
    return hash_value


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit result), so keys map to the same
    partitions as in Kafka."""
    hash_value = int(_murmur2(data if type(data) is bytes else memoryview(data).tobytes()))
    return hash_value - (1 << 32) if hash_value & 0x80000000 else hash_value


@functools.lru_cache(maxsize=limits.PARTITIONER_CACHE_KEYS_MAX)
def cached_positive_hash(key: bytes) -> int:
    """Kafka's ``toPositive(murmur2(key))`` for a ``bytes`` key of at most
    ``limits.PARTITIONER_CACHE_KEY_SIZE_MAX`` bytes (the caller checks both), cached."""
    return int(_murmur2(key)) & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default: ``toPositive(murmur2(key)) % partitions``. A short key's hash
    is cached (a compiled call costs more than the hash); a long one's is computed."""
    if type(key) is bytes and len(key) <= _CACHED_KEY_SIZE_MAX:
        return cached_positive_hash(key) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def choose_partition(route, topic: str, key, partition) -> int:
    """The partition a record (or a batch, by its first key) goes to.

    Parameters
    ----------
    route : TopicRoute
        The topic's route: its ``partitions`` count and its ``sticky`` partition
        (-1: none chosen yet; chosen here, at random, when needed).
    topic : str
        The topic's name, for the error.
    key : bytes-like or None
    partition : int or None
        The partition the caller named, if any.

    Raises
    ------
    UnknownTopicOrPartitionError
        ``partition`` is not one of the topic's.
    """
    if partition is not None:
        if isinstance(partition, bool) or not isinstance(partition, int) or \
                not 0 <= partition < route.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{route.partitions - 1}, "
                f"not {partition!r}")
        return int(partition)
    if key is not None:
        return partition_for_key(key, route.partitions)
    if route.sticky < 0:
        route.sticky = random.randrange(route.partitions)
    return route.sticky
