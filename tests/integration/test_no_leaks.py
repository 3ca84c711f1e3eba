"""Nothing a broker or its producers leave behind outlives them: the broker unmaps
the ring of every producer that left, reuses the slots of its ring table, reclaims
the rings of producers that died while it was down (or that never came back after
it restarted), keeps the ring of a live producer that has not registered yet, and
removes its control socket when it stops cleanly.

Method: real brokers (``shmlog.Broker`` child processes) and real producer
processes, killed with SIGKILL where a producer must die without closing. What the
broker maps is read from ``/proc/<broker pid>/maps``; what is left is read from
/dev/shm and the data directory. Every wait is bounded; processes are stopped and
the shared memory removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.ring import Ring
from shmlog.server.broker import Broker, request, shared_memory_prefix
from shmlog.shm import ring_layout as R

DEADLINE_S = 60
SHM = "/dev/shm"
RING_SIZE = 1 << 16


def _mapped_rings(broker: Broker) -> set[str]:
    """The producer rings the broker process maps (removed from /dev/shm or not)."""
    prefix = f"{SHM}/{shared_memory_prefix(broker.data_dir)}-"
    with open(f"/proc/{broker.process.pid}/maps") as maps:
        return {line.split()[5] for line in maps
                if prefix in line and not line.split()[5].endswith(("-state", "-state-bells"))}


def _wait_until_gone(path: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} was never reclaimed"
        time.sleep(0.05)


def test_the_rings_of_producers_that_left_are_unmapped(data_dir):
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t")
        for number in range(20):
            with Producer(data_dir, ring_size=RING_SIZE) as producer:
                producer.send("t", b"%d" % number).get(timeout=DEADLINE_S)
                assert _mapped_rings(broker) == {f"{SHM}/{producer.ring.name}"}
            assert _mapped_rings(broker) == set()
        assert broker.stop() == 0


def test_the_ring_table_reuses_the_slots_of_rings_that_left(data_dir):
    prefix = shared_memory_prefix(data_dir)
    with Broker(data_dir) as broker:
        with Ring.create(f"{prefix}-staying", RING_SIZE) as staying:
            assert request(data_dir, "register_producer", ring=staying.name)["index"] == 0
            indexes = []
            for number in range(5):
                with Ring.create(f"{prefix}-passing-{number}", RING_SIZE) as passing:
                    indexes.append(request(data_dir, "register_producer",
                                           ring=passing.name)["index"])
                    request(data_dir, "unregister_producer", ring=passing.name)
                    passing.unlink()
            assert indexes == [1] * 5
            request(data_dir, "unregister_producer", ring=staying.name)
            staying.unlink()
        assert broker.stop() == 0


PRODUCER = textwrap.dedent("""
    import sys
    from shmlog.client.producer import Producer
    producer = Producer(sys.argv[1], ring_size=1 << 16)
    producer.send("t", b"sent").get(timeout=60)
    print(producer.ring.name, flush=True)
    sys.stdin.readline()
""")


def _start_producer(data_dir: str):
    """A producer process that sent one record and now idles: (process, ring path)."""
    process = subprocess.Popen([sys.executable, "-c", PRODUCER, data_dir],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ring_name = process.stdout.readline().strip()
    assert ring_name, "the producer did not start"
    return process, f"{SHM}/{ring_name}"


def _kill(process) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=DEADLINE_S)
    process.stdin.close()
    process.stdout.close()


def test_a_producer_killed_while_the_broker_was_down_leaves_no_ring(data_dir):
    with Broker(data_dir) as broker:
        Admin(data_dir).create_topic("t")
        producer, ring_path = _start_producer(data_dir)
        assert broker.stop() == 0
    try:
        _kill(producer)
        assert os.path.exists(ring_path)             # nobody was there to reclaim it
        with Broker(data_dir) as broker:
            _wait_until_gone(ring_path)
            assert broker.stop() == 0
    finally:
        producer.kill()


def test_a_producer_that_never_came_back_after_a_restart_leaves_no_ring(data_dir):
    with Broker(data_dir, liveness_check_interval_ms=50) as broker:
        Admin(data_dir).create_topic("t")
        producer, ring_path = _start_producer(data_dir)
        assert broker.stop() == 0
    try:
        with Broker(data_dir, liveness_check_interval_ms=50) as broker:
            assert os.path.exists(ring_path)         # its producer is alive, idle
            _kill(producer)
            _wait_until_gone(ring_path)
            assert broker.stop() == 0
    finally:
        producer.kill()


def test_a_running_broker_reclaims_unregistered_rings_of_dead_processes_only(data_dir):
    prefix = shared_memory_prefix(data_dir)
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=DEADLINE_S)
    with Broker(data_dir, liveness_check_interval_ms=50) as broker:
        # Made by this (live) process, not registered yet: a producer starting up.
        with Ring.create(f"{prefix}-starting", RING_SIZE) as starting, \
                Ring.create(f"{prefix}-orphan", RING_SIZE) as orphan:
            orphan.words[R.PRODUCER_PID_WORD] = dead.pid    # its maker died
            _wait_until_gone(f"{SHM}/{orphan.name}")
            assert os.path.exists(f"{SHM}/{starting.name}")
            assert request(data_dir, "register_producer", ring=starting.name)["index"] >= 0
            request(data_dir, "unregister_producer", ring=starting.name)
            starting.unlink()
        assert broker.stop() == 0


@pytest.mark.parametrize("pid", [1 << 40, -1, 1 << 31])
def test_a_producer_that_writes_a_bad_pid_into_its_ring_loses_its_ring_not_the_broker(
        data_dir, pid):
    """The ring's pid word is the producer's to write: a value no process can have
    (above the kernel's pid limit, past what kill(2) takes, or negative, which
    kill(2) reads as a process group) makes the broker treat the producer as gone
    and reclaim its ring, never crash or keep the ring (issue 27, row 1)."""
    with Broker(data_dir, liveness_check_interval_ms=50) as broker:
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, ring_size=RING_SIZE) as honest, \
                Producer(data_dir, ring_size=RING_SIZE) as scribbler:
            scribbler.send("t", b"before").get(timeout=DEADLINE_S)
            scribbler.ring.words[R.PRODUCER_PID_WORD] = pid
            _wait_until_gone(f"{SHM}/{scribbler.ring.name}")
            assert broker.process.poll() is None
            honest.send("t", b"after").get(timeout=DEADLINE_S)
        assert broker.stop() == 0


def test_a_clean_stop_removes_the_control_socket(data_dir):
    run_directory = os.path.join(data_dir, "run")
    with Broker(data_dir) as broker:
        assert os.path.exists(os.path.join(run_directory, "control.sock"))
        assert broker.stop() == 0
    assert not os.path.exists(run_directory)


def test_a_ring_of_another_user_under_our_prefix_is_not_adopted(data_dir):
    """Only the broker's user (or its data_group) produces here: another user's object
    under the broker's prefix is neither mapped nor trusted, whatever pid it claims."""
    if os.geteuid() != 0:
        pytest.skip("making an object as another user (nobody) needs root")
    name = f"{shared_memory_prefix(data_dir)}-planted"
    with Ring.create(name, RING_SIZE) as planted:
        planted.words[R.PRODUCER_PID_WORD] = 1            # a pid that is always alive
    os.chown(f"{SHM}/{name}", 65534, 65534)
    with Broker(data_dir) as broker:
        assert _mapped_rings(broker) == set()
        assert broker.stop() == 0
