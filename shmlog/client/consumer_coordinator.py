"""A consumer's group work (Kafka's ConsumerCoordinator): what a poll does for the
group, the rebalance listener, and committing offsets. The member itself (joins,
syncs, heartbeats, requests) is a :class:`~.group_member.GroupMember`.

Rules
-----
* Everything here runs on the consumer's thread, inside its calls: the member's
  heartbeat thread only raises flags, which :meth:`ConsumerCoordinator.poll` acts on.
* A member that was fenced (``lost``, or it left for not being polled within
  ``max_poll_interval_ms``) loses all its partitions (``on_partitions_lost``) and
  commits nothing; it joins again.
* An eager member gives up (commits, revokes) everything before it joins; a
  cooperative one keeps consuming what it holds meanwhile, and revokes only what
  the new assignment takes away, then joins once more so it reaches its new owner.
* New partitions are taken on whole or not at all: their metadata and committed
  offsets are read first, and a failure there leaves the assignment as it was and
  joins again. A partition with a committed offset starts there, not at
  ``auto_offset_reset``; one paused before the join stays paused.
* A subscribed partition whose topic was deleted leaves the assignment as soon as
  the consumer sees it (``Fetcher.on_deleted``): the listener hears of it as lost
  (nothing of it can be committed) and the member joins again, as Kafka's does
  when its metadata loses a subscribed topic.
* Commits the consumer makes by itself (auto commit, before a revocation, on
  close) log a refusal and go on; ``commit`` raises it.
* ``commit_async`` sends its commits on one worker thread, in the order made, and
  runs their callbacks on the consumer's thread; ``commit`` first waits for the
  async commits before it (Kafka's commitSync).

Theory of operation
-------------------
A poll first does the group's work (:meth:`poll`): run finished async commits'
callbacks, count the poll for ``max_poll_interval_ms``, act on being fenced, join
when the group rebalances, and commit the positions every
``auto_commit_interval_ms`` when auto commit is on. A join runs on the member's join
thread: a member with partitions keeps consuming them while it waits; one with none
waits for it up to the poll's timeout (:meth:`step`). While a poll idles,
:meth:`work_due` tells it when group work came up, so a rebalance cuts into a long
poll and the wait counts as polling.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from typing import Iterable, Mapping

from ..common import limits
from ..common.errors import (
    CommitFailedError,
    LocalProtocolError,
    OffsetOutOfRangeError,
    ShmlogError,
    UnknownTopicOrPartitionError,
)
from ..common.metrics import RateWindow
from ..common.structs import OffsetAndMetadata, TopicPartition
from .consumer_metadata import ConsumerMetadata
from .fetcher import Fetcher
from .group_member import GroupMember
from .subscription_state import SubscriptionState

# The consumer's logger: its group work always logged there.
log = logging.getLogger("shmlog.client.consumer")

__all__ = ["ConsumerCoordinator", "ConsumerRebalanceListener"]

# What a commit the consumer makes by itself (auto commit, before a revocation) may
# be refused for and go on: fenced by a rebalance, or a partition deleted (or its
# log truncated) since its position was taken. Kafka logs these too.
COMMIT_REFUSALS = (CommitFailedError, UnknownTopicOrPartitionError, OffsetOutOfRangeError)


class ConsumerRebalanceListener:
    """Called from ``poll`` when the group's assignment of this consumer changes
    (Kafka's interface). Override what you need."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before partitions go to another member: commit what was processed. With
        an eager assignor, every partition is revoked before each rebalance."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """After the rebalance: the partitions added to this consumer."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """This consumer was fenced (missed its session, or was not polled within
        max_poll_interval_ms): the partitions may belong to others already, so
        committing is pointless. Kafka's default: treat them as revoked."""
        self.on_partitions_revoked(lost)


def offset_and_metadata(value) -> OffsetAndMetadata:
    """A commit's value: an offset, our OffsetAndMetadata, or any tuple with
    ``offset`` and ``metadata`` fields (kafka-python's has a third, leader_epoch)."""
    if isinstance(value, OffsetAndMetadata):
        return value
    if hasattr(value, "offset"):
        return OffsetAndMetadata(value.offset, getattr(value, "metadata", None) or "")
    return OffsetAndMetadata(value)


def remaining_ms(started: float, timeout_ms: int) -> int:
    return max(0, int(timeout_ms - (time.monotonic() - started) * 1000))


class ConsumerCoordinator:
    """The group work of one consumer with a ``group_id``.

    Parameters
    ----------
    member : GroupMember
        The consumer's membership of its group.
    subscriptions, fetcher, metadata
        The consumer's parts: the assignment it changes, the positions it commits,
        the partitions it takes on.
    enable_auto_commit, auto_commit_interval_ms
        Commit the positions from poll this often, before a revocation and on close.
    default_commit_callback : callable, optional
        ``commit_async``'s callback when it is given none.
    """

    def __init__(self, member: GroupMember, subscriptions: SubscriptionState,
                 fetcher: Fetcher, metadata: ConsumerMetadata, *, enable_auto_commit: bool,
                 auto_commit_interval_ms: int, default_commit_callback=None):
        self.member = member
        self.subscriptions = subscriptions
        self.fetcher = fetcher
        self.metadata = metadata
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000
        self.listener = ConsumerRebalanceListener()
        self.joining: concurrent.futures.Future | None = None     # a join under way
        self._paused_over_join: set[TopicPartition] = set()
        # commit_async: (future, offsets, callback) in the order sent, on one worker.
        self._async_commits: collections.deque = collections.deque()
        self._committer: concurrent.futures.ThreadPoolExecutor | None = None
        self._default_commit_callback = default_commit_callback
        self.commit_counts = RateWindow()        # metrics(): per commit
        fetcher.on_deleted = self._drop_deleted

    # -- the subscription --------------------------------------------------------------
    def subscribe(self, topics: tuple[str, ...], pattern: str | None,
                  listener: ConsumerRebalanceListener | None) -> None:
        """Subscribe through the group: the consumer joins at its next poll."""
        self.subscriptions.subscription = (tuple(sorted(set(topics))), pattern)
        self.listener = listener or ConsumerRebalanceListener()
        self.member.rejoin_needed = True

    def unsubscribe(self) -> None:
        """Give up the partitions (committing first when auto commit is on) and
        leave the group."""
        assigned = self.subscriptions.assigned
        self._commit_on_revoke(set(assigned))
        self.listener.on_partitions_revoked(set(assigned))
        # Also cancels a join under way: it ends in JoinCancelledError, which
        # nobody waits for, having left whatever it joined.
        self.member.leave()
        self.joining = None

    def _drop_deleted(self, gone: dict[TopicPartition, str]) -> None:
        """Subscribed partitions whose topic was deleted leave the assignment now, as
        lost (no commit: the partition has no log to commit to), and the member
        joins again so the group's assignment has them no more."""
        assigned = self.subscriptions.assigned
        self.fetcher.assign(sorted(set(assigned) - gone.keys()))
        self.subscriptions.deleted.update(gone)
        log.info("group %s: %s left the assignment: topic deleted", self.member.group_id,
                 ", ".join(f"{partition.topic}-{partition.partition}"
                           for partition in sorted(gone)))
        self.listener.on_partitions_lost(set(gone))
        self.member.rejoin_needed = True

    # -- a poll's group work -----------------------------------------------------------
    def step(self, started: float, timeout_ms: int) -> None:
        """The group's work within a poll: a member with partitions keeps consuming
        them while a join is under way; one with none waits for the join (up to the
        poll's timeout), as there is nothing else to do."""
        self.poll(0)
        if self.joining is not None and not self.subscriptions.assigned:
            self.poll(remaining_ms(started, timeout_ms))

    def work_due(self, now: float) -> bool:
        """While a poll waits (not on its hot path): is there group work it should
        stop waiting for? Also counts the wait as polling (Kafka's poll timer)."""
        member = self.member
        if self.subscriptions.subscription is None:
            return False
        member.last_poll = now
        if self.joining is not None:
            return self.joining.done()
        return member.rejoin_needed or member.lost or member.poll_timed_out

    def poll(self, timeout_ms: int) -> None:
        """Kafka's poll-time group work: act on being fenced, rejoin when the group
        rebalances (waiting at most ``timeout_ms`` for the rebalance; a join not done
        by then is picked up by a later poll), commit when auto commit is due."""
        member = self.member
        if self._async_commits:
            self._run_commit_callbacks(wait=False)
        member.last_poll = time.monotonic()
        if self.subscriptions.subscription is None:
            return
        if (member.lost or member.poll_timed_out) and self.joining is None:
            lost = set(self.subscriptions.assigned)
            self.fetcher.assign([])
            if lost:
                self.listener.on_partitions_lost(lost)
        deadline = time.monotonic() + timeout_ms / 1000
        while member.rejoin_needed or self.joining is not None:
            if not self._rejoin(max(0.0, deadline - time.monotonic())):
                break
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._auto_commit()

    def _rejoin(self, timeout_s: float) -> bool:
        """Start a join, or wait up to ``timeout_s`` for the one under way and apply
        its assignment; False while it is still under way. (A cooperative member
        keeps consuming what it holds meanwhile; an eager one holds nothing.)"""
        member = self.member
        assigned = self.subscriptions.assigned
        if self.joining is None:
            # Paused partitions stay paused if they come back (pause is the
            # application's flow control, not the group's).
            self._paused_over_join = self.subscriptions.paused()
            if not member.cooperative and assigned:
                # Eager: give up everything before joining (commit it first).
                revoked = set(assigned)
                self._commit_on_revoke(revoked)
                self.listener.on_partitions_revoked(revoked)
                self.fetcher.assign([])
            topics, pattern = self.subscriptions.subscription
            self.joining = member.start_join(topics, pattern, set(assigned))
        try:
            assignment = {TopicPartition(*partition)
                          for partition in self.joining.result(timeout=timeout_s)}
        except concurrent.futures.TimeoutError:
            return False
        finally:
            if self.joining.done():
                self.joining = None
        if member.lost or member.poll_timed_out:
            # Fenced after this join finished (it left, or missed its session): the
            # assignment is stale and the partitions may be another's. Lose them
            # all and join again.
            lost = set(assigned)
            self.fetcher.assign([])
            if lost:
                self.listener.on_partitions_lost(lost)
            member.rejoin_needed = True
            member.lost = member.poll_timed_out = False
            return True
        revoked = set(assigned) - assignment
        added = assignment - set(assigned)
        if revoked:
            # Given up first: dropping partitions is always safe. What this member
            # gave up reaches its new owner in the next generation, so join again
            # at once. (An eager member revoked everything before it joined; it
            # gets here only when the group moved from a cooperative assignor.)
            self._commit_on_revoke(revoked)
            self.listener.on_partitions_revoked(revoked)
            self.fetcher.assign(sorted(set(assigned) - revoked))
            member.rejoin_needed = True
        try:
            # Everything the new partitions need, before any of them is taken on, so
            # a failure leaves the assignment as it was, not half applied. Metadata
            # again: the rebalance may be for new topics or new partitions.
            committed = {}
            if added:
                self.metadata.refresh()
                for partition in added:
                    self.metadata.partition(*partition)
                committed = member.committed(added)
        except ShmlogError as error:
            log.warning("group %s: taking on %d partitions of generation %d failed (%s); "
                        "joining again", member.group_id, len(added), member.generation, error)
            member.rejoin_needed = True
            return True
        self.fetcher.assign(sorted(assignment))
        for partition in added:
            if partition in committed:
                assigned[partition].position = committed[partition][0]
            assigned[partition].paused = partition in self._paused_over_join
        self.listener.on_partitions_assigned(added)
        return True

    # -- commits -----------------------------------------------------------------------
    def _commit_on_revoke(self, partitions: set[TopicPartition]) -> None:
        if not (self.enable_auto_commit and partitions):
            return
        if self.member.lost or self.member.poll_timed_out:
            return                              # fenced: nothing may be committed
        try:
            self._commit_offsets({partition: OffsetAndMetadata(offset) for partition, offset
                                  in self.fetcher.positions(partitions).items()})
        except COMMIT_REFUSALS as error:
            log.warning("%s", error)

    def _auto_commit(self) -> None:
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000
        try:
            self._commit_offsets({partition: OffsetAndMetadata(offset) for partition, offset
                                  in self.fetcher.positions(self.subscriptions.assigned).items()})
        except COMMIT_REFUSALS as error:
            log.warning("auto commit: %s", error)

    def commit(self, offsets: Mapping | None) -> None:
        """Commit ``offsets`` (the positions by default), after the async commits
        made before (their callbacks run first)."""
        if self._async_commits:
            # Kafka's commitSync: the async commits before it finish (and their
            # callbacks run) first, so commits land in the order they were made.
            self._run_commit_callbacks(wait=True)
        self._commit_offsets(self._commit_entries(offsets))

    def _commit_entries(self, offsets) -> dict[TopicPartition, OffsetAndMetadata]:
        """A commit's offsets (the positions by default), checked."""
        if offsets is None:
            offsets = self.fetcher.positions(self.subscriptions.assigned)
        entries = {TopicPartition(*partition): offset_and_metadata(value)
                   for partition, value in offsets.items()}
        for partition, value in entries.items():
            if isinstance(value.offset, bool) or not isinstance(value.offset, int) or \
                    value.offset < 0:
                raise LocalProtocolError(f"offset for {partition} must be a non-negative "
                                         f"integer, got {value.offset!r}")
        return entries

    def _commit_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                        as_member: bool | None = None) -> None:
        if offsets:
            self.member.commit({partition: (value.offset, value.metadata)
                                for partition, value in offsets.items()},
                               as_member=self.subscriptions.subscription is not None
                               if as_member is None else as_member)
            self.commit_counts.record(1)

    def commit_async(self, offsets: Mapping | None, callback) -> concurrent.futures.Future:
        """Send a commit on the worker thread; its callback runs in a later poll."""
        entries = self._commit_entries(offsets)
        if self._committer is None:
            self._committer = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"shmlog-commit-{self.member.group_id}")
        if len(self._async_commits) >= limits.ASYNC_COMMITS_IN_FLIGHT_MAX:
            concurrent.futures.wait([self._async_commits[0][0]])
            self._run_commit_callbacks(wait=False)
        future = self._committer.submit(self._commit_offsets, entries,
                                        self.subscriptions.subscription is not None)
        self._async_commits.append((future, entries,
                                    callback or self._default_commit_callback))
        return future

    def _run_commit_callbacks(self, wait: bool) -> None:
        """Run the callbacks of finished async commits, oldest first (with ``wait``,
        of all of them, waiting for each)."""
        while self._async_commits:
            future, offsets, callback = self._async_commits[0]
            if not wait and not future.done():
                return
            error = future.exception()
            self._async_commits.popleft()
            if callback is None:
                if error is not None:
                    log.warning("async commit of %d offsets failed: %s", len(offsets), error)
                continue
            try:
                callback(offsets, error)
            except Exception:
                log.exception("an offset commit callback raised")

    def committed(self, partitions: Iterable[TopicPartition]) -> dict:
        """{(topic, partition): (offset, metadata)} of those the group committed."""
        return self.member.committed(partitions)

    def close(self, autocommit: bool) -> None:
        """Run the async commits' callbacks, commit (``autocommit``, when auto commit
        is on and the consumer subscribed) and leave the group."""
        if self._async_commits:
            self._run_commit_callbacks(wait=True)
        if self._committer is not None:
            self._committer.shutdown()
        if autocommit and self.subscriptions.subscription is not None:
            self._commit_on_revoke(set(self.subscriptions.assigned))
        self.member.close()

    def metrics(self) -> dict:
        """``consumer-coordinator-metrics`` (see ``Consumer.metrics``)."""
        return {"commit-total": self.commit_counts.total,
                "commit-rate": self.commit_counts.rate(),
                "assigned-partitions": len(self.subscriptions.assigned)}
