"""The leader's incremental fetch sessions, sans-I/O (KIP-227; Kafka's
``FetchSession.scala``): what each follower fetches, cached, and which of those
partitions have news for it.

Rules
-----
* **A session opens with a full fetch** (epoch 0): the leader assigns an id and
  caches each partition's request (fetch offset, log start, leader epoch, bytes).
  A peer has one session per leader (its fetcher's): opening one closes the peer's
  older ones.
* **Later fetches** carry the id and the next epoch, name only the partitions
  added or whose request changed, and list those forgotten. An unknown id is
  ``FETCH_SESSION_ID_NOT_FOUND``, another epoch ``INVALID_FETCH_SESSION_EPOCH``:
  the follower then fetches in full again.
* **News**: a partition of a session has news when it was appended to, its high
  watermark or log start passed what the follower was last sent, or its
  leadership changed. The append, high-watermark, log-start and leadership paths
  mark it (:meth:`FetchSessionCache.mark`) in every session holding it; a fetch
  serves only its named partitions and its news, so an idle session costs nothing
  per partition.
* **Eviction**: at most ``limits.FETCH_SESSION_CACHE_SLOTS_MAX`` sessions (the
  least recently used goes to make room), and none unused for
  ``limits.FETCH_SESSION_IDLE_EVICTION_MS``.

Theory of operation
-------------------
:class:`FetchSessionCache` keeps the sessions in the order they were last used
(an ``OrderedDict``: eviction pops its front) and, per partition, the sessions
holding it, so marking news costs per session holding the partition (its
followers), not per partition led. ``fetch_serving`` does the I/O: it serves the
partitions a fetch names plus the session's news, parks the fetch when neither has
anything to return, and answers it when :meth:`FetchSessionCache.mark` reports news
for a session with a fetch parked.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
from typing import Any, Hashable

from ...common import limits
from .messages import INT32_MAX, ErrorCode, FetchPartition

__all__ = ["SessionPartition", "FetchSession", "FetchSessionCache"]


@dataclasses.dataclass
class SessionPartition:
    """One partition of a session: its cached request, what its follower was last
    sent, and whether it was appended to since its follower was last served."""
    request: FetchPartition
    high_watermark_sent: int = -1
    log_start_sent: int = -1
    appended: bool = False


@dataclasses.dataclass
class FetchSession:
    """One follower's session with this leader."""
    session_id: int
    peer: int
    epoch: int                        # the epoch its next fetch must carry
    last_used_ms: int
    partitions: dict[Hashable, SessionPartition] = dataclasses.field(default_factory=dict)
    news: dict[Hashable, None] = dataclasses.field(default_factory=dict)
    parked: Any = None                # the purgatory key of its fetch waiting, if any


class FetchSessionCache:
    """The sessions of the followers fetching from this leader (see the module's
    rules)."""

    def __init__(self, slots: int = limits.FETCH_SESSION_CACHE_SLOTS_MAX,
                 idle_eviction_ms: int = limits.FETCH_SESSION_IDLE_EVICTION_MS):
        self.slots = slots
        self.idle_eviction_ms = idle_eviction_ms
        self._sessions: collections.OrderedDict[int, FetchSession] = collections.OrderedDict()
        self._by_partition: dict[Hashable, dict[int, FetchSession]] = {}
        # A random first id: a follower still holding a session of this leader's
        # previous incarnation finds its id unknown, not another session's.
        self._ids = itertools.count(random.randrange(1, INT32_MAX // 2))

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, peer: int, now: int) -> tuple[FetchSession, list[FetchSession]]:
        """A new session for ``peer``; also the sessions closed for it (the peer's
        older ones, the least recently used when the cache is full)."""
        closed = [session for session in self._sessions.values() if session.peer == peer]
        for session in closed:
            self.close(session)
        while len(self._sessions) >= self.slots:
            oldest = next(iter(self._sessions.values()))
            self.close(oldest)
            closed.append(oldest)
        session_id = self._next_id()
        session = FetchSession(session_id, peer, 1, now)
        self._sessions[session_id] = session
        return session, closed

    def _next_id(self) -> int:
        while True:
            session_id = next(self._ids) % INT32_MAX or next(self._ids)
            if session_id not in self._sessions:
                return session_id

    def lookup(self, session_id: int, epoch: int, peer: int, now: int
               ) -> tuple[FetchSession | None, ErrorCode]:
        """The session an incremental fetch continues, and moves its epoch on; or
        the session error to answer."""
        session = self._sessions.get(session_id)
        if session is None or session.peer != peer:
            return None, ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        if epoch != session.epoch:
            return None, ErrorCode.INVALID_FETCH_SESSION_EPOCH
        session.epoch = 1 if session.epoch >= INT32_MAX else session.epoch + 1
        session.last_used_ms = now
        self._sessions.move_to_end(session_id)
        return session, ErrorCode.NONE

    def close(self, session: FetchSession) -> None:
        """Forget a session and its partitions."""
        if self._sessions.pop(session.session_id, None) is None:
            return
        for key in list(session.partitions):
            self.remove_partition(session, key)

    def evict_idle(self, now: int) -> list[FetchSession]:
        """Close the sessions unused for the idle eviction time; those closed."""
        evicted = []
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used_ms < self.idle_eviction_ms:
                break
            self.close(oldest)
            evicted.append(oldest)
        return evicted

    def set_partition(self, session: FetchSession, request: FetchPartition) -> SessionPartition:
        """Cache a partition's request (added or changed)."""
        key = (request.topic_key, request.partition)
        entry = session.partitions.get(key)
        if entry is None:
            entry = session.partitions[key] = SessionPartition(request)
            self._by_partition.setdefault(key, {})[session.session_id] = session
        else:
            entry.request = request
        return entry

    def remove_partition(self, session: FetchSession, key: Hashable) -> None:
        """A partition leaves a session (forgotten, or answered with an error)."""
        if session.partitions.pop(key, None) is None:
            return
        session.news.pop(key, None)
        holding = self._by_partition.get(key)
        if holding is not None:
            holding.pop(session.session_id, None)
            if not holding:
                del self._by_partition[key]

    def holding(self, key: Hashable) -> list[FetchSession]:
        """The sessions holding a partition."""
        holding = self._by_partition.get(key)
        return list(holding.values()) if holding else []

    @staticmethod
    def mark(session: FetchSession, key: Hashable) -> bool:
        """Give a session's partition news; True when the session has a fetch parked
        (to answer now)."""
        session.news[key] = None
        return session.parked is not None
