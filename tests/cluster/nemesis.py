"""The nemesis: a seeded random schedule of faults played against a cluster whose
brokers live in network namespaces, and the record of what it did.

Rules
-----
* Reproducible: a schedule is a pure function of its seed, the run's length and the
  fault kinds allowed (:func:`make_schedule`); the test prints the seed, and
  ``SHMLOG_NEMESIS_SEED`` plays the same schedule again. What the machine's load
  changes is only when a step starts (a restart takes as long as it takes), never
  which faults come in which order with which holds.
* Bounded: one or two faults at a time, on distinct brokers, all applied together
  and each healed after its own hold (at most :data:`HOLD_S_MAX`), or when an
  earlier heal of its step is done (a restart returns once the broker serves); the
  next step starts after every fault of the last is healed and a short quiet gap.
  No step starts after the run's length is spent.
* Healed even on failure: :meth:`Nemesis.heal_all` removes every cut, resumes every
  paused broker and restarts every killed one; the test calls it in a ``finally``.
* Crashes are findings: after every step, a broker the nemesis did not kill that
  has exited fails the run (:meth:`Nemesis.check_alive`, with its last output).
* Honest: every fault is logged with when it was applied and healed (seconds from
  the start of the run), and :meth:`Nemesis.report` prints that log: the test puts
  it in its output and in any assertion message.

Theory of operation
-------------------
The faults are the ways a host fails a Kafka cluster:

* ``kill -9`` of a broker, started again after the hold (its session must expire
  before its partitions move; it then rejoins, truncates and catches up);
* SIGSTOP/SIGCONT of a broker, short (a GC pause: nobody should notice much) or
  past the ZooKeeper session timeout (the broker wakes a zombie: its leaderships
  have moved and its conditional writes must fail);
* a partition of a broker from its two peers (nftables drop rules in its namespace:
  followers fall out of the ISR, a leader's acks=all writes stall below
  min.insync.replicas);
* a partition of a broker from ZooKeeper only (its session expires if the cut
  outlasts it; its peers still reach it: the controller moves its leaderships, and
  it must not go on acknowledging as leader);
* kill -9 of ZooKeeper itself, started again on its data after the hold (leaders
  go on acknowledging while their ISRs need no change; every session may expire
  meanwhile). A broker killed while it is down is started again once it is back:
  it could not register before.

Cuts are :meth:`netns.Topology.cut` in the broker's own namespace, so two cut
brokers never share a rule table; a heal removes all cuts of that broker.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import time
from typing import Mapping, Sequence

__all__ = ["FaultKind", "Fault", "Step", "Applied", "Nemesis", "make_schedule",
           "ALL_FAULT_KINDS", "HOLD_S_MAX"]


class FaultKind(enum.Enum):
    """A fault the nemesis can do to one broker (module docstring)."""
    KILL = "kill -9"
    PAUSE_SHORT = "SIGSTOP short"
    PAUSE_LONG = "SIGSTOP past session"
    CUT_PEERS = "cut from peers"
    CUT_ZOOKEEPER = "cut from ZooKeeper"
    KILL_ZOOKEEPER = "kill -9 of ZooKeeper"


ALL_FAULT_KINDS = tuple(FaultKind)
# How long each kind of fault is held (seconds, drawn uniformly). The session timeout
# of the fault tests is 3 s and replica.lag.time.max.ms 4 s: a short pause stays
# below both, a long one passes both, and cuts land on either side of them.
HOLD_S = {
    FaultKind.KILL: (0.5, 4.0),
    FaultKind.PAUSE_SHORT: (0.2, 1.5),
    FaultKind.PAUSE_LONG: (5.0, 7.0),
    FaultKind.CUT_PEERS: (1.0, 7.0),
    FaultKind.CUT_ZOOKEEPER: (1.0, 7.0),
    FaultKind.KILL_ZOOKEEPER: (1.0, 7.0),
}
HOLD_S_MAX = max(high for _, high in HOLD_S.values())
# The quiet time after a step's last heal before the next step (seconds, uniform).
GAP_S = (1.0, 3.0)
# The chance that a step holds two faults (on two brokers) instead of one.
TWO_FAULTS_CHANCE = 0.3
# Lines of a crashed broker's output shown.
OUTPUT_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault of a step: ``kind`` done to broker ``target`` for ``hold_s``."""
    kind: FaultKind
    target: int
    hold_s: float


@dataclasses.dataclass(frozen=True)
class Step:
    """Faults applied together, each healed after its hold, then ``gap_s`` of quiet."""
    faults: tuple[Fault, ...]
    gap_s: float

    @property
    def length_s(self) -> float:
        return max(fault.hold_s for fault in self.faults) + self.gap_s


def make_schedule(seed: int, duration_s: float, brokers: Sequence[int],
                  kinds: Sequence[FaultKind] = ALL_FAULT_KINDS) -> list[Step]:
    """The steps a run of ``duration_s`` seconds plays (planned lengths add up to at
    least ``duration_s``; a slow machine plays fewer of them, but always the
    opening). Its first faults are every kind once, in a seeded order, so a short run
    plays each; then kinds are drawn at random."""
    if not kinds:
        raise ValueError("a schedule needs at least one fault kind")
    chooser = random.Random(seed)
    unplayed = chooser.sample(list(kinds), len(kinds))
    steps: list[Step] = []
    planned_s = 0.0
    while planned_s < duration_s or unplayed:
        count = 2 if len(brokers) > 1 and chooser.random() < TWO_FAULTS_CHANCE else 1
        targets = chooser.sample(sorted(brokers), count)
        faults = []
        for target in targets:
            # There is one ZooKeeper: a step kills it once at most.
            choices = [kind for kind in kinds if kind is not FaultKind.KILL_ZOOKEEPER
                       or all(fault.kind is not kind for fault in faults)] or list(kinds)
            kind = unplayed.pop() if unplayed else chooser.choice(choices)
            faults.append(Fault(kind, target, round(chooser.uniform(*HOLD_S[kind]), 2)))
        step = Step(tuple(faults), round(chooser.uniform(*GAP_S), 2))
        steps.append(step)
        planned_s += step.length_s
    return steps


@dataclasses.dataclass
class Applied:
    """A fault as played: seconds from the run's start (``healed_at`` None while on)."""
    fault: Fault
    applied_at: float
    healed_at: float | None = None

    def __str__(self) -> str:
        healed = "not healed" if self.healed_at is None else f"healed {self.healed_at:6.1f} s"
        whom = "ZooKeeper" if self.fault.kind is FaultKind.KILL_ZOOKEEPER \
            else f"broker {self.fault.target}"
        return (f"{self.applied_at:6.1f} s  {self.fault.kind.value:<20} {whom}  "
                f"(hold {self.fault.hold_s:.1f} s)  {healed}")


class Nemesis:
    """Plays a schedule against ``cluster`` (a started ``LocalCluster`` whose broker i
    runs in namespace ``members[i]`` of ``topology``; ZooKeeper in
    ``zookeeper_member``).

    Parameters
    ----------
    cluster : shmlog.devtools.local_cluster.LocalCluster
    topology : netns.Topology
    members : mapping of broker id to member name
    zookeeper_member : str
    zookeeper : test_partitioned_follower.NamespacedZooKeeper, optional
        ZooKeeper's server, for the ``KILL_ZOOKEEPER`` faults.
    """

    def __init__(self, cluster, topology, members: Mapping[int, str],
                 zookeeper_member: str = "zk", zookeeper=None):
        self.cluster, self.topology = cluster, topology
        self.members = dict(members)
        self.zookeeper_member = zookeeper_member
        self.zookeeper = zookeeper
        self._zookeeper_down = False
        # Brokers whose restart waits for ZooKeeper (one cannot register without it).
        self._restart_after_zookeeper: list[Applied] = []
        self.played: list[Applied] = []
        self.steps_played = 0
        self._started = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def run(self, steps: Sequence[Step], duration_s: float) -> None:
        """Play ``steps`` in order until they end, or ``duration_s`` is spent and every
        kind of fault they hold has played once (a slow machine still plays the
        schedule's opening, which has each kind; the step under way finishes and is
        healed)."""
        self._started = time.monotonic()
        unplayed = {fault.kind for step in steps for fault in step.faults}
        for step in steps:
            if self.elapsed_s() >= duration_s and not unplayed:
                return
            self.play(step)
            self.steps_played += 1
            unplayed -= {fault.kind for fault in step.faults}

    def play(self, step: Step) -> None:
        """Apply a step's faults together, heal each after its hold, then rest."""
        began = time.monotonic()
        applied = []
        try:
            for fault in step.faults:
                applied.append(self._apply(fault))
            for entry in sorted(applied, key=lambda entry: entry.fault.hold_s):
                time.sleep(max(0.0, began + entry.fault.hold_s - time.monotonic()))
                self._heal(entry)
        finally:
            for entry in applied:
                if entry.healed_at is None:
                    self._heal(entry)
        time.sleep(step.gap_s)
        self.check_alive()

    def check_alive(self) -> None:
        """Raise AssertionError if a broker the nemesis did not kill has exited (a
        crash), with the end of its output."""
        for broker_id, broker in sorted(self.cluster.brokers.items()):
            status = broker.process.poll()
            if status is not None:
                raise AssertionError(f"broker {broker_id} exited by itself with status "
                                     f"{status}; its output ends:\n{self._output_tail(broker_id)}")

    def _output_tail(self, broker_id: int) -> str:
        if not self.cluster.log_files:
            return "(its output went to the test's)"
        with open(self.cluster.log_file(broker_id), errors="replace") as output:
            return "".join(output.readlines()[-OUTPUT_TAIL_LINES:])

    def _apply(self, fault: Fault) -> Applied:
        entry = Applied(fault, self.elapsed_s())
        self.played.append(entry)
        member = self.members[fault.target]
        if fault.kind is FaultKind.KILL_ZOOKEEPER:
            self.zookeeper.kill()
            self._zookeeper_down = True
        elif fault.kind is FaultKind.KILL:
            self.cluster.kill(fault.target)
        elif fault.kind in (FaultKind.PAUSE_SHORT, FaultKind.PAUSE_LONG):
            self.cluster.pause(fault.target)
        elif fault.kind is FaultKind.CUT_PEERS:
            self.topology.cut(member, [peer for broker_id, peer in self.members.items()
                                       if broker_id != fault.target])
        else:
            self.topology.cut(member, [self.zookeeper_member])
        return entry

    def _heal(self, entry: Applied) -> None:
        fault = entry.fault
        if fault.kind is FaultKind.KILL_ZOOKEEPER:
            self.zookeeper.start()
            self._zookeeper_down = False
            waiting, self._restart_after_zookeeper = self._restart_after_zookeeper, []
            for broker in waiting:
                self.cluster.start_broker(broker.fault.target)
                broker.healed_at = self.elapsed_s()
        elif fault.kind is FaultKind.KILL and self._zookeeper_down:
            if entry not in self._restart_after_zookeeper:
                self._restart_after_zookeeper.append(entry)
            return                             # healed when ZooKeeper is back
        elif fault.kind is FaultKind.KILL:
            self.cluster.start_broker(fault.target)
        elif fault.kind in (FaultKind.PAUSE_SHORT, FaultKind.PAUSE_LONG):
            self.cluster.resume(fault.target)
        else:
            self.topology.heal(self.members[fault.target])
        entry.healed_at = self.elapsed_s()

    def heal_all(self) -> None:
        """Start ZooKeeper again if killed, remove every cut, resume every paused
        broker, restart every killed one."""
        if self._zookeeper_down:
            self.zookeeper.start()
            self._zookeeper_down = False
        self._restart_after_zookeeper = []
        for broker_id, member in self.members.items():
            self.topology.heal(member)
            if broker_id in self.cluster.paused:
                self.cluster.resume(broker_id)
        for broker_id in self.members:
            if broker_id not in self.cluster.brokers:
                self.cluster.start_broker(broker_id)
        for entry in self.played:
            if entry.healed_at is None:
                entry.healed_at = self.elapsed_s()

    def report(self) -> str:
        """The faults as played, one a line."""
        lines = [f"fault schedule ({len(self.played)} faults in {self.steps_played} steps; "
                 f"seconds from the start):"]
        return "\n".join(lines + [f"  {entry}" for entry in self.played])
