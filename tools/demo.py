"""The README's main job: write a topic partition to disk, then read it back.

Writes keyed, headed, null-valued and zstd-compressed records into a 3-partition
topic through the storage API, reads them back through the log, and finally asks the
``shmlog dump --verify`` command to print and check the segment it wrote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

from shmlog import LogManager, decode_records, encode_batch


def main(data_dir: str) -> int:
    shutil.rmtree(data_dir, ignore_errors=True)
    with LogManager(data_dir) as logs:
        logs.create_topic("demo", partitions=3, config={"segment.bytes": 1 << 20})
        partition = logs.partition_log("demo", 0)
        first = partition.append(encode_batch(
            [b"hello", b"world", None],
            keys=[b"user-1", b"user-2", b"user-1"],
            headers=[[("source", b"demo")], [], [("deleted", None)]]))
        readings = np.arange(2000, dtype="<f8").reshape(1000, 2)      # 16-byte records
        second = partition.append(encode_batch(readings, compression="zstd"))
        print(f"appended offsets {first.base_offset}..{first.last_offset} (plain) and "
              f"{second.base_offset}..{second.last_offset} (zstd) to {partition.directory}")
        records = decode_records(partition.read(0).data)
        print(f"read back {len(records)} records from offset 0; the first three:")
        for record in records[:3]:
            print(f"  offset={record.offset} key={record.key!r} value={record.value!r} "
                  f"headers={record.headers}")
        segment_path = partition.segments[0].log_path
    print(f"\n$ shmlog dump --verify --records {os.path.relpath(segment_path)}")
    sys.stdout.flush()
    done = subprocess.run([sys.executable, "-m", "shmlog", "dump", "--verify", "--records",
                           "--print-data", "--max-bytes", "16", segment_path],
                          stdout=subprocess.PIPE, text=True)
    lines = done.stdout.splitlines()
    shown = lines[:8] + ([f"  ... {len(lines) - 10} more lines ..."] + lines[-2:]
                         if len(lines) > 10 else lines[8:])
    print("\n".join(shown))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "demo-data"))
