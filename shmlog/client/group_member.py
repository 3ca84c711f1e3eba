"""The consumer's side of a consumer group (the member half of Kafka's
AbstractCoordinator and its heartbeat thread): one member of one group, which joins
and syncs when its consumer asks, heartbeats on a thread of its own, commits and
fetches offsets, and leaves.

Rules
-----
* The member does not decide anything for the consumer: its heartbeat thread only
  raises flags (``rejoin_needed``, ``lost``, ``poll_timed_out``) that the consumer
  acts on at its next poll (``consumer_coordinator.py``).
* Its member id and generation change under a lock: a heartbeat's or a commit's
  fencing error concerns the member only as it was when the request was sent.
* A join that :meth:`GroupMember.leave` overtook ends in ``JoinCancelledError``
  and leaves whatever it joined: the consumer is no member after it left.
* It leaves the group when the consumer is not polled for ``max.poll.interval.ms``
  (Kafka's rule: its partitions then go to members that are making progress).

Theory of operation
-------------------
The member talks to its local broker through one ``send`` callable (a request, its
reply's fields or the coordinator's typed error). In a cluster that broker forwards
to the group's coordinator (``cluster/groups.py``); a coordinator error
(:class:`~shmlog.common.errors.CoordinatorError`: a failover under way) is retried
after ``limits.COORDINATOR_RETRY_BACKOFF_MS``, a join's until the rebalance timeout,
a commit's or offset fetch's (and a commit's unknown outcome,
``RequestTimedOutError``) until the session timeout, as Kafka's consumer retries
them; then the error is raised. A new coordinator does not know the member: it
joins again as a new one. Joins run on a join thread of their own, so a poll waits
for one only as long as its timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import socket
import threading
import time
from typing import Callable, Iterable, Mapping

from ..common import limits
from ..common.errors import (
    BrokerAccessDeniedError,
    BrokerNotAvailableError,
    BrokerNotRunningError,
    CommitFailedError,
    CoordinatorError,
    IllegalGenerationError,
    JoinCancelledError,
    LocalProtocolError,
    RebalanceInProgressError,
    RequestTimedOutError,
    ShmlogError,
    UnknownMemberIdError,
)
from ..groups import new_member_id, require_group_id
from .assignors import ASSIGNORS

# The logger consumer groups have always logged to (log settings name it).
log = logging.getLogger("shmlog.groups")

__all__ = ["GroupMember", "MemberConfig"]


@dataclasses.dataclass(frozen=True)
class MemberConfig:
    """Kafka's consumer settings for groups (same names, underscores)."""
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    # Kafka 3's default list: eager range, with cooperative-sticky on offer to upgrade.
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    # Extra time a join request may wait beyond the rebalance timeout (Kafka: 5 s).
    join_slack_ms: int = 5_000

    def __post_init__(self):
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise LocalProtocolError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be positive and "
                f"below session_timeout_ms ({self.session_timeout_ms})")
        if self.max_poll_interval_ms < 1:
            raise LocalProtocolError("max_poll_interval_ms must be positive")
        unknown = [name for name in self.partition_assignment_strategy if name not in ASSIGNORS]
        if unknown or not self.partition_assignment_strategy:
            raise LocalProtocolError(f"partition_assignment_strategy must name some of "
                                     f"{', '.join(ASSIGNORS)}, got "
                                     f"{self.partition_assignment_strategy!r}")


class GroupMember:
    """One member of a group, seen from the consumer: joins and syncs when asked
    (on the consumer's thread), heartbeats on a thread of its own, commits and
    fetches offsets.

    ``send(request_type, timeout_ms=..., **fields)`` is the transport: one request
    to the coordinator, its reply's fields, or the coordinator's typed error.

    The heartbeat thread only raises flags the consumer acts on at its next poll:
    ``rejoin_needed`` (the group is rebalancing), ``lost`` (this member was fenced:
    its partitions may belong to others already) and ``poll_timed_out`` (it left the
    group because the consumer was not polled within ``max_poll_interval_ms``).
    """

    def __init__(self, send: Callable[..., dict], group_id: str, client_id: str,
                 config: MemberConfig):
        self._send = send
        self.group_id = require_group_id(group_id)
        self.client_id = client_id
        self.config = config
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.rejoin_needed = True
        self.lost = False
        self.poll_timed_out = False
        self.last_poll = time.monotonic()
        self._joining = False
        # The id a join as a new member sends: chosen once, kept until that join
        # succeeds, so sending it again after a timeout is no second member.
        self._new_member_id = new_member_id(client_id)
        # Bumped by leave(): a join started before it must not make this a member again.
        self._membership = 0
        self._lock = threading.Lock()         # member id and generation vs the heartbeats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                        name=f"shmlog-heartbeat-{group_id}")
        self._thread.start()
        # Joins run here, so a poll waits for one only as long as its timeout.
        self._joiner = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"shmlog-join-{group_id}")

    @property
    def cooperative(self) -> bool:
        """Does the current generation use an incremental (cooperative) assignor?"""
        return self.protocol == "cooperative-sticky"

    def start_join(self, topics: Iterable[str], pattern: str | None,
                   owned: Iterable[tuple[str, int]]) -> concurrent.futures.Future:
        """:meth:`join` on the member's join thread; the future's result is the
        assignment."""
        self._joining = True
        # Cleared now, not when the join succeeds: a subscribe() or a rebalance
        # noticed while it runs must lead to another join.
        self.rejoin_needed = False
        return self._joiner.submit(self._join_or_flag, tuple(topics), pattern, tuple(owned),
                                   self._membership)

    def _join_or_flag(self, topics, pattern, owned, membership) -> list[tuple[str, int]]:
        try:
            return self.join(topics, pattern, owned, membership)
        except JoinCancelledError:
            raise                              # left on purpose: nothing to retry
        except BaseException:
            self.rejoin_needed = True          # the next poll tries again
            raise

    def join(self, topics: Iterable[str], pattern: str | None,
             owned: Iterable[tuple[str, int]], membership: int | None = None
             ) -> list[tuple[str, int]]:
        """Join the group (again) and sync: the partitions of the new generation.
        Blocks until the rebalance completes (at most the group's rebalance timeout,
        and one retry per refusal it can recover from).

        Raises
        ------
        JoinCancelledError
            :meth:`leave` or :meth:`close` was called since ``membership`` (the
            value of ``_membership`` when the join was asked for): the group heard
            the leave, and this join made the consumer no member again.
        """
        membership = self._membership if membership is None else membership
        self._joining = True
        member_id = None                       # the id of the last join sent
        # Coordinator errors (a failover under way) do not use up the attempts: they
        # are retried until the rebalance timeout, Kafka's bound on a join.
        coordinator_deadline = time.monotonic() + self.config.max_poll_interval_ms / 1000
        attempts = 0
        try:
            while attempts < limits.JOIN_ATTEMPTS_MAX:
                attempts += 1
                self._check_not_cancelled(membership, member_id)
                with self._lock:
                    member_id = self.member_id or self._new_member_id
                    generation = self.generation
                try:
                    # A join waits for its rebalance; asked again now and then, it
                    # finds a broker that restarted meanwhile (the coordinator keeps
                    # only the newest join of a member).
                    reply = self._send(
                        "join_group",
                        timeout_ms=min(self.config.max_poll_interval_ms
                                       + self.config.join_slack_ms, limits.JOIN_REQUEST_TIMEOUT_MS),
                        group_id=self.group_id, member_id=member_id,
                        client_id=self.client_id, topics=sorted(topics), pattern=pattern,
                        assignors=list(self.config.partition_assignment_strategy),
                        session_timeout_ms=self.config.session_timeout_ms,
                        rebalance_timeout_ms=self.config.max_poll_interval_ms,
                        owned=[list(partition) for partition in sorted(owned)],
                        generation=generation, client_host=socket.gethostname())
                    with self._lock:
                        current = membership == self._membership
                        if current:
                            self.member_id, self.generation = (reply["member_id"],
                                                               reply["generation"])
                            self.protocol = reply["protocol"]
                            self._new_member_id = new_member_id(self.client_id)
                    if not current:
                        # leave() ran while the join waited: what it joined, leave too.
                        self._check_not_cancelled(membership, reply["member_id"])
                    assignment = self._send("sync_group", group_id=self.group_id,
                                            member_id=reply["member_id"],
                                            generation=reply["generation"])["assignment"]
                except UnknownMemberIdError:
                    with self._lock:
                        if membership == self._membership:
                            self.member_id, self.generation = "", -1
                    owned = ()
                    continue
                except BrokerAccessDeniedError:
                    raise                      # no retry gives this user permission
                except CoordinatorError:
                    if time.monotonic() >= coordinator_deadline:
                        raise
                    attempts -= 1
                    self._stop.wait(limits.COORDINATOR_RETRY_BACKOFF_MS / 1000)
                    continue
                except BrokerNotRunningError:
                    # Fails at once (no control socket while a broker restarts): pause,
                    # as Kafka's retry.backoff, or the attempts run out in a moment.
                    self._stop.wait(limits.GROUP_BROKER_RETRY_BACKOFF_S)
                    continue
                except (RebalanceInProgressError, IllegalGenerationError,
                        BrokerNotAvailableError):
                    continue
                self._check_not_cancelled(membership, member_id)
                self.lost = self.poll_timed_out = False
                return [(topic, partition) for topic, partition in assignment]
            raise RebalanceInProgressError(
                f"group {self.group_id!r} kept rebalancing through "
                f"{limits.JOIN_ATTEMPTS_MAX} joins")
        finally:
            self._joining = False

    def _check_not_cancelled(self, membership: int, joined_as: str | None) -> None:
        """Raise JoinCancelledError when the consumer closed or left since the join
        began, after leaving as ``joined_as`` (an id the join may have made a member
        of the group after leave() had run)."""
        if membership == self._membership and not self._stop.is_set():
            return
        if joined_as:
            self._leave(joined_as)
        raise JoinCancelledError(f"the consumer of group {self.group_id!r} left it (closed "
                                 f"or unsubscribed) during a join")

    def commit(self, offsets: Mapping[tuple[str, int], tuple[int, str]], *,
               as_member: bool = True) -> None:
        """Commit ``{(topic, partition): (offset, metadata)}`` for this generation
        (``as_member=False``: as a consumer without a subscription).

        Raises
        ------
        CommitFailedError
            This member was fenced: the partitions may belong to another now.
        """
        entries = [[topic, partition, offset, metadata]
                   for (topic, partition), (offset, metadata) in sorted(offsets.items())]
        with self._lock:
            member_id, generation = (self.member_id, self.generation) if as_member else ("", -1)
        if as_member and not member_id:
            raise CommitFailedError(f"not a member of group {self.group_id!r} now (it left or "
                                    f"was removed); poll to rejoin, then commit")
        try:
            self._send_retrying("commit_offsets", group_id=self.group_id, member_id=member_id,
                                generation=generation, offsets=entries)
        except (UnknownMemberIdError, IllegalGenerationError) as error:
            self._fenced(member_id, generation, error)
            raise CommitFailedError(
                f"commit refused: group {self.group_id!r} rebalanced and these partitions may "
                f"belong to another member now ({error}); poll to rejoin") from None

    def _send_retrying(self, request_type: str, **fields) -> dict:
        """One request, asked again after a coordinator error or an unknown outcome
        (``RequestTimedOutError``: a commit not replicated in time, which a re-send
        stores again) until ``session_timeout_ms`` has passed: Kafka's commitSync
        retries its retriable errors until its timeout. The last error is raised
        when the time runs out."""
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000
        while True:
            try:
                return self._send(request_type, **fields)
            except (CoordinatorError, RequestTimedOutError):
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise
                time.sleep(limits.COORDINATOR_RETRY_BACKOFF_MS / 1000)

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict:
        """{(topic, partition): (offset, metadata)} of those with a commit."""
        reply = self._send_retrying("fetch_offsets", group_id=self.group_id,
                           partitions=[list(partition) for partition in partitions])
        return {(topic, partition): (offset, metadata)
                for topic, partition, offset, metadata in reply["offsets"]}

    def leave(self) -> None:
        """Leave the group (best effort: a broker that is gone expires us anyway),
        and cancel a join under way: it ends in :class:`JoinCancelledError` and
        leaves whatever it joined."""
        with self._lock:
            self._membership += 1
            member_id, self.member_id, self.generation = self.member_id, "", -1
            # A first join under way is waiting as this id: leave as it too.
            pending, self._new_member_id = self._new_member_id, new_member_id(self.client_id)
        if member_id:
            self._leave(member_id)
        elif self._joining:
            self._leave(pending)

    def _leave(self, member_id: str) -> None:
        try:
            self._send("leave_group", group_id=self.group_id, member_id=member_id)
        except UnknownMemberIdError:
            pass                                # gone already
        except ShmlogError as error:
            log.info("group %s: leaving: %s", self.group_id, error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._joiner.shutdown(wait=False, cancel_futures=True)
        self.leave()

    # -- the heartbeat thread ------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            if self._joining:
                continue                        # a waiting join keeps the session alive
            with self._lock:
                member_id, generation = self.member_id, self.generation
            if not member_id:
                continue
            if time.monotonic() - self.last_poll > self.config.max_poll_interval_ms / 1000:
                log.warning("group %s: not polled within max_poll_interval_ms (%d ms); leaving "
                            "the group so its partitions move on", self.group_id,
                            self.config.max_poll_interval_ms)
                self.poll_timed_out = self.rejoin_needed = True
                self.leave()
                continue
            try:
                self._send("heartbeat", timeout_ms=self.config.session_timeout_ms,
                           group_id=self.group_id, member_id=member_id, generation=generation)
            except RebalanceInProgressError:
                with self._lock:
                    # Only news for the member as it still is: a join that began
                    # meanwhile takes part in this very rebalance, and one more join
                    # after it would start another.
                    if not self._joining and (member_id, generation) == (self.member_id,
                                                                         self.generation):
                        self.rejoin_needed = True
            except (UnknownMemberIdError, IllegalGenerationError) as error:
                self._fenced(member_id, generation, error)
            except ShmlogError as error:       # no broker: the session decides
                log.info("group %s: heartbeat failed: %s", self.group_id, error)

    def _fenced(self, member_id: str, generation: int, error: Exception) -> None:
        """Act on a fencing error only if it concerns the member as it still is."""
        with self._lock:
            if (member_id, generation) != (self.member_id, self.generation):
                return                          # a join moved on meanwhile
            if isinstance(error, UnknownMemberIdError):
                self.member_id, self.generation = "", -1
            self.lost = self.rejoin_needed = True
