"""Doorbells across processes: a sleeper is woken by every ring, none is lost, also
when it sleeps in select() with a DoorbellRelay watching the bell for it.

Method: two processes play ping-pong through a shared mapping. Each publishes the
next number in its own word, rings the other side's doorbell and sleeps on its
own until the answer comes. A lost wakeup (a ring that came between a sleeper's
look and its futex wait, and was missed) shows as a wait that runs to its timeout
of LOST_AFTER_S, which is ten thousand times longer than a wake-up takes; the
child counts those. The relay's test has the parent sleep as the Kafka listener's
loop does: lie down, arm the relay, select() on a socket pair the relay writes to.
Every wait is bounded; the child is always reaped.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from shmlog.shm import shared_memory
from shmlog.shm.wakeup import Doorbell, DoorbellRelay

ROUNDS = 3000
LOST_AFTER_S = 5.0
# Words of the shared page (one cache line apart): the two counters, then the
# sequence and sleepers words of the doorbell each side sleeps on.
PING, PONG = 0, 8
PARENT_BELL, CHILD_BELL = (16, 24), (32, 40)

PLAYER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from shmlog.shm import shared_memory
    from shmlog.shm.wakeup import Doorbell
    name, rounds, lost_after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    words = np.frombuffer(shared_memory.attach(name, 4096, "test page"), np.int64)
    mine, theirs = Doorbell(words, 32, 40), Doorbell(words, 16, 24)
    lost = 0
    for number in range(1, rounds + 1):
        while words[0] < number:                     # wait for ping `number`
            started = time.monotonic()
            mine.wait(lambda: words[0] >= number, lost_after)
            lost += words[0] < number and time.monotonic() - started >= lost_after
        words[8] = number                           # pong
        theirs.ring()
    print(lost, flush=True)
""")


@pytest.fixture
def page():
    name = f"shmlog-test-bell-{uuid.uuid4().hex[:8]}"
    mapped = shared_memory.create(name, 4096, "test page")
    yield name, np.frombuffer(mapped, np.int64)
    shared_memory.unlink(name)


def _ping_pong(name: str, words, await_pong) -> None:
    """Play ROUNDS of ping-pong with a child PLAYER; ``await_pong(number)`` waits for
    the child's answer to ping ``number`` as the test's sleeper sleeps."""
    theirs = Doorbell(words, *CHILD_BELL)
    child = subprocess.Popen([sys.executable, "-c", PLAYER, name, str(ROUNDS), str(LOST_AFTER_S)],
                             stdout=subprocess.PIPE)
    try:
        for number in range(1, ROUNDS + 1):
            words[PING] = number
            theirs.ring()
            await_pong(number)
            assert words[PONG] == number, f"no pong for ping {number}"
        lost = int(child.communicate(timeout=60)[0])
    finally:
        child.kill()
        child.wait(timeout=30)
    assert lost == 0, f"{lost} wakeups were lost"


def test_no_ring_is_lost_between_two_processes(page):
    name, words = page
    mine = Doorbell(words, *PARENT_BELL)

    def await_pong(number: int) -> None:
        for _ in range(1000):
            if words[PONG] >= number:
                return
            mine.wait(lambda: words[PONG] >= number, LOST_AFTER_S)

    _ping_pong(name, words, await_pong)
    assert words[PARENT_BELL[0]] == words[CHILD_BELL[0]] == ROUNDS, "every ring is counted"
    assert words[PARENT_BELL[1]] == words[CHILD_BELL[1]] == 0, "every sleeper got up"


def _select_until(bell: Doorbell, relay: DoorbellRelay, reader: socket.socket, done) -> bool:
    """Sleep in select() until ``done()``, the relay passing the bell's rings on, as
    KafkaSocketServer.sleep does; False if a sleep ran to LOST_AFTER_S."""
    while not done():
        seen = bell.lie_down()
        try:
            if done():
                return True
            relay.arm(seen)
            started = time.monotonic()
            readable = select.select([reader], [], [], LOST_AFTER_S)[0]
            relay.disarm()
        finally:
            bell.get_up()
        if readable:
            reader.recv(4096)
        elif time.monotonic() - started >= LOST_AFTER_S:
            return False                   # slept it out: the ring was not passed on
    return True


def test_a_relay_wakes_a_select_for_every_ring(page):
    name, words = page
    mine = Doorbell(words, *PARENT_BELL)
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    relay = DoorbellRelay(mine, lambda: writer.send(b"\0"), "test-relay")
    relay.start()

    def await_pong(number: int) -> None:
        assert _select_until(mine, relay, reader, lambda: words[PONG] >= number), \
            f"a ring was lost at ping {number}"

    try:
        _ping_pong(name, words, await_pong)
    finally:
        relay.stop()
        reader.close()
        writer.close()
    assert words[PARENT_BELL[1]] == 0, "the loop got up after every sleep"


def test_a_wait_returns_what_the_attempt_found_without_sleeping(page):
    _, words = page
    bell = Doorbell(words, *PARENT_BELL)
    bell.ring()
    assert bell.wait(lambda: "work", 60.0) == "work"
    assert bell.wait(lambda: None, 0.0) is None
    assert words[PARENT_BELL[1]] == 0
    assert bell.sequence == 1
