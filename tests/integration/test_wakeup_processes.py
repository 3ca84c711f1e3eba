"""Doorbells across processes: a sleeper is woken by every ring, none is lost, also
when it sleeps in a LoopSelector's select() with its relay watching the bell for it.

Method: two processes play ping-pong through a shared mapping. Each publishes the
next number in its own word, rings the other side's doorbell and sleeps on its
own until the answer comes. A lost wakeup (a ring that came between a sleeper's
look and its futex wait, and was missed) shows as a wait that runs to its timeout
of LOST_AFTER_S, which is ten thousand times longer than a wake-up takes; the
child counts those. The LoopSelector's test has the parent sleep as the broker's
loop does (its relay writes into a socket pair the select() watches), and a
descriptor it watches ends its sleep as a ring does.
Every wait is bounded; the child is always reaped.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

from shmlog.shm import shared_memory
from shmlog.shm.wakeup import Doorbell, LoopSelector

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


def _sleep_until(selector: LoopSelector, done) -> bool:
    """Sleep in the selector's select() until ``done()``, its relay passing the
    bell's rings on, as the broker's loop does; False if a sleep ran to
    LOST_AFTER_S."""
    while not done():
        started = time.monotonic()
        if selector.sleep(done, LOST_AFTER_S):
            return True
        if time.monotonic() - started >= LOST_AFTER_S and not done():
            return False                   # slept it out: the ring was not passed on
    return True


def test_a_loop_selector_wakes_for_every_ring(page):
    name, words = page
    mine = Doorbell(words, *PARENT_BELL)
    selector = LoopSelector(mine, "test-loop")

    def await_pong(number: int) -> None:
        assert _sleep_until(selector, lambda: words[PONG] >= number), \
            f"a ring was lost at ping {number}"

    try:
        _ping_pong(name, words, await_pong)
    finally:
        selector.close()
    assert words[PARENT_BELL[1]] == 0, "the loop got up after every sleep"


def test_a_loop_selector_wakes_for_a_watched_descriptor(page):
    _, words = page
    selector = LoopSelector(Doorbell(words, *PARENT_BELL), "test-loop")
    reader, writer = socket.socketpair()
    selector.watch(reader)
    try:
        threading.Timer(0.05, writer.send, (b"x",)).start()
        started = time.monotonic()
        selector.sleep(lambda: None, LOST_AFTER_S)
        assert time.monotonic() - started < LOST_AFTER_S, "slept through a ready descriptor"
        assert reader.recv(1) == b"x", "the owner's byte is left for the owner"
    finally:
        selector.close()
        reader.close()
        writer.close()


def test_a_wait_returns_what_the_attempt_found_without_sleeping(page):
    _, words = page
    bell = Doorbell(words, *PARENT_BELL)
    bell.ring()
    assert bell.wait(lambda: "work", 60.0) == "work"
    assert bell.wait(lambda: None, 0.0) is None
    assert words[PARENT_BELL[1]] == 0
    assert bell.sequence == 1
