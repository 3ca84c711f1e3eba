"""A full disk after a crash: a broker killed (SIGKILL) on a disk it filled starts
again, reads back every acknowledged record and refuses new appends with
``StorageError``; and appends refused by a full disk cost a bounded number of log
lines, while the stats count every one.

Method: a small tmpfs is mounted for each test (mounting needs root: the test
skips, saying so, when it is not permitted); a real broker serves a data directory
on it, with its output in a file. The restart test's topic has segments of
``SEGMENT_BYTES``, so a few are sealed before the disk fills, each with indexes of
more than a page (a restart rescans the sealed segments a crash left above the
recovery point, and rebuilds their indexes: reserving room for every entry their
log could need, rather than those it has, was a page more than a full disk had, and
the broker could not start). A ballast leaves ``SLACK`` bytes free, batches are sent
one at a time (each acknowledged before the next) until one is refused; then a
second ballast takes whatever is left, and the broker is killed. The second test
fills the disk before the first batch and sends ``REFUSALS`` batches, each refused,
then counts the broker's log lines about them and reads the stats' counter. Every
wait is bounded; brokers are stopped, the shared memory removed and the tmpfs
unmounted.
"""

from __future__ import annotations

import contextlib
import os

from test_full_disk import producing, read_all

from helpers import fill_disk
from shmlog.client.admin import Admin
from shmlog.common.errors import StorageError
from shmlog.server.broker import Broker, request

SLACK = 6_500_000              # the issue's free space: a few segments' worth
SEGMENT_BYTES = 1_500_000      # a sealed segment's time index needs two pages
RECORDS_PER_BATCH = 100
RECORD_SIZE = 400              # ~40 KiB batches
REFUSALS = 1000
LOG_LINES_MAX = 5
TIMEOUT_S = 30
TOPIC = "full"


def batch_values(number: int, size: int = RECORD_SIZE) -> list[bytes]:
    return [f"batch {number} record {index} ".encode().ljust(size, b"#")
            for index in range(RECORDS_PER_BATCH)]


def send(producer, values) -> int:
    """Send one batch and wait for it: its base offset."""
    return producer.send_batch(TOPIC, values, partition=0).get(timeout=TIMEOUT_S).base_offset


def produce_until_refused(producer, acknowledged: dict, batches_max: int = 1000) -> StorageError:
    """Batches one at a time until one is refused (the refusal); every batch
    acknowledged goes into ``acknowledged`` (offset -> value)."""
    for number in range(len(acknowledged), len(acknowledged) + batches_max):
        values = batch_values(number)
        try:
            base_offset = send(producer, values)
        except StorageError as error:
            return error
        acknowledged.update(zip(range(base_offset, base_offset + len(values)), values))
    raise AssertionError(f"{batches_max} batches of ~40 KiB went onto a 16 MiB disk")


def fill_the_rest(disk) -> None:
    """A second ballast that takes every byte left."""
    os.rename(os.path.join(disk, "ballast"), os.path.join(disk, "ballast-first"))
    fill_disk(disk, 0)


def test_a_broker_killed_on_a_full_disk_restarts_and_keeps_every_acknowledged_record(
        small_disk, data_dir, tmp_path):
    output = str(tmp_path / "broker.out")
    acknowledged: dict[int, bytes] = {}
    with Broker(data_dir, output=output) as broker:
        Admin(data_dir).create_topic(TOPIC, 1, {"segment.bytes": SEGMENT_BYTES})
        with producing(data_dir) as producer:
            fill_disk(small_disk, SLACK)
            produce_until_refused(producer, acknowledged)
            fill_the_rest(small_disk)
            broker.process.kill()
            broker.process.wait(timeout=TIMEOUT_S)
    sealed = [name for name in os.listdir(os.path.join(data_dir, "topics", TOPIC, "0"))
              if name.endswith(".log")]
    assert len(sealed) >= 3, f"the disk filled before segments were sealed: {sealed}"

    with Broker(data_dir, output=output) as broker:
        assert read_all(data_dir, len(acknowledged)) == acknowledged
        with producing(data_dir) as producer:
            # What the active segment had reserved before the kill still takes batches.
            refusal = produce_until_refused(producer, acknowledged)
        assert "could not write" in str(refusal)
        assert broker.process.poll() is None, "a refused append never stops the broker"
        assert read_all(data_dir, len(acknowledged)) == acknowledged
        assert broker.stop() == 0


def test_refused_appends_log_a_few_lines_and_are_counted(small_disk, data_dir, tmp_path):
    output = str(tmp_path / "broker.out")
    with Broker(data_dir, output=output) as broker:
        Admin(data_dir).create_topic(TOPIC, 1)
        with producing(data_dir) as producer:
            fill_disk(small_disk, 0)
            refused = 0
            for number in range(REFUSALS):
                with contextlib.suppress(StorageError):
                    send(producer, batch_values(number, size=1000))
                    continue
                refused += 1
        assert refused >= REFUSALS * 9 // 10, f"only {refused} of {REFUSALS} were refused"
        appender = request(data_dir, "stats")["appender"]
        assert broker.stop() == 0
    with open(output) as log:
        lines = log.read().splitlines()
    # The appender's lines, and any line not a log record's first (a traceback's).
    about = [line for line in lines
             if " shmlog.broker.appender: " in line or not line[:4].isdigit()]
    assert len(about) <= LOG_LINES_MAX, "\n".join(about[:20])
    assert not any("Traceback" in line for line in lines), "no traceback for a full disk"
    assert appender.get("appends_refused_storage") == refused, "the stats count every one"
