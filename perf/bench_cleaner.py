"""Log compaction: how fast the cleaner turns dirty segments into clean ones.

A partition of 5 M records (100-byte values, 16-byte keys drawn from 100 000 keys,
1000-record batches, uncompressed and zstd) is written in 64 MiB segments; one
cleaning pass (key map, then copy) runs over every closed segment. Printed: input
bytes per second, records per second, the share kept, and the ratio to the same
run's memcpy bandwidth.

What bounds it: the copy pass hashes every key twice (FNV-1a and a
rotate-multiply hash, one byte at a time) and looks it up in the sorted map by
binary search (a cache miss per probe once the map outgrows the cache), then
copies what it keeps and computes a CRC32C per batch; zstd batches are inflated
and compressed again. The map pass hashes every key of the dirty part and sorts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
sys.path.insert(0, REPOSITORY)

import numpy as np  # noqa: E402
from bounds import memcpy_rate  # noqa: E402

from shmlog.record.records import encode_batch  # noqa: E402
from shmlog.segments import PartitionLog  # noqa: E402
from shmlog.storage import cleaner  # noqa: E402
from shmlog.storage.topic_config import TopicConfig  # noqa: E402

BATCH_RECORDS = 1000
VALUE_SIZE = 100
KEYS = 100_000


def fill(partition_log: PartitionLog, records: int, compression: str | None, seed: int) -> int:
    rng = np.random.default_rng(seed)
    values = np.frombuffer(rng.bytes(BATCH_RECORDS * VALUE_SIZE), np.uint8).reshape(
        BATCH_RECORDS, VALUE_SIZE)
    key_numbers = rng.integers(0, KEYS, records)
    timestamp = 1_700_000_000_000
    for start in range(0, records, BATCH_RECORDS):
        keys = [b"key-%012d" % number for number in key_numbers[start:start + BATCH_RECORDS]]
        partition_log.append(encode_batch(values, keys=keys, timestamp_ms=timestamp,
                                          compression=compression))
    return timestamp


def run(records: int, compression: str | None) -> dict:
    directory = tempfile.mkdtemp(prefix="shmlog-bench-cleaner-")
    try:
        config = TopicConfig.from_overrides({"cleanup.policy": "compact",
                                             "segment.bytes": 64 << 20})
        with PartitionLog(directory, config) as partition_log:
            timestamp = fill(partition_log, records, compression, seed=1)
            partition_log.roll()
            now = timestamp + 1_000
            planned = cleaner.plan(partition_log, now)
            started = time.perf_counter()
            cleaning = cleaner.clean(planned, now, cleaner.keys_max(128 << 20))
            cleaned_s = time.perf_counter() - started
            assert partition_log.replace_segments(cleaning)
            return {"seconds": cleaned_s, "bytes_before": cleaning.bytes_before,
                    "bytes_after": cleaning.bytes_after, "records": records}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    args = parser.parse_args(argv)
    bound = memcpy_rate()
    print(f"memcpy (np.copyto 256 MiB, best of 5): {bound / 1e9:.2f} GB/s")
    run(BATCH_RECORDS * 20, None)              # compile and warm up
    for compression in (None, "zstd"):
        result = run(args.records, compression)
        rate = result["bytes_before"] / result["seconds"]
        print(f"clean {compression or 'uncompressed':<12} {result['bytes_before'] / 1e6:8.1f} MB "
              f"in {result['seconds']:6.2f} s: {rate / 1e6:7.1f} MB/s, "
              f"{result['records'] / result['seconds'] / 1e6:5.2f} M records/s, kept "
              f"{result['bytes_after'] / result['bytes_before']:5.1%}, "
              f"{rate / bound:5.1%} of memcpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
