"""Keys land on the partitions Kafka would choose: murmur2 against vectors computed
with Kafka's own Java ``Utils.murmur2``, and its ``toPositive(h) % n`` rule, for
keys whose hash the producer caches and for keys too long to cache; the cache stays
within its bounds however many keys go by."""

from __future__ import annotations

import pytest

from shmlog.client.partitioner import cached_positive_hash as _cached_positive_hash
from shmlog.client.partitioner import murmur2, partition_for_key
from shmlog.common import limits

# Computed with org.apache.kafka.common.utils.Utils.murmur2 on the UTF-8 bytes.
JAVA_VECTORS = {"0": 971027396, "1": -1993445489, "128": -326012175, "2187": -1508407203,
                "16384": -325739742, "12": 126087238, "123": -267702483,
                "1234": -1614185708, "12345": -1188365604}


@pytest.mark.parametrize("key, expected", sorted(JAVA_VECTORS.items()))
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key.encode()) == expected


def test_partition_for_key_is_kafkas_rule():
    for key, hashed in JAVA_VECTORS.items():
        for partitions in (1, 3, 12, 100):
            for _ in range(2):                   # computed, then from the cache
                assert partition_for_key(key.encode(), partitions) == \
                    (hashed & 0x7FFFFFFF) % partitions


def test_long_and_bytes_like_keys_follow_the_same_rule():
    long_key = b"k" * (limits.PARTITIONER_CACHE_KEY_SIZE_MAX + 1)
    for key in (long_key, bytearray(b"12345"), memoryview(b"12345")):
        assert partition_for_key(key, 7) == (murmur2(bytes(key)) & 0x7FFFFFFF) % 7


def test_the_hash_cache_is_bounded_in_keys_and_key_size():
    _cached_positive_hash.cache_clear()
    for number in range(limits.PARTITIONER_CACHE_KEYS_MAX * 2):
        partition_for_key(b"key-%d" % number, 8)
    assert _cached_positive_hash.cache_info().currsize == limits.PARTITIONER_CACHE_KEYS_MAX
    _cached_positive_hash.cache_clear()
    partition_for_key(b"k" * (limits.PARTITIONER_CACHE_KEY_SIZE_MAX + 1), 8)
    assert _cached_positive_hash.cache_info().currsize == 0, "a long key is not kept"
