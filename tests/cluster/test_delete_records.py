"""DeleteRecords in a cluster: asked of a follower's broker, carried out by the leader
(DELETE_RECORDS over the replication endpoint), learnt by every follower from the
leader's fetch responses (Kafka's ``maybeIncrementLogStartOffset``): each replica's
log start moves, its segments below it go, its readers get out-of-range below it, and
the answer's low watermark covers every live replica.

Method: the shared three-broker cluster (``fault_cluster``: this test kills nothing
and uses a topic of its own), a real acks=all producer, ``Admin.delete_records``
and ``shmlog delete-records`` against a broker that does not lead the partition,
then each broker's own view (``list_offsets``, ``describe_log_dirs``, a consumer).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from cluster.workload import ADMIN_TIMEOUT_MS, WAIT_S
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import OffsetOutOfRangeError

SEGMENT_BYTES = 4096          # a few records a segment: deletion has segments to drop
RECORDS = 300


def _admin(cluster, broker_id: int) -> Admin:
    return Admin(cluster.data_dir(broker_id), timeout_ms=ADMIN_TIMEOUT_MS)


def test_a_follower_learns_the_new_log_start_from_its_leader(fault_cluster):
    cluster = fault_cluster
    created = _admin(cluster, 1).create_topic(
        "trimmed", 1, {"min.insync.replicas": "2", "segment.bytes": str(SEGMENT_BYTES)},
        replication_factor=3)
    leader = created["partitions"][0]["leader"]
    asked = next(broker_id for broker_id in (1, 2, 3) if broker_id != leader)
    with Producer(cluster.data_dir(leader), acks="all") as producer:
        futures = [producer.send("trimmed", b"%0100d" % number, partition=0)
                   for number in range(RECORDS)]
        for future in futures:
            future.get(timeout=WAIT_S)

    def replicated_everywhere():
        return all(_admin(cluster, broker_id).list_offsets("trimmed")[0]["high_watermark"]
                   == RECORDS for broker_id in (1, 2, 3))
    cluster.wait_for(replicated_everywhere, WAIT_S, "every replica's high watermark at the end")
    segments_before = _admin(cluster, asked).describe_log_dirs(["trimmed"])[
        "partitions"][0]["segment_count"]

    partition = TopicPartition("trimmed", 0)
    answered = _admin(cluster, asked).delete_records({partition: 200},
                                                     timeout_ms=int(WAIT_S * 1000))
    assert answered == {partition: {"partition_index": 0, "low_watermark": 200, "error_code": 0}}
    for broker_id in (1, 2, 3):   # the low watermark covers every replica: none waits
        entry = _admin(cluster, broker_id).describe_log_dirs(["trimmed"])["partitions"][0]
        assert entry["log_start_offset"] == 200, f"broker {broker_id}"
        assert entry["segment_count"] < segments_before, f"broker {broker_id} dropped segments"
        with Consumer(bootstrap=cluster.data_dir(broker_id), auto_offset_reset="none") as reader:
            reader.assign([partition])
            reader.seek(partition, 150)
            with pytest.raises(OffsetOutOfRangeError):
                reader.poll(timeout_ms=1000)
    with pytest.raises(OffsetOutOfRangeError):
        _admin(cluster, asked).delete_records({partition: RECORDS + 1})

    everything = subprocess.run(
        [sys.executable, "-m", "shmlog", "delete-records", "--topic", "trimmed", "--partition",
         "0", "--offset", "-1", "--data-dir", cluster.data_dir(asked)],
        capture_output=True, text=True, timeout=WAIT_S * 2)
    assert everything.returncode == 0, everything.stderr
    assert f"partition: trimmed-0\tlow_watermark: {RECORDS}" in everything.stdout
    assert {_admin(cluster, broker_id).list_offsets("trimmed")[0]["log_start_offset"]
            for broker_id in (1, 2, 3)} == {RECORDS}
