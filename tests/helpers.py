"""Helpers shared by the tests: batches with recognisable records, reading a log
whole, a small disk to fill, the shared memory a broker's test leaves behind."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess

import numpy as np
import pytest

from shmlog.protocol.control import decode_reply, encode_request
from shmlog.record.records import decode_records, encode_batch
from shmlog.server.broker import shared_memory_prefix
from shmlog.shm import shared_memory

SHARED_MEMORY_DIRECTORY = "/dev/shm"


def values_batch(count: int, seed: int, *, size: int = 20, timestamps=None,
                 **options) -> np.ndarray:
    """A batch of ``count`` distinct values (``seed`` makes them unique per batch)."""
    values = [f"v{seed}-{index}-".encode().ljust(size, b".") for index in range(count)]
    keys = [f"k{index % 7}".encode() for index in range(count)]
    return encode_batch(values, keys=keys, timestamps=timestamps, **options)


def all_records(partition_log, start: int | None = None):
    """Every record from ``start`` (default: the log start) to the log end."""
    offset = partition_log.log_start_offset if start is None else start
    records = []
    while offset < partition_log.log_end_offset:
        result = partition_log.read(offset, max_bytes=1 << 16)
        if not result.data.size:
            break
        records += decode_records(result.data, start_offset=offset)
        offset = result.next_offset
    return records


def abandon(partition_log) -> None:
    """Drop a log the way a killed process would: mappings released, nothing trimmed,
    flushed or checkpointed (the page cache keeps what was written, as after kill -9)."""
    for segment in partition_log._segments:
        segment.close()
    partition_log._segments.clear()
    partition_log._bases.clear()


def flip_bits(path, position: int, mask: int) -> None:
    """XOR the byte at ``position`` of the file at ``path`` with ``mask``."""
    with open(path, "r+b") as target:
        target.seek(position)
        byte = target.read(1)[0]
        target.seek(position)
        target.write(bytes([byte ^ mask]))


@contextlib.contextmanager
def small_tmpfs(mount_point, size: int):
    """A tmpfs of ``size`` bytes mounted at the (existing, empty) ``mount_point``,
    unmounted on exit; the test is skipped when mounting is not permitted (it needs
    root or CAP_SYS_ADMIN)."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): "
                    f"{mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_disk(disk, slack: int) -> str:
    """Write a ballast file on ``disk`` that leaves ``slack`` bytes free; its path."""
    path = os.path.join(disk, "ballast")
    status = os.statvfs(disk)
    size = max(status.f_bavail * status.f_frsize - slack, 0)
    with open(path, "wb") as ballast:
        chunk = bytes(1 << 20)
        while size > 0:
            size -= ballast.write(chunk[:min(size, len(chunk))])
    return path


def unlink_shared_memory(data_dir) -> list[str]:
    """Remove every /dev/shm object named under the broker prefix of ``data_dir`` (a
    test's clean-up after its brokers and producers); the names it found."""
    found = shared_memory.names(shared_memory_prefix(str(data_dir)))
    for name in found:
        shared_memory.unlink(name)
    return found


def ask(core, request_type: str, **fields) -> dict:
    """The reply to one request a ``BrokerCore`` answers at once (driven in-process,
    as ``serve`` drives it), decoded."""
    reply = core.handle("test", encode_request(request_type, **fields))
    assert reply is not None, f"{request_type} was not answered at once"
    return decode_reply(reply)


def nobody() -> tuple[int, int]:
    """The uid and gid of the user 'nobody' (another user for a test run as root);
    the test is skipped on a host without one."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this host has no user 'nobody'")
    return entry.pw_uid, entry.pw_gid


def read_partition(data_dir: str, topic: str, count: int, timeout_s: float,
                   partition: int = 0) -> list:
    """The first ``count`` records of a partition, read with shmlog's Consumer from
    the beginning (fewer if they do not all come within ``timeout_s``)."""
    import time

    from shmlog import Consumer
    from shmlog.client.consumer import TopicPartition
    consumer = Consumer(bootstrap=data_dir)
    records: list = []
    try:
        consumer.assign([TopicPartition(topic, partition)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records += batch
    finally:
        consumer.close()
    return records


def tls_and_users(directory, common_name: str, alt_names: str, user: str, password: str,
                  timeout_s: float):
    """(certificate, key, users file) made in ``directory`` for a secured listener: a
    self-signed EC certificate by the ``openssl`` command (``alt_names`` its
    subjectAltName, e.g. ``"IP:127.0.0.1"``) and a SASL credentials file holding
    ``user``; the key and the credentials private (0600). Skips the test when
    ``openssl`` is absent."""
    import shutil

    from shmlog.wire.credentials import user_entry
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificate")
    certificate, key = directory / "server.pem", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(certificate), "-days", "2", "-subj", f"/CN={common_name}", "-addext",
                    f"subjectAltName={alt_names}"],
                   check=True, capture_output=True, timeout=timeout_s)
    key.chmod(0o600)
    users = directory / "users.toml"
    users.write_text(user_entry(user, password, iterations=4096))
    users.chmod(0o600)
    return certificate, key, users


@contextlib.contextmanager
def kafka_broker_process(data_dir: str, **settings):
    """A broker process on ``data_dir`` serving Kafka on a free loopback port, with
    ``settings`` (BrokerConfig's); yields (data directory, "host:port"), and unlinks
    its shared memory once it stopped."""
    from shmlog.server.broker import Broker
    try:
        with Broker(data_dir, listeners="PLAINTEXT://127.0.0.1:0", **settings):
            yield data_dir, kafka_listener_address(data_dir)
    finally:
        unlink_shared_memory(data_dir)


def kafka_listener_address(data_dir) -> str:
    """host:port of a running broker's first Kafka listener, as ``shmlog status``
    shows it."""
    from shmlog.protocol.control_client import request
    return request(str(data_dir), "stats")["broker"]["kafka_listeners"][0]


class TransactionalCore:
    """A ``BrokerCore`` driven in-process (``handle``, ``drain``) with topic "out" of
    two partitions, and a ring in anonymous memory for transactional producers'
    batches: the transaction tests' world. ``settings`` are more broker settings."""

    def __init__(self, data_dir: str, **settings):
        self.data_dir, self.settings = data_dir, settings
        self.open()
        self.core.topics.create_topic("out", 2)

    def open(self) -> None:
        import mmap

        from shmlog.ring import Ring
        from shmlog.server.broker import BrokerConfig, BrokerCore
        from shmlog.shm import ring_layout as R
        self.core = BrokerCore(BrokerConfig(data_dir=self.data_dir,
                                            **{"offsets_topic_num_partitions": 1,
                                               **self.settings}))
        self.ring = Ring("test-ring", mmap.mmap(-1, R.DATA_OFFSET + (1 << 20)), owner=True)
        self.core.host.appender.add_ring(self.ring)
        self.sequences: dict = {}

    def restart(self) -> None:
        self.core.close()
        self.open()

    def ask(self, request_type: str, **fields) -> dict:
        return ask(self.core, request_type, **fields)

    def init(self, transactional_id: str, timeout_ms: int = 60_000) -> dict:
        """``init_transactions``: the producer's identity for the other requests."""
        producer = self.ask("init_transactions", transactional_id=transactional_id,
                            transaction_timeout_ms=timeout_ms)
        return {"transactional_id": transactional_id, **producer}

    def send(self, producer: dict, partition: int, values: list, *,
             timestamp_ms: int | None = None) -> int:
        """A transactional batch of ``producer`` to out-``partition`` through the ring,
        drained: its completion result."""
        key = (producer["producer_id"], partition)
        sequence = self.sequences.get(key, 0)
        self.sequences[key] = sequence + len(values)
        entry = self.ring.put(self.core.host.appender.destination("out", partition), encode_batch(
            values, producer_id=producer["producer_id"],
            producer_epoch=producer["producer_epoch"], base_sequence=sequence,
            transactional=True, timestamp_ms=timestamp_ms), timeout_ms=0)
        self.core.host.drain_soon()
        self.core.host.drain()
        return self.ring.result(entry)[0]

    def stable(self, partition: int) -> tuple[int, int]:
        """(high watermark, last stable offset) published for out-``partition``."""
        row = self.core.host.partition("out", partition).row
        snapshot = self.core.host.table.snapshot(row)
        return snapshot.high_watermark, snapshot.last_stable_offset

    def values(self, partition: int) -> list:
        return [record.value for record in all_records(
            self.core.host.partition("out", partition).log)]


class RestartableBroker:
    """The broker process of a data directory, killed with SIGKILL and started again
    (the nemesis tests')."""

    def __init__(self, data_dir: str, **settings):
        from shmlog.server.broker import Broker
        self.data_dir, self.settings = data_dir, settings
        self.broker = Broker(data_dir, **settings).start()

    def kill_and_start(self, wait_s: float = 60.0) -> None:
        self.kill(wait_s)
        self.start()

    def kill(self, wait_s: float = 60.0) -> None:
        import signal
        self.broker.process.send_signal(signal.SIGKILL)
        self.broker.process.wait(wait_s)
        self.broker.stop()

    def start(self) -> None:
        from shmlog.server.broker import Broker
        self.broker = Broker(self.data_dir, **self.settings).start()

    def stop(self) -> None:
        self.broker.stop()
