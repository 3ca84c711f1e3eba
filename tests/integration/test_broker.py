"""A real broker process: topic administration over its control endpoint, bad
frames answered without harm, one broker per data directory, producers' rings
drained into the logs, dead producers reclaimed, and a graceful SIGTERM that
loses nothing a producer was told was appended.

Method: ``Broker`` runs ``python -m shmlog broker`` as a child process on a
temporary data directory; clients talk to it over ZeroMQ and shared memory as any
process on the host would. Every wait is bounded; brokers are always stopped and
the shared memory they and the test producers made is removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zmq

from helpers import all_records
from shmlog import LogManager
from shmlog.client.admin import Admin
from shmlog.common.errors import (
    InvalidConfigError,
    InvalidTopicError,
    LocalProtocolError,
    ShmlogError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from shmlog.protocol.control import decode_reply, encode_request
from shmlog.server.broker import Broker, control_address, shared_memory_prefix

DEADLINE_S = 60


def test_topic_administration(data_dir):
    with Broker(data_dir) as broker:
        admin = Admin(data_dir)
        created = admin.create_topic("events", 3, {"retention.ms": 60_000})
        assert [p["partition"] for p in created["partitions"]] == [0, 1, 2]
        assert admin.list_topics() == ["events"]
        with pytest.raises(TopicExistsError):
            admin.create_topic("events")
        with pytest.raises(InvalidTopicError):
            admin.create_topic("no spaces")
        with pytest.raises(InvalidConfigError):
            admin.create_topic("other", config={"segment.bytes": "many"})
        altered = admin.alter_topic_config("events", {"segment.ms": 1000}, ["retention.ms"])
        assert altered["config"]["segment.ms"] == 1000
        assert altered["config"]["retention.ms"] == 7 * 24 * 3600 * 1000
        assert len(admin.add_partitions("events", 5)["partitions"]) == 5
        admin.delete_topic("events")
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topic("events")
        assert broker.stop() == 0


def test_bad_frames_are_answered_and_the_broker_keeps_serving(data_dir):
    with Broker(data_dir):
        context = zmq.Context.instance()
        for frame in (b"\x00garbage", b"{}", b'{"version": 1, "type": "explode"}'):
            socket = context.socket(zmq.REQ)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(control_address(data_dir))
            socket.send(frame)
            assert socket.poll(10_000, zmq.POLLIN), "no reply"
            assert b'"ok": false' in socket.recv()
            socket.close()
        assert Admin(data_dir).list_topics() == []


def _peak_resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_a_multipart_request_gets_an_error_reply(data_dir):
    with Broker(data_dir):
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(control_address(data_dir))
        socket.send_multipart([encode_request("list_topics"), b"a second part"])
        assert socket.poll(10_000, zmq.POLLIN), "no reply to a multipart request"
        with pytest.raises(LocalProtocolError, match="one frame"):
            decode_reply(socket.recv())
        socket.close()
        assert Admin(data_dir).list_topics() == []


def test_an_oversized_frame_is_refused_unread_and_the_broker_serves_others(data_dir):
    size = 256 << 20
    with Broker(data_dir) as broker:
        Admin(data_dir).list_topics()
        peak_before = _peak_resident_bytes(broker.process.pid)
        socket = zmq.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(control_address(data_dir))
        socket.send(b" " * size)
        # The sender is disconnected: no reply ever comes to it.
        assert not socket.poll(2_000, zmq.POLLIN)
        socket.close()
        assert Admin(data_dir).list_topics() == []
        # Receiving the frame whole would have taken its size in memory at least.
        assert _peak_resident_bytes(broker.process.pid) - peak_before < size // 4


def test_a_data_directory_too_long_for_the_control_socket_is_refused_at_once(tmp_path):
    data_dir = tmp_path / "parent" / ("d" * 107)
    with pytest.raises(LocalProtocolError, match="choose a shorter data directory"):
        Broker(str(data_dir))
    assert not (tmp_path / "parent").exists()


def test_a_second_broker_on_the_same_directory_is_refused(data_dir):
    with Broker(data_dir):
        second = subprocess.run([sys.executable, "-m", "shmlog", "broker", "--data-dir",
                                 data_dir], capture_output=True, text=True, timeout=DEADLINE_S)
        assert second.returncode == 1
        assert "in use by another shmlog process" in second.stderr
        assert Admin(data_dir).list_topics() == []


def test_no_broker_is_a_clear_error(data_dir):
    with pytest.raises(ShmlogError, match="start one with: shmlog broker"):
        Admin(data_dir, timeout_ms=200).list_topics()


PRODUCER = textwrap.dedent("""
    import sys
    from shmlog.client.admin import Admin
    from shmlog.server.broker import request
    from shmlog.record.records import encode_batch
    from shmlog.ring import Ring
    from shmlog.shm.state import topic_key
    data_dir, ring_name, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ring = Ring.create(ring_name, 1 << 16)
    request(data_dir, "register_producer", ring=ring_name)
    topic = Admin(data_dir).describe_topic("t")
    destination = (topic["partitions"][0]["row"], topic_key(topic["topic_id"]), 0)
    for number in range(batches):
        entry = ring.put(destination, encode_batch([b"%d" % number]), timeout_ms=30_000)
    while ring.unacknowledged:
        pass
    assert ring.result(entry)[0] == batches - 1
    print("acknowledged", flush=True)
    sys.stdin.readline()
""")


def test_sigterm_drains_and_keeps_every_acknowledged_record(data_dir):
    ring_name = shared_memory_prefix(data_dir) + "-producer"
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t")
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, data_dir, ring_name,
                                     "500"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
        try:
            assert producer.stdout.readline().strip() == "acknowledged"
            assert broker.stop() == 0
        finally:
            producer.kill()
            producer.wait(timeout=DEADLINE_S)
            producer.stdin.close()
            producer.stdout.close()
    assert not os.path.exists("/dev/shm/" + shared_memory_prefix(data_dir) + "-state")
    with LogManager(data_dir) as logs:
        assert [r.value for r in all_records(logs.partition_log("t", 0))] == \
            [b"%d" % number for number in range(500)]


def test_topics_created_in_one_request_survive_a_kill_of_the_broker_and_take_records(
        data_dir):
    """create_topics returns once every topic is on disk: a broker killed right after
    (SIGKILL, nothing flushed or closed) comes back with them all; their partitions,
    never written (a directory each, no segment file), take records at once."""
    from shmlog import Consumer, Producer
    from shmlog.client.admin import NewTopic
    broker = Broker(data_dir).start()
    try:
        created = Admin(data_dir).create_topics([NewTopic(f"many-{index}", 3)
                                                 for index in range(40)])
        assert len(created) == 40
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait(timeout=DEADLINE_S)
    finally:
        broker.stop()
    directory = os.path.join(data_dir, "topics", "many-39", "2")
    assert os.listdir(directory) == [], "a partition never written is its directory alone"
    with Broker(data_dir):
        assert {f"many-{index}" for index in range(40)} <= set(Admin(data_dir).list_topics())
        with Producer(data_dir) as producer:
            assert producer.send("many-39", b"late", partition=2).get(timeout=DEADLINE_S) \
                .offset == 0
        with Consumer("many-39", bootstrap=data_dir, auto_offset_reset="earliest") as consumer:
            deadline, seen = time.monotonic() + DEADLINE_S, []
            while not seen and time.monotonic() < deadline:
                seen = [record.value for records in consumer.poll(timeout_ms=500).values()
                        for record in records]
        assert seen == [b"late"]


def test_a_dead_producers_ring_is_reclaimed(data_dir):
    ring_name = shared_memory_prefix(data_dir) + "-doomed"
    with Broker(data_dir, liveness_check_interval_ms=50):
        Admin(data_dir).create_topic("t")
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, data_dir, ring_name,
                                     "10"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
        try:
            assert producer.stdout.readline().strip() == "acknowledged"
            producer.send_signal(signal.SIGKILL)
            producer.wait(timeout=DEADLINE_S)
        finally:
            producer.kill()
            producer.stdin.close()
            producer.stdout.close()
        deadline = time.monotonic() + DEADLINE_S
        while os.path.exists("/dev/shm/" + ring_name):
            assert time.monotonic() < deadline, "the dead producer's ring was never reclaimed"
            time.sleep(0.05)


def test_register_producer_rejects_foreign_names(data_dir):
    from shmlog.server.broker import request
    with Broker(data_dir):
        with pytest.raises(LocalProtocolError, match="must be named under"):
            request(data_dir, "register_producer", ring="someone-elses-ring")


def test_the_topics_command(data_dir):
    def shmlog(*arguments):
        return subprocess.run([sys.executable, "-m", "shmlog", "topics", *arguments,
                               "--data-dir", data_dir], capture_output=True, text=True,
                              timeout=DEADLINE_S)

    with Broker(data_dir):
        created = shmlog("create", "logs", "--partitions", "2", "--config", "retention.ms=5000")
        assert created.returncode == 0, created.stderr
        assert "PartitionCount: 2" in created.stdout and "retention.ms=5000" in created.stdout
        assert shmlog("list").stdout.split() == ["logs"]
        assert shmlog("alter", "logs", "--partitions", "4").returncode == 0
        assert "PartitionCount: 4" in shmlog("describe", "logs").stdout
        refused = shmlog("create", "logs")
        assert refused.returncode == 1 and "already exists" in refused.stderr
        assert shmlog("describe").returncode == 2
        assert shmlog("delete", "logs").returncode == 0
        assert shmlog("list").stdout.strip() == ""


def test_the_produce_and_consume_commands(data_dir):
    def shmlog(*arguments, stdin=None):
        return subprocess.run([sys.executable, "-m", "shmlog", *arguments, "--data-dir",
                               data_dir], input=stdin, capture_output=True, text=True,
                              timeout=DEADLINE_S)

    with Broker(data_dir):
        Admin(data_dir).create_topic("lines", 2)
        produced = shmlog("produce", "lines", "--key-separator", ":",
                          stdin="a:first\nb:second\nno key here\n")
        assert produced.returncode == 0, produced.stderr
        assert "produced 3 records" in produced.stderr
        consumed = shmlog("consume", "lines", "--from-beginning", "--format", "key-value",
                          "--timeout-ms", "500")
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.splitlines()) == \
            ["a\tfirst", "b\tsecond", "null\tno key here"]
        one = shmlog("consume", "lines", "--from-beginning", "--max-messages", "1",
                     "--format", "json")
        assert len(one.stdout.splitlines()) == 1
        assert json.loads(one.stdout)["topic"] == "lines"
        missing = shmlog("consume", "nope", "--timeout-ms", "100")
        assert missing.returncode == 1 and "nope" in missing.stderr


def test_the_perf_commands(data_dir):
    def shmlog(*arguments):
        return subprocess.run([sys.executable, "-m", "shmlog", "perf", *arguments,
                               "--data-dir", data_dir, "--json"], capture_output=True,
                              text=True, timeout=DEADLINE_S)

    with Broker(data_dir):
        Admin(data_dir).create_topic("bench")
        produced = shmlog("produce", "bench", "--records", "3000", "--batch-records", "500")
        assert produced.returncode == 0, produced.stderr
        assert json.loads(produced.stdout)["records"] == 3000
        per_record = shmlog("produce", "bench", "--records", "1000")
        assert json.loads(per_record.stdout)["records_per_s"] > 0
        consumed = shmlog("consume", "bench", "--records", "4000", "--batch")
        assert json.loads(consumed.stdout)["records"] == 4000
        latency = shmlog("e2e", "bench", "--rate", "2000", "--seconds", "0.5")
        assert latency.returncode == 0, latency.stderr
        figures = json.loads(latency.stdout)
        assert figures["records"] == 1000 and 0 < figures["p50_us"] <= figures["p99_us"]


def test_sigquit_writes_every_thread_s_stack_and_the_broker_serves_on(tmp_path):
    output = tmp_path / "broker.out"
    with Broker(str(tmp_path / "data"), output=str(output)) as broker:
        broker.process.send_signal(signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while "most recent call first" not in output.read_text(errors="replace"):
            assert time.monotonic() < deadline, "no thread dump within 30 s"
            time.sleep(0.05)
        dump = output.read_text(errors="replace")
        assert "serve" in dump and dump.count("Thread 0x") >= 2, dump[-3000:]
        Admin(str(tmp_path / "data")).create_topic("after-the-dump")
        assert "after-the-dump" in Admin(str(tmp_path / "data")).list_topics()
