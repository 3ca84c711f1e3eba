"""Keys land on the partitions Kafka would choose: murmur2 against vectors computed
with Kafka's own Java ``Utils.murmur2``, and its ``toPositive(h) % n`` rule."""

from __future__ import annotations

import pytest

from shmlog.producer import murmur2, partition_for_key

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
            assert partition_for_key(key.encode(), partitions) == (hashed & 0x7FFFFFFF) % partitions
