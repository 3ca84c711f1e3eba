"""One member of a consumer group, as its own process, for the groups-across-hosts
tests: ``python group_member_process.py <data dir> <group> <topic> <log file> <stop file>``.

It consumes ``topic`` through its local broker (``data dir``) from the earliest
offset, and after every poll that returned records commits its positions
synchronously. Its log file gets one line per fact, flushed at once (the test reads
it while the process runs, and after a kill -9):

* ``P <partition> <offset> <value>``: a record processed (its value in hex, ``-``
  for a null value);
* ``C <partition> <offset>``: a commit acknowledged (the broker answered it);
* ``A <partition>,...``: its assignment after a poll that changed it;
* ``E <error class>``: a poll or commit refused (a failover under way: it goes on).

It stops, leaving the group, when the stop file exists.
"""

from __future__ import annotations

import os
import sys
import time

from shmlog.client.consumer import Consumer
from shmlog.common.errors import ShmlogError

# Kafka's smallest session the broker allows (group.min.session.timeout.ms), a
# heartbeat every second, and a poll bound far above a poll's length.
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 1_000
MAX_POLL_INTERVAL_MS = 20_000
POLL_TIMEOUT_MS = 200


def main(data_dir: str, group_id: str, topic: str, log_path: str, stop_path: str) -> None:
    with open(log_path, "a", buffering=1) as out, Consumer(
            topic, bootstrap=data_dir, group_id=group_id, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
            partition_assignment_strategy=("range",)) as consumer:
        assignment = None
        while not os.path.exists(stop_path):
            try:
                batches = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            except ShmlogError as error:
                out.write(f"E {type(error).__name__}\n")
                time.sleep(0.1)
                continue
            now = sorted(partition.partition for partition in consumer.assignment())
            if now != assignment:
                assignment = now
                out.write(f"A {','.join(map(str, now))}\n")
            if not batches:
                continue
            for partition, records in batches.items():
                out.write("".join(f"P {partition.partition} {record.offset} "
                                  f"{'-' if record.value is None else record.value.hex()}\n"
                                  for record in records))
            positions = {partition: records[-1].offset + 1
                         for partition, records in batches.items()}
            try:
                consumer.commit(positions)
            except ShmlogError as error:
                out.write(f"E {type(error).__name__}\n")
                continue
            out.write("".join(f"C {partition.partition} {offset}\n"
                              for partition, offset in positions.items()))


if __name__ == "__main__":
    main(*sys.argv[1:6])
