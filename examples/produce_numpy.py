"""Sensor readings from a numpy structured array, sent as whole batches (one compiled
call per batch, a record per row) and read back as numpy columns.

    python examples/produce_numpy.py [DATA_DIR]

DATA_DIR is a running broker's data directory (default: $SHMLOG_DATA_DIR, else
shmlog's default). The script makes the topic ``readings`` if it is missing.
"""

from __future__ import annotations

import sys

import numpy as np

from shmlog import Consumer, Producer, TopicPartition
from shmlog.client.admin import Admin
from shmlog.common.errors import TopicExistsError

READING = np.dtype([("time_ns", "<i8"), ("sensor", "<u4"), ("celsius", "<f4")])
BLOCKS, ROWS = 10, 1000


def main(data_dir: str | None) -> None:
    try:
        Admin(data_dir).create_topic("readings", 1)
    except TopicExistsError:
        pass
    with Consumer(bootstrap=data_dir) as consumer:
        partition = TopicPartition("readings", 0)
        consumer.assign([partition])
        start = consumer.position(partition)          # read back only what we send
        rng = np.random.default_rng(7)
        sent = np.zeros(BLOCKS * ROWS, READING)
        sent["time_ns"] = np.arange(sent.size) * 1_000_000
        sent["sensor"] = rng.integers(0, 16, sent.size)
        sent["celsius"] = rng.normal(21.0, 2.0, sent.size)
        with Producer(data_dir) as producer:
            futures = [producer.send_batch("readings", sent[block * ROWS:(block + 1) * ROWS],
                                           partition=0) for block in range(BLOCKS)]
            first = futures[0].get(timeout=30)
            for future in futures[1:]:
                future.get(timeout=30)
        print(f"sent {sent.size} readings in {BLOCKS} batches, from offset {first.base_offset}")

        consumer.seek(partition, start)
        received = []
        while sum(map(len, received)) < sent.size:
            for columns in consumer.poll_batch(timeout_ms=5000).values():
                # Every value is one READING: gather the rows' bytes, then view them.
                rows = columns.data[columns.value_positions[:, None] +
                                    np.arange(READING.itemsize)]
                received.append(rows.view(READING).reshape(-1))
    readings = np.concatenate(received)[:sent.size]
    assert np.array_equal(readings, sent), "the readings came back changed"
    hottest = readings[np.argmax(readings["celsius"])]
    print(f"received {readings.size} readings; hottest: sensor {hottest['sensor']} at "
          f"{hottest['celsius']:.1f} C")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
