"""``cluster.zk.session.PollHandler``: kazoo's wait as one ``poll(2)``, answering as
kazoo's own ``selector_select`` does (real sockets, no ZooKeeper)."""

from __future__ import annotations

import socket

import pytest

from shmlog.cluster.zk.session import PollHandler


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def test_nothing_to_read_waits_out_the_timeout(pair):
    left, _ = pair
    assert PollHandler().select([left], [], [], 0.01) == ([], [], [])


def test_a_socket_with_data_is_readable(pair):
    left, right = pair
    right.sendall(b"x")
    assert PollHandler().select([left], [], [], 0) == ([left], [], [])
    assert PollHandler().select([left.fileno()], [], [], 0) == ([left.fileno()], [], [])


def test_a_socket_with_room_is_writable(pair):
    left, _ = pair
    assert PollHandler().select([], [left], [], 0) == ([], [left], [])


def test_ready_both_ways_it_is_listed_as_readable_only_as_kazoo_does(pair):
    left, right = pair
    right.sendall(b"x")
    assert PollHandler().select([left], [left], [], 0) == ([left], [], [])


def test_a_hang_up_is_readable_so_the_read_sees_it(pair):
    left, right = pair
    right.close()
    readable, _, _ = PollHandler().select([left], [], [], 0)
    assert readable == [left]
    assert left.recv(1) == b""


def test_a_negative_timeout_is_refused(pair):
    left, _ = pair
    with pytest.raises(ValueError):
        PollHandler().select([left], [], [], -1)
