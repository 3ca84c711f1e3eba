"""The replication sockets survive a peer that leaves while their receive queue is full.

Goal: the nemesis (tests/cluster/test_nemesis.py) saw a broker abort with libzmq's
``Assertion failed: !_io_error (src/stream_engine_base.cpp:310)``: a broker too slow
to drain its replication socket (a loaded machine, or just resumed from SIGSTOP)
whose peers gave up on it and reconnected. libzmq 4.3.5 marks such a connection's
I/O error and waits for the full queue to drain before closing it, but a ZMTP
heartbeat that comes due meanwhile writes to it and trips the assertion. The
sockets ``zmq_replication.configure_socket`` makes use no ZMTP heartbeats (the
kernel's keepalive notices dead peers), so the same sequence must leave them alive.

Method: a child process (an abort must not take pytest with it) binds a real
ROUTER, with a receive queue of 4 messages that it never reads, and a DEALER sends
it 200 large messages, then closes; the child waits past several heartbeat
intervals and says so. Once with ZMTP heartbeats set (the control: with libzmq
4.3.5 the child dies of SIGABRT, which shows the sequence reaches the bug), once
with ``configure_socket``: the child must survive.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

CHILD_TIMEOUT_S = 60
CHILD = textwrap.dedent("""
    import sys, time, zmq
    from shmlog.zmq_replication import configure_socket
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    if sys.argv[1] == "heartbeats":
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.HEARTBEAT_IVL, 200)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 600)
    else:
        configure_socket(router)
    router.setsockopt(zmq.RCVHWM, 4)           # full at once: the engine stops reading
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, 1000)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(200):
        dealer.send(b"x" * 100_000)
    time.sleep(1.0)
    dealer.close()                              # the peer leaves: its connection fails
    time.sleep(2.0)                             # ten heartbeat intervals of the control
    print("alive", flush=True)
    router.close()
    context.term()
""")


def run_child(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)


def test_replication_sockets_survive_a_peer_leaving_while_their_queue_is_full():
    control = run_child("heartbeats")
    print(f"with ZMTP heartbeats: exit status {control.returncode} {control.stderr.strip()}")
    if control.returncode != 0:              # libzmq 4.3.5: the scenario reaches the bug
        assert control.returncode == -signal.SIGABRT, control.stderr
        assert "_io_error" in control.stderr
    done = run_child("replication")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"
