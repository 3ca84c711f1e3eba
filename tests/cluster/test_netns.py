"""Network namespaces for partition tests (shmlog/devtools/netns.py).

Goal: a cut made by ``Topology.cut`` looks like a real partition to TCP and to
ZeroMQ (packets dropped: timeouts, no errors), a heal restores it (connections
that outlived the cut resume), /dev/shm is one tmpfs for every namespace, and
nothing is left behind: teardown removes every namespace and every process in
them (also those it did not start), and the sweeper removes the namespaces of
dead test processes only.

Method: real namespaces, veths, a bridge and nftables rules (root only: skipped
with the reason otherwise); tiny Python servers and clients started in the
namespaces, each wait bounded; times are printed, never asserted.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from shmlog.devtools import netns

# A connect to a cut peer must time out well before this; an answer comes in ms.
CONNECT_TIMEOUT_S = 1.0
# How long a process in a namespace gets to say it is ready or to answer.
ANSWER_TIMEOUT_S = 30.0
# TCP retransmits back off (0.2 s, 0.4 s, ... doubling): a request sent during a
# ~1 s cut is retransmitted within a few seconds of the heal.
RESUME_TIMEOUT_MS = 20_000
CUT_WAIT_MS = 1_000
PORT = 17_001

TCP_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"ok")
    connection.close()
"""
TCP_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print(s.recv(2).decode())
except socket.timeout:
    print("timeout")
except OSError as error:
    print("error", error)
"""
ZMQ_SERVER = """
import sys, zmq
socket = zmq.Context().socket(zmq.REP)
socket.bind(sys.argv[1])
print("listening", flush=True)
while True:
    socket.send(b"re:" + socket.recv())
"""
# Line commands: "ask <text> <timeout_ms>" sends and waits; "wait <timeout_ms>" waits
# again for the reply still due. Each answers "reply <text>" or "timeout".
ZMQ_CLIENT = """
import sys, zmq
socket = zmq.Context().socket(zmq.REQ)
socket.setsockopt(zmq.LINGER, 0)
socket.connect(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    command, *arguments = line.split()
    if command == "ask":
        socket.send(arguments[0].encode())
    if socket.poll(int(arguments[-1])):
        print("reply", socket.recv().decode(), flush=True)
    else:
        print("timeout", flush=True)
"""


def python(topology, member, script, *arguments, **popen_kwargs):
    return topology.run_in(member, [sys.executable, "-c", script, *map(str, arguments)],
                           stdout=subprocess.PIPE, text=True, **popen_kwargs)


def readline(process, timeout_s=ANSWER_TIMEOUT_S) -> str:
    """The next line of ``process``'s stdout, waiting at most ``timeout_s``."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"no line from {process.args} within {timeout_s} s"
    return process.stdout.readline().strip()


def connect(topology, member, peer) -> str:
    client = python(topology, member, TCP_CLIENT, topology.address(peer), PORT, CONNECT_TIMEOUT_S)
    output, _ = client.communicate(timeout=ANSWER_TIMEOUT_S)
    return output.strip()


def test_tcp_connects_times_out_while_cut_and_works_after_heal(topology):
    server = python(topology, "b1", TCP_SERVER, topology.address("b1"), PORT)
    assert readline(server) == "listening"
    assert connect(topology, "b2", "b1") == "ok"
    topology.cut("b1", ["b2"])
    assert "10.213.0.2" in topology.cut_rules("b1")
    started = time.monotonic()
    assert connect(topology, "b2", "b1") == "timeout"      # dropped: no RST, no refusal
    print(f"connect to a cut peer: timeout after {time.monotonic() - started:.2f} s")
    assert connect(topology, "b3", "b1") == "ok"           # only b2 is cut off
    topology.heal("b1")
    assert topology.cut_rules("b1") == ""
    assert connect(topology, "b2", "b1") == "ok"


def test_a_cut_by_address_from_the_peers_side(topology):
    server = python(topology, "b1", TCP_SERVER, topology.address("b1"), PORT)
    assert readline(server) == "listening"
    topology.cut("b2", [topology.address("b1")])
    assert connect(topology, "b2", "b1") == "timeout"
    topology.heal("b2")
    topology.heal("b2")                                    # healing twice is harmless
    assert connect(topology, "b2", "b1") == "ok"


def test_zeromq_requests_get_no_reply_while_cut_and_resume_after_heal(topology):
    endpoint = f"tcp://{topology.address('b1')}:{PORT}"
    server = python(topology, "b1", ZMQ_SERVER, endpoint)
    assert readline(server) == "listening"
    client = python(topology, "b2", ZMQ_CLIENT, endpoint, stdin=subprocess.PIPE)
    assert readline(client) == "ready"

    def command(line):
        client.stdin.write(line + "\n")
        client.stdin.flush()
        return readline(client)

    assert command(f"ask one {RESUME_TIMEOUT_MS}") == "reply re:one"
    topology.cut("b2", ["b1"])
    assert command(f"ask two {CUT_WAIT_MS}") == "timeout"
    assert command(f"wait {CUT_WAIT_MS}") == "timeout"
    topology.heal("b2")
    started = time.monotonic()
    assert command(f"wait {RESUME_TIMEOUT_MS}") == "reply re:two"   # retransmitted
    print(f"the reply held up by the cut came {time.monotonic() - started:.2f} s after heal")
    assert command(f"ask three {RESUME_TIMEOUT_MS}") == "reply re:three"
    client.stdin.close()


def test_dev_shm_is_shared_by_every_namespace(topology):
    name = f"/dev/shm/shmlog-netns-test-{os.getpid()}"
    script = ("import os, sys; open(sys.argv[1], 'w').write('from b1'); "
              "print(os.stat('/dev/shm').st_dev, os.readlink('/proc/self/ns/net'))")
    try:
        writer = python(topology, "b1", script, name)
        device, network = writer.communicate(timeout=ANSWER_TIMEOUT_S)[0].split()
        reader = python(topology, "b2", "import sys; print(open(sys.argv[1]).read())", name)
        assert reader.communicate(timeout=ANSWER_TIMEOUT_S)[0].strip() == "from b1"
        with open(name) as written:
            assert written.read() == "from b1"              # and from the host
        assert int(device) == os.stat("/dev/shm").st_dev    # one tmpfs
        assert network != os.readlink("/proc/self/ns/net")  # another network
    finally:
        if os.path.exists(name):
            os.unlink(name)


def test_teardown_stops_processes_and_leaves_no_namespace(netns_unavailable_reason):
    if netns_unavailable_reason:
        pytest.skip(netns_unavailable_reason)
    topology = netns.Topology(["b1", "b2"], prefix=f"shmlog-{os.getpid()}-teardown")
    topology.create()
    names = [topology.hub] + [topology.namespace(member) for member in topology.members]
    assert set(names) <= set(netns.list_namespaces())
    sleeper = topology.run_in("b1", ["sleep", "600"])
    topology.teardown()
    assert sleeper.returncode is not None
    assert not set(names) & set(netns.list_namespaces())
    topology.teardown()                                    # twice is harmless


def exited(pid: int) -> bool:
    """Gone, or a zombie (its parent, maybe not us, has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_teardown_stops_processes_it_did_not_start_in_its_namespaces(netns_unavailable_reason):
    # A broker's or a Spark worker's children, or those of a program killed before
    # its cleanup: started in a member, children of no process of ours.
    if netns_unavailable_reason:
        pytest.skip(netns_unavailable_reason)
    topology = netns.Topology(["b1"], prefix=f"shmlog-{os.getpid()}-orphans")
    topology.create()
    try:
        starter = subprocess.Popen([*topology.launch_prefix("b1"), "sh", "-c",
                                    "sleep 600 > /dev/null 2>&1 & echo $!"],
                                   stdout=subprocess.PIPE, text=True)
        orphan = int(starter.communicate(timeout=ANSWER_TIMEOUT_S)[0])
        assert netns.namespace_pids(topology.namespace("b1")) == [orphan]
        assert not exited(orphan)
    finally:
        topology.teardown()
    assert exited(orphan)


def test_a_failed_create_removes_what_it_made(netns_unavailable_reason):
    if netns_unavailable_reason:
        pytest.skip(netns_unavailable_reason)
    topology = netns.Topology(["b1"], prefix=f"shmlog-{os.getpid()}-failed")
    clash = topology.namespace("b1")
    subprocess.run(["ip", "netns", "add", clash], check=True, timeout=30)
    try:
        with pytest.raises(netns.NetnsError, match="ip netns add"):
            topology.create()
        assert topology.hub not in netns.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", clash], check=True, timeout=30)


def test_the_sweeper_removes_only_dead_processes_namespaces(netns_unavailable_reason):
    if netns_unavailable_reason:
        pytest.skip(netns_unavailable_reason)
    finished = subprocess.Popen(["true"])
    finished.wait(timeout=30)
    dead, alive = f"shmlog-{finished.pid}-b1", f"shmlog-{os.getpid()}-sweep"
    for name in (dead, alive):
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        assert dead in netns.sweep_dead_namespaces()
        remaining = netns.list_namespaces()
        assert dead not in remaining
        assert alive in remaining
    finally:
        for name in (dead, alive):
            if name in netns.list_namespaces():
                subprocess.run(["ip", "netns", "delete", name], check=True, timeout=30)


def test_names_and_addresses():
    topology = netns.Topology(prefix="shmlog-1-x", network="192.168.7.0/24")
    assert topology.namespace("zk") == "shmlog-1-x-zk"
    assert [topology.address(member) for member in topology.members] == \
        ["192.168.7.1", "192.168.7.2", "192.168.7.3", "192.168.7.4"]
    with pytest.raises(ValueError, match="member name"):
        netns.Topology(["Broker_1"])
    with pytest.raises(ValueError, match="distinct"):
        netns.Topology(["b1", "b1"])
    with pytest.raises(ValueError, match="prefix"):
        netns.Topology(prefix="other")
    with pytest.raises(KeyError):
        topology.address("b9")


# A kazoo client that prints each session state it goes through ("<STATE> <session
# id> <seconds since start>"), until its stdin closes.
KAZOO_CLIENT = """
import sys, time
from kazoo.client import KazooClient
started = time.monotonic()
client = KazooClient(hosts=sys.argv[1], timeout=float(sys.argv[2]))
def report(state):
    print(state, client.client_id[0] if client.client_id else 0,
          f"{time.monotonic() - started:.3f}", flush=True)
client.add_listener(report)
client.start(timeout=30)              # the listener reports CONNECTED
sys.stdin.read()
client.stop()
"""
ZOOKEEPER_START_TIMEOUT_S = 120.0
SESSION_TIMEOUT_S = 4.0
# Longer than the session timeout: ZooKeeper expires the cut client's session.
LONG_CUT_S = SESSION_TIMEOUT_S + 2.0


def test_kazoo_goes_suspended_when_cut_from_zookeeper_and_learns_of_expiry_on_heal(
        topology, tmp_path):
    # Design risk 8: a drop cut must look like a partition to kazoo too. ZooKeeper
    # runs in zk (tickTime 500 ms: sessions of 1..10 s), the client in b1.
    connect = f"{topology.address('zk')}:2181"
    server = topology.run_in("zk", [sys.executable, "-m", "shmlog", "zookeeper", "--data-dir",
                                    str(tmp_path / "zk"), "--host", topology.address("zk"),
                                    "--port", "2181", "--tick-time-ms", "500"],
                             stdout=subprocess.PIPE, text=True)
    assert readline(server, ZOOKEEPER_START_TIMEOUT_S).startswith("ZooKeeper serves")
    client = python(topology, "b1", KAZOO_CLIENT, connect, SESSION_TIMEOUT_S,
                    stdin=subprocess.PIPE)

    def next_state():
        state, session, at = readline(client).split()
        return state, session, float(at)

    state, first_session, _ = next_state()
    assert state == "CONNECTED"
    # A short cut: SUSPENDED (no read for 2/3 of the session), then back on heal.
    topology.cut("b1", ["zk"])
    cut_at = time.monotonic()
    assert next_state()[0] == "SUSPENDED"
    print(f"SUSPENDED {time.monotonic() - cut_at:.2f} s after the cut "
          f"(session timeout {SESSION_TIMEOUT_S} s)")
    topology.heal("b1")
    states = [next_state()]
    if states[-1][0] == "LOST":                     # reconnecting took past the expiry
        states.append(next_state())
    assert states[-1][0] == "CONNECTED"
    print(f"after a short cut: {[state for state, _, _ in states]}, same session: "
          f"{states[-1][1] == first_session}")
    # A long cut: the server expires the session meanwhile; the client only learns
    # it when it reaches the server again (LOST), then starts a new session.
    session = states[-1][1]
    topology.cut("b1", ["zk"])
    assert next_state()[0] == "SUSPENDED"
    time.sleep(LONG_CUT_S)
    topology.heal("b1")
    state, _, _ = next_state()
    assert state == "LOST"
    state, new_session, _ = next_state()
    assert state == "CONNECTED" and new_session != session
    client.stdin.close()


def test_the_reasons_to_skip(monkeypatch):
    # The machine is what it is: a user without root, and a host without nft, are
    # stood in for by what the checks read.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.unavailable_reason() == "network namespaces need root"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(netns.shutil, "which", lambda name, path=None: None)
    assert netns.unavailable_reason() == "ip is not installed (apt-get install iproute2)"
