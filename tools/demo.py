"""The README's main job: start a broker, produce, consume, and check the segment.

1. starts a broker (a child process) on a fresh data directory,
2. creates a 3-partition topic, sends keyed records (with headers and a tombstone)
   and one numpy batch of 1000 fixed-width records through a Producer,
3. reads everything back with a Consumer straight from the segment files,
4. stops the broker (gracefully) and runs ``shmlog dump --verify`` on a segment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

from shmlog import Admin, Broker, Consumer, Producer


def main(data_dir: str) -> int:
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir = os.path.abspath(data_dir)
    print(f"starting a broker on {data_dir}")
    with Broker(data_dir):
        Admin(data_dir).create_topic("demo", partitions=3)
        with Producer(data_dir) as producer:
            sent = [producer.send("demo", value, key=key, headers=headers)
                    for value, key, headers in [(b"hello", b"user-1", [("source", b"demo")]),
                                                (b"world", b"user-2", []),
                                                (None, b"user-1", [("deleted", None)])]]
            readings = np.arange(2000, dtype="<f8").reshape(1000, 2)   # 16-byte records
            batch = producer.send_batch("demo", readings, partition=2).get(timeout=30)
            for future in sent:
                meta = future.get(timeout=30)
                print(f"sent to partition {meta.partition} at offset {meta.offset}")
            print(f"sent a batch of {batch.record_count} records to partition "
                  f"{batch.partition} at offsets {batch.base_offset}.."
                  f"{batch.base_offset + batch.record_count - 1}")
        with Consumer("demo", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            received = []
            while len(received) < 1003:
                for records in consumer.poll(timeout_ms=1000).values():
                    received += records
        print(f"consumed {len(received)} records; the keyed ones:")
        for record in received:
            if record.key is not None:
                print(f"  partition={record.partition} offset={record.offset} "
                      f"key={record.key!r} value={record.value!r} headers={record.headers}")
    segment = os.path.join(data_dir, "topics", "demo", "2", "00000000000000000000.log")
    print(f"\nbroker stopped; $ shmlog dump --verify {os.path.relpath(segment)}")
    sys.stdout.flush()
    done = subprocess.run([sys.executable, "-m", "shmlog", "dump", "--verify", segment],
                          stdout=subprocess.PIPE, text=True)
    lines = done.stdout.splitlines()
    print("\n".join(lines[:3] + (["  ..."] if len(lines) > 4 else []) + lines[-1:]))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "demo-data"))
