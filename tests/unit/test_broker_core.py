"""The broker's loop in-process (``BrokerCore``, no socket): a busy loop does not
expire group members whose heartbeats are waiting to be answered; the warm-up
(``warm_kernels``) leaves nothing behind, and one that fails is logged, not raised.

Method: a ``BrokerCore`` on a temporary data directory, driven as ``serve`` drives
it (``handle`` a request frame, ``run_once`` for the drain and the timers,
``take_replies`` for the join that waits for its rebalance). A sleep past the
session timeout stands in for a loop held up by a long request; the test asserts
on group membership, never on time. The core is closed and its shared memory
removed.
"""

from __future__ import annotations

import logging
import os
import resource
import time

import pytest

from helpers import ask
from shmlog.common.errors import TooManyProducersError
from shmlog.common.paths import shared_memory_prefix
from shmlog.protocol.control import decode_reply, encode_request
from shmlog.ring import Ring
from shmlog.server.broker import WARM_UP_DIRECTORY, BrokerConfig, BrokerCore, warm_kernels
from shmlog.shm import shared_memory

SESSION_TIMEOUT_MS = 200


@pytest.fixture
def core(data_dir):
    core = BrokerCore(BrokerConfig(data_dir=data_dir, group_initial_rebalance_delay_ms=0,
                                   group_min_session_timeout_ms=SESSION_TIMEOUT_MS))
    try:
        core.topics.create_topic("events", 2)
        # The first turn loads the drain's kernels (seconds on a cold numba cache):
        # done before a session starts, so no member is expired by a compile.
        core.run_once()
        yield core
    finally:
        core.close()


def join(core) -> tuple[str, int]:
    """A member of group "g": its id and generation."""
    assert core.handle("joiner", encode_request(
        "join_group", group_id="g", member_id="member-1", client_id="test",
        topics=["events"], session_timeout_ms=SESSION_TIMEOUT_MS)) is None
    core.run_once()                                     # the rebalance completes
    replies = dict(core.take_replies())
    joined = decode_reply(replies["joiner"])
    return joined["member_id"], joined["generation"]


def members(core) -> list[str]:
    return [member["member_id"] for member in ask(core, "describe_group", group_id="g")["members"]]


def test_a_heartbeat_waiting_to_be_answered_keeps_its_member_in_the_group(core):
    member_id, generation = join(core)
    time.sleep(2 * SESSION_TIMEOUT_MS / 1000)           # the loop was busy elsewhere
    core.run_once(requests_waiting=True)                # the heartbeat came meanwhile
    assert members(core) == [member_id]
    ask(core, "heartbeat", group_id="g", member_id=member_id, generation=generation)
    core.run_once()
    assert members(core) == [member_id]


def test_a_member_that_sent_nothing_is_expired(core):
    join(core)
    time.sleep(2 * SESSION_TIMEOUT_MS / 1000)
    core.run_once()
    assert members(core) == []


def test_the_warm_up_leaves_nothing_behind(data_dir):
    scratch = os.path.join(data_dir, WARM_UP_DIRECTORY)
    os.makedirs(os.path.join(scratch, "topics", "left-by-a-killed-broker"))
    warm_kernels(BrokerConfig(data_dir=data_dir))
    assert os.listdir(data_dir) == []
    assert shared_memory.names(shared_memory_prefix(scratch)) == []


def test_a_warm_up_that_fails_is_logged_and_not_raised(data_dir, caplog):
    os.makedirs(data_dir)
    # A file where the scratch directory goes: its broker cannot be made (as on a full disk).
    open(os.path.join(data_dir, WARM_UP_DIRECTORY), "w").close()
    with caplog.at_level(logging.WARNING, logger="shmlog.broker"):
        warm_kernels(BrokerConfig(data_dir=data_dir))
    assert "were not all loaded ahead" in caplog.text



def fill_descriptors() -> list[int]:
    """Open /dev/null until the open files limit is reached: those descriptors."""
    opened = []
    while True:
        try:
            opened.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            return opened


def test_a_producer_past_a_limit_is_refused_naming_it(data_dir):
    """Past producers_max, and past the broker's open files (a mapped ring keeps a
    descriptor), a producer's registration is a TooManyProducersError naming the
    limit; a slot freed by a producer that left is taken by the next."""
    core = BrokerCore(BrokerConfig(data_dir=data_dir, producers_max=2))
    prefix = shared_memory_prefix(data_dir)
    rings = [Ring.create(f"{prefix}-producer-{os.getpid()}-{number}", 4096)
             for number in range(4)]
    try:
        for ring in rings[:2]:
            ask(core, "register_producer", ring=ring.name)
        with pytest.raises(TooManyProducersError, match=r"producers_max \(2\)"):
            ask(core, "register_producer", ring=rings[2].name)
        ask(core, "unregister_producer", ring=rings[0].name)
        ask(core, "register_producer", ring=rings[2].name)
        core.producers.producers_max = len(rings)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fillers = []
        try:
            # One descriptor left: the ring's shm_open takes it, its mapping's dup fails.
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (max(map(int, os.listdir("/proc/self/fd"))) + 1, hard))
            fillers += fill_descriptors()
            os.close(fillers.pop())
            with pytest.raises(TooManyProducersError, match="RLIMIT_NOFILE"):
                ask(core, "register_producer", ring=rings[3].name)
        finally:
            for descriptor in fillers:
                os.close(descriptor)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        ask(core, "register_producer", ring=rings[3].name)
    finally:
        core.close()
        for ring in rings:
            ring.close()
            ring.unlink()
