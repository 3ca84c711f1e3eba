"""A running consumer group of one client's members, as each client module's
``group`` starts it: what each member read so far, and a stop that leaves nothing
running.

Rules
-----
* **Members read and commit as they go.** Each member is subscribed to the topic
  with the assignor asked for, starts at the group's committed offsets (else the
  earliest), and commits what it read after each poll that read something (kcat and
  kafkajs: their auto-commit, every 100 ms or every record), so that the group's
  committed offsets reach the partitions' ends once everything is read.
* **Bounded**: members stop by themselves at the bound; :meth:`Members.stop` stops
  them sooner, waits for them (threads joined, children reaped, killed past
  :data:`STOP_S`) and is safe to call twice. The instance is a context manager
  that stops on exit.
* What a member's poll or commit raised is kept in ``errors`` (the member goes on):
  the caller shows it when the group does not read what it should.

Theory of operation
-------------------
A client's ``group`` returns a subclass: the in-process clients run their members
on threads (:meth:`Members.thread`); kcat and kafkajs run child processes writing
what they read to files, read back when asked (:meth:`Members.read`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

from .processes import end, start_logging

# How long stopping a member may take: leaving the group, closing sockets.
STOP_S = 20.0


class Members:
    """``count`` members of a group, each with the list of what it read."""

    def __init__(self, count: int, timeout_s: float) -> None:
        self.count = count
        self.deadline = time.monotonic() + timeout_s
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self._read = [[] for _ in range(count)]
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    # -- for the client modules -----------------------------------------------------
    def running(self) -> bool:
        return not self.stopping.is_set() and time.monotonic() < self.deadline

    def add(self, member: int, consumed) -> None:
        with self._lock:
            self._read[member].extend(consumed)

    def error(self, member: int, error) -> None:
        with self._lock:
            self.errors.append(f"member {member}: {error!r}")

    def thread(self, target, *args) -> None:
        """Run ``target(*args)`` on a thread of its own; what it raises is kept."""
        def run():
            try:
                target(*args)
            except Exception as error:   # noqa: BLE001 - kept for the caller to show
                self.error(-1, error)
        started = threading.Thread(target=run, daemon=True)
        started.start()
        self._threads.append(started)

    def _finish(self) -> None:
        """Stop what the subclass started (threads are joined here)."""

    # -- for the tests ----------------------------------------------------------------
    def read(self) -> list[list]:
        """What each member read so far, in the order read."""
        with self._lock:
            return [list(records) for records in self._read]

    def total(self) -> int:
        return sum(len(records) for records in self.read())

    def stop(self) -> list[list]:
        """Stop every member (they leave the group); what each read."""
        if not self._stopped:
            self._stopped = True
            self.stopping.set()
            try:
                self._finish()
            finally:
                for started in self._threads:
                    started.join(STOP_S)
            alive = [started for started in self._threads if started.is_alive()]
            if alive:
                raise TimeoutError(f"{len(alive)} member thread(s) still running "
                                   f"{STOP_S} s after the stop")
        return self.read()

    def __enter__(self) -> "Members":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


class ChildMembers(Members):
    """Members that are child processes (:func:`.processes.start_logging`), one per
    ``argv`` of ``argvs``, each writing what it reads to its stdout file;
    ``parse(bytes)`` turns such a file into Consumed records (a record cut short
    left out). Ended at :meth:`stop` or at the bound, whichever comes first:
    ``by_stdin`` children are asked to end by their stdin closing, others get
    SIGTERM."""

    def __init__(self, argvs: list[list[str]], parse, timeout_s: float, *,
                 cwd: str | None = None, by_stdin: bool = False) -> None:
        super().__init__(len(argvs), timeout_s)
        self._parse = parse
        self._by_stdin = by_stdin
        self._directory = tempfile.mkdtemp(prefix="kafka-members-")
        self._children = []
        self._ended = threading.Lock()
        try:
            for index, argv in enumerate(argvs):
                self._children.append(start_logging(argv, self._path(index, "out"),
                                                    self._path(index, "err"), cwd=cwd))
        except BaseException:
            self._end_children()
            raise
        self.thread(self._watch)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self._directory, f"member-{index}.{kind}")

    def _watch(self) -> None:
        self.stopping.wait(max(0.0, self.deadline - time.monotonic()))
        self._end_children()

    def _end_children(self) -> None:
        with self._ended:
            end([child for child in self._children if not child.stdin.closed],
                by_stdin=self._by_stdin)

    def _finish(self) -> None:
        try:
            self._end_children()
            for index in range(self.count):
                self._read[index] = self._parse(self._slurp(index, "out"))
                if self._children[index].returncode not in (0, None):
                    self.error(index, f"exit code {self._children[index].returncode}: "
                                      f"{self._slurp(index, 'err')[-1000:]!r}")
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)

    def _slurp(self, index: int, kind: str) -> bytes:
        with open(self._path(index, kind), "rb") as output:
            return output.read()

    def read(self) -> list[list]:
        if self._stopped:
            return super().read()
        return [self._parse(self._slurp(index, "out")) for index in range(self.count)]
