"""A consumer group member: it joins the group, reads its partitions from the
group's committed offsets, commits after each poll, and leaves; run it twice and
the second run starts where the first stopped.

    python examples/group_consumer.py [DATA_DIR]

DATA_DIR is a running broker's data directory (default: $SHMLOG_DATA_DIR, else
shmlog's default). The script makes the topic ``orders`` (3 partitions) if it is
missing and sends it 30 keyed records first.
"""

from __future__ import annotations

import sys
import time

from shmlog import Consumer, Producer
from shmlog.client.admin import Admin
from shmlog.common.errors import TopicExistsError

RECORDS = 30
DEADLINE_S = 60


def main(data_dir: str | None) -> None:
    try:
        Admin(data_dir).create_topic("orders", 3)
    except TopicExistsError:
        pass
    with Producer(data_dir) as producer:
        for number in range(RECORDS):
            producer.send("orders", b"order %d" % number, key=b"customer-%d" % (number % 7))
    with Consumer("orders", bootstrap=data_dir, group_id="order-printers",
                  auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        seen = 0
        deadline = time.monotonic() + DEADLINE_S
        while seen < RECORDS and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=1000)       # the first poll joins the group
            for partition, records in batch.items():
                seen += len(records)
                print(f"{partition.topic}-{partition.partition}: "
                      f"{', '.join(record.value.decode() for record in records[:3])}"
                      f"{', ...' if len(records) > 3 else ''}")
            if batch:
                consumer.commit()                         # what poll returned, per partition
        committed = {partition.partition: consumer.committed(partition)
                     for partition in sorted(consumer.assignment())}
    print(f"read {seen} records; committed offsets by partition: {committed}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
