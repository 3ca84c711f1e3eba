"""Network namespaces: a private LAN of "hosts" on one machine, for partition tests
(cut and healed with drop rules that live only inside namespaces we created) and
for the three-host demo (tools/spark_cluster_pipeline.py ``--namespaces``).

Cluster tests must partition a broker from its peers and from ZooKeeper without
touching the host's network: ``tc netem`` is not available in this kernel, and a
rule in the host's own firewall could cut anything else running here. So each
test builds its own network of namespaces; the demo builds one to give each broker
and Spark worker a host address of its own.

Rules
-----
* Only our own namespaces change: they are named ``shmlog-<pid>-<member>`` (the
  pid of the process that made them), every interface and nftables rule lives
  inside them, and nothing is added to the host's (root) namespace.
* Cuts drop, never reject: a peer sees a timeout (no RST, no ICMP), which is what a
  real partition looks like to ZeroMQ's heartbeats and to kazoo's read timeout.
* Everything is removed at teardown, even after a failed start: the processes
  started in the namespaces (SIGTERM, then SIGKILL), then every process still in
  one of them (started there by those: a broker's or a Spark worker's children,
  or the processes of a program killed before its own cleanup), then the
  namespaces (their veths, bridge and rules go with them).
  :func:`sweep_dead_namespaces` removes what a killed process left: the
  ``shmlog-<pid>-*`` namespaces of pids no longer alive.
* Every command is bounded (``limits.NETNS_COMMAND_TIMEOUT_S``) and a failure
  raises :class:`~shmlog.common.errors.NetnsError` with the command and its stderr.
* Namespaces need root (CAP_NET_ADMIN) and ``ip``; cuts need ``nft`` too:
  :func:`unavailable_reason` says why they cannot be used here.

Theory of operation
-------------------
::

                 namespace <prefix>-hub: bridge br0
         ┌──────────────┬──────────────┬──────────────┐
       v-b1           v-b2           v-b3           v-zk      veth, hub side
         │              │              │              │
       eth0           eth0           eth0           eth0      veth, member side
   <prefix>-b1    <prefix>-b2    <prefix>-b3    <prefix>-zk   member namespaces
   10.213.0.1     10.213.0.2     10.213.0.3     10.213.0.4    (/24)

The hub namespace holds a bridge; each member namespace is joined to it by a veth
pair made directly in the two namespaces (``ip -n hub link add v-b1 type veth
peer name eth0 netns <prefix>-b1``), so the host never sees an interface. Member
i (in the order given) gets the (i+1)-th address of ``network``. Processes run
in a member with ``ip netns exec`` (:meth:`Topology.run_in`, or any launcher given
:meth:`Topology.launch_prefix`), which execs the command in the same process, so
the Popen's pid is the program's. A :class:`Topology` made with the prefix of one
created elsewhere names the same namespaces and addresses (a program started in a
member uses it to find the others) without creating anything.

``ip netns exec`` gives the program its own mount namespace only to remount
``/sys`` for the network namespace; every other mount is a copy of the host's,
so ``/dev/shm`` is the same tmpfs: shared-memory rings and state tables are seen
from every namespace (the tests check it). Data directories and shared-memory
prefixes must therefore still differ between brokers, as on one host.

A cut (:meth:`Topology.cut`) adds, inside one member, the table ``inet
shmlog_cut``: a set of peer addresses and two base chains (input and output
hooks) that drop every packet from or to an address of the set. Both directions
are dropped at that one member, so a cut is symmetric. :meth:`Topology.heal`
deletes the table; TCP connections that outlived the cut resume by
retransmission, as after a real partition.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Iterable

from ..common import child_process, limits
from ..common.errors import NetnsError

__all__ = ["Topology", "NetnsError", "unavailable_reason", "list_namespaces",
           "namespace_pids", "sweep_dead_namespaces", "CUT_TABLE", "NAME_PREFIX"]

NAME_PREFIX = "shmlog"
# The nftables table a cut lives in, inside the member's namespace only.
CUT_TABLE = "shmlog_cut"
MEMBERS_DEFAULT = ("b1", "b2", "b3", "zk")
NETWORK_DEFAULT = "10.213.0.0/24"
# Interface names are at most 15 bytes; the hub side is "v-<member>".
_MEMBER = re.compile(r"[a-z0-9]{1,12}")
_OUR_NAMESPACE = re.compile(rf"{NAME_PREFIX}-(?P<pid>[0-9]+)-[A-Za-z0-9_.-]+")
_BRIDGE = "br0"
_MEMBER_INTERFACE = "eth0"


def _tool(name: str) -> str | None:
    # Root's tools live in sbin, which a non-login shell's PATH may leave out.
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=search)


def _run(argv: list[str], *, stdin: str | None = None) -> str:
    argv = [_tool(argv[0]) or argv[0], *argv[1:]]
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=limits.NETNS_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{' '.join(argv)} did not finish in "
                         f"{limits.NETNS_COMMAND_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited with {done.returncode}: "
                         f"{done.stderr.strip()}")
    return done.stdout


def _nft_in(namespace: str, *arguments: str, stdin: str | None = None) -> str:
    """Run ``nft arguments`` inside ``namespace``."""
    return _run(["ip", "netns", "exec", namespace, _tool("nft") or "nft", *arguments],
                stdin=stdin)


def unavailable_reason(*, nftables: bool = True) -> str | None:
    """Why network namespaces (with ``nftables``: and cuts) cannot be used here, or
    None when they can: a namespace is made and removed to find out."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    tools = (("ip", "iproute2"), ("nft", "nftables")) if nftables else (("ip", "iproute2"),)
    for tool, package in tools:
        if _tool(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    probe = f"{NAME_PREFIX}-{os.getpid()}-probe"
    made = False
    try:
        _run(["ip", "netns", "add", probe])
        made = True
        if nftables:
            _nft_in(probe, "list", "tables")
    except NetnsError as error:
        return f"cannot use a network namespace{' with nftables' * nftables} here: {error}"
    finally:
        if made:
            _run(["ip", "netns", "delete", probe])
    return None


def list_namespaces() -> list[str]:
    """The names of the host's named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines()
            if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """The processes in network namespace ``name`` (``ip netns pids``); an exited one
    is not listed, even before it is reaped."""
    return [int(pid) for pid in _run(["ip", "netns", "pids", name]).split()]


def sweep_dead_namespaces() -> list[str]:
    """Delete the ``shmlog-<pid>-*`` namespaces whose pid is not alive (a test
    process killed before its teardown); the names deleted."""
    swept = []
    for name in list_namespaces():
        match = _OUR_NAMESPACE.fullmatch(name)
        if match and not child_process.process_alive(int(match.group("pid"))):
            _run(["ip", "netns", "delete", name])
            swept.append(name)
    return swept


class Topology:
    """Member namespaces joined by a bridge in a hub namespace (module docstring).

    Parameters
    ----------
    members : sequence of str
        Short names (``[a-z0-9]{1,12}``), one namespace each.
    prefix : str, optional
        Namespace names are ``<prefix>-<member>``; default ``shmlog-<pid>``. A
        prefix must start with ``shmlog-<pid>-`` or be that, so the sweeper knows
        whose it is.
    network : str
        An IPv4 network; member i gets its (i+1)-th address.
    """

    def __init__(self, members: Iterable[str] = MEMBERS_DEFAULT, *, prefix: str | None = None,
                 network: str = NETWORK_DEFAULT):
        self.members = tuple(members)
        for member in self.members + ("hub",):
            if not _MEMBER.fullmatch(member):
                raise ValueError(f"a member name is 1..12 of [a-z0-9], got {member!r}")
        if len(set(self.members + ("hub",))) != len(self.members) + 1:
            raise ValueError(f"member names must be distinct and not 'hub': {self.members}")
        self.prefix = prefix or f"{NAME_PREFIX}-{os.getpid()}"
        if not _OUR_NAMESPACE.fullmatch(f"{self.prefix}-hub"):
            raise ValueError(f"a prefix is {NAME_PREFIX}-<pid>[-tag], got {self.prefix!r}")
        self.network = ipaddress.IPv4Network(network)
        hosts = self.network.hosts()
        self.addresses = {member: str(next(hosts)) for member in self.members}
        self.hub = f"{self.prefix}-hub"
        self._processes: list[subprocess.Popen] = []
        self._created: list[str] = []

    def namespace(self, member: str) -> str:
        """The namespace name of ``member``."""
        if member not in self.addresses:
            raise KeyError(f"no member {member!r}; members: {', '.join(self.members)}")
        return f"{self.prefix}-{member}"

    def address(self, member: str) -> str:
        """The IPv4 address of ``member`` on the bridge."""
        self.namespace(member)
        return self.addresses[member]

    def create(self) -> "Topology":
        """Make the namespaces, the bridge and the links; on failure, remove what was
        made and raise :class:`NetnsError`."""
        try:
            self._add_namespace(self.hub)
            _run(["ip", "-n", self.hub, "link", "add", _BRIDGE, "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", _BRIDGE, "up"])
            for member in self.members:
                self._add_member(member)
        except BaseException:
            self.teardown()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_member(self, member: str) -> None:
        name, hub_side = self.namespace(member), f"v-{member}"
        self._add_namespace(name)
        _run(["ip", "-n", self.hub, "link", "add", hub_side, "type", "veth",
              "peer", "name", _MEMBER_INTERFACE, "netns", name])
        _run(["ip", "-n", self.hub, "link", "set", hub_side, "master", _BRIDGE, "up"])
        _run(["ip", "-n", name, "addr", "add",
              f"{self.addresses[member]}/{self.network.prefixlen}", "dev", _MEMBER_INTERFACE])
        _run(["ip", "-n", name, "link", "set", _MEMBER_INTERFACE, "up"])

    def launch_prefix(self, member: str) -> list[str]:
        """The command line that runs a program in ``member``'s namespace (``ip netns
        exec <namespace>``), for launchers that take a prefix (``LocalCluster``'s
        ``launch_prefixes``); what it starts is stopped at teardown."""
        return [_tool("ip") or "ip", "netns", "exec", self.namespace(member)]

    def run_in(self, member: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``member``'s namespace (``subprocess.Popen`` arguments
        pass through); it is stopped at teardown if still running."""
        process = subprocess.Popen([*self.launch_prefix(member), *argv], **popen_kwargs)
        self._processes.append(process)
        return process

    def cut(self, member: str, peers: Iterable[str]) -> None:
        """Drop every packet between ``member`` and ``peers`` (member names or IPv4
        addresses), both ways, inside ``member``'s namespace; cuts add up."""
        addresses = sorted({self.addresses.get(peer) or str(ipaddress.IPv4Address(peer))
                            for peer in peers})
        if not addresses:
            raise ValueError("a cut needs at least one peer")
        script = "\n".join([
            f"table inet {CUT_TABLE} {{",
            "  set peers { type ipv4_addr; }",
            "  chain input { type filter hook input priority 0; policy accept;"
            " ip saddr @peers drop; }",
            "  chain output { type filter hook output priority 0; policy accept;"
            " ip daddr @peers drop; }",
            "}",
            f"add element inet {CUT_TABLE} peers {{ {', '.join(addresses)} }}",
        ]) + "\n"
        _nft_in(self.namespace(member), "-f", "-", stdin=script)

    def heal(self, member: str) -> None:
        """Remove every cut of ``member`` (nothing happens when it has none)."""
        if self._is_cut(member):
            _nft_in(self.namespace(member), "delete", "table", "inet", CUT_TABLE)

    def cut_rules(self, member: str) -> str:
        """``member``'s cut table as nft prints it ('' when not cut)."""
        if not self._is_cut(member):
            return ""
        return _nft_in(self.namespace(member), "list", "table", "inet", CUT_TABLE)

    def _is_cut(self, member: str) -> bool:
        tables = _nft_in(self.namespace(member), "list", "tables")
        return f"table inet {CUT_TABLE}" in tables.splitlines()

    def teardown(self) -> None:
        """Stop the processes started here, then every other process in a namespace
        made here, then delete those namespaces."""
        processes, self._processes = self._processes, []
        for process in processes:
            child_process.stop(process, limits.NETNS_PROCESS_STOP_TIMEOUT_S)
        existing = set(list_namespaces())
        created, self._created = self._created, []
        _stop_every_process_in([name for name in created if name in existing])
        for name in reversed(created):
            if name in existing:
                _run(["ip", "netns", "delete", name])

    def __enter__(self) -> "Topology":
        return self.create()

    def __exit__(self, *exc_info) -> None:
        self.teardown()


def _stop_every_process_in(namespaces: list[str]) -> None:
    """SIGTERM every process in ``namespaces``, SIGKILL those still there after
    ``limits.NETNS_PROCESS_STOP_TIMEOUT_S``. They need not be our children (a
    broker's JVM, a Spark executor), so they are not waited for: the namespaces are
    listed again until they are empty."""
    def remaining() -> set[int]:
        return {pid for name in namespaces for pid in namespace_pids(name)} - {os.getpid()}

    deadline = time.monotonic() + limits.NETNS_PROCESS_STOP_TIMEOUT_S
    for stop_signal in (signal.SIGTERM, signal.SIGKILL):
        for pid in remaining():
            try:
                os.kill(pid, stop_signal)
            except ProcessLookupError:
                pass
        while remaining() and time.monotonic() < deadline:
            time.sleep(limits.NETNS_PROCESS_POLL_S)
        deadline = time.monotonic() + limits.NETNS_PROCESS_STOP_TIMEOUT_S
