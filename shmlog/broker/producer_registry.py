"""The producers a broker serves: their rings, their producer ids, and reclaiming
what a producer that left or died leaves behind.

Rules
-----
* A producer makes its ring under the broker's shared-memory prefix and registers
  it; the broker drains it from then on and hands out a producer id that no earlier
  run of this broker handed out (``producer-ids.json`` holds the end of the block of
  ids in use, written before any id of the block is); a cluster member hands out ids
  no broker of its cluster handed out (``cluster_producer_ids``: blocks drawn from
  ZooKeeper).
* Nothing outlives its use: the ring of a producer that leaves (or dies) is drained,
  unmapped and removed, and its slot in the appender's ring table reused; rings
  under the broker's prefix that nobody registered are registered at start (their
  entries are drained) and reaped once their maker is gone; while running, an
  unregistered ring whose maker is gone is reclaimed by the liveness check.
* At most ``producers_max`` rings are drained at once: a producer registering past
  it is refused with :class:`TooManyProducersError` (its ring never mapped here; it
  removes it). Rings adopted at start or by the liveness check are drained whatever
  their number: they may hold entries, and nothing put in a ring is left undrained.
* Rings under the prefix that are not ours to reclaim (another user's who may not
  produce here, an unreadable one, one of another version) are left alone, with a
  warning, once.
* A ring registered with acks=-1 ("all") awaits the high watermark (the appender's
  ``awaits_high_watermark``); registering again with other acks changes that. A
  ring adopted (its producer's acks unknown) is taken as acks=all
  (``ADOPTED_RING_ACKS``): its entries are never acknowledged before the in-sync
  replicas have them, whatever its producer asked, until the producer registers
  again (with a single broker the two are the same).

Theory of operation
-------------------
Every ring's header holds the pid of the process that made it (``ring.maker_pid``),
written microseconds after the shared-memory object is created: a ring with no pid
yet is being made, and one left so for ``limits.RING_CREATION_GRACE_S`` lost its maker in
between. A producer that died leaves its published entries (drained and appended)
and at most one unpublished, partial entry (never read), so reclaiming is: drain,
stop reading the ring, unmap it, unlink it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource

from ..common import access, limits
from ..common.child_process import process_alive
from ..common.errors import (
    LocalProtocolError,
    ShmlogError,
    StorageError,
    TooManyProducersError,
)
from ..ring import MAKER_PENDING, MAKER_UNKNOWN, Ring, maker_pid
from ..shm import ring_layout as R
from ..shm import shared_memory
from ..shm.state import bells_name
from ..storage.durable_files import write_atomically
from .partition_host import PartitionHost

# The broker's log: operators read one logger for the broker's work.
log = logging.getLogger("shmlog.broker")

__all__ = ["ProducerRegistry", "ProducerIds", "ADOPTED_RING_ACKS"]

# An adopted ring's producer said no acks to this broker: the strictest is assumed, so an
# acks=all producer's entries are never acknowledged early after a broker restart (an
# acks=0/1 one's wait for the in-sync replicas too, until it registers again).
ADOPTED_RING_ACKS = -1


class ProducerIds:
    """Producer ids, unique across broker restarts: handed out from blocks whose
    end is written to ``producer-ids.json`` before any id of the block is used."""

    FILE = "producer-ids.json"
    BLOCK_SIZE = 1000            # ids per write of the file

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, self.FILE)
        try:
            with open(self.path) as source:
                start = int(json.load(source)["next_block"])
        except FileNotFoundError:
            start = 0
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise StorageError(f"{self.path} is unreadable ({error}); producer ids cannot be "
                               f"handed out safely: restore or remove it") from None
        self._next = self._end = start

    def allocate(self) -> int:
        """A producer id never handed out before."""
        if self._next == self._end:
            self._end = self._next + self.BLOCK_SIZE
            write_atomically(self.path, json.dumps({"next_block": self._end}))
        self._next += 1
        return self._next - 1




class ProducerRegistry:
    """The registered rings (by name) and their producer ids, drained into ``host``.

    Parameters
    ----------
    prefix : str
        The broker's shared-memory prefix: its producers' rings are named under it.
    host : PartitionHost
        Whose appender drains the rings.
    producers_max : int
        The most rings registered by their producers at once (the broker's
        ``producers_max``).
    """

    def __init__(self, prefix: str, host: PartitionHost, *,
                 producers_max: int = limits.PRODUCERS_MAX_DEFAULT):
        self.prefix = prefix
        self.host = host
        self.producers_max = producers_max
        self.rings: dict[str, tuple[Ring, int]] = {}    # ring name -> (ring, producer id)
        self._ignored_rings: set[str] = set()          # under our prefix, not ours to reclaim
        # Replaced by a cluster member's (cluster_producer_ids): any object with allocate().
        self.producer_ids = ProducerIds(host.data_dir)

    def register(self, name: str, acks: int = 1, *, adopted: bool = False) -> tuple[int, int]:
        """Start draining the ring ``name`` (made under our prefix), its entries
        completed as ``acks`` asks (-1: once the high watermark covers them); (its
        index in the appender's ring table or -1 when it was poisoned already, its
        producer id). A ring registered already keeps its id; its acks change. An
        ``adopted`` ring (no producer asked) is drained past ``producers_max``.

        Raises
        ------
        LocalProtocolError
            The name is not under our prefix.
        TooManyProducersError
            ``producers_max`` rings are drained already (not for an adopted ring).
        """
        if not name.startswith(self.prefix + "-"):
            raise LocalProtocolError(f"ring {name!r} must be named under {self.prefix!r}")
        if name not in self.rings and not adopted and len(self.rings) >= self.producers_max:
            raise TooManyProducersError(
                f"this broker drains {len(self.rings)} producers' rings, its producers_max "
                f"({self.producers_max}): close a producer first, or start the broker with a "
                f"larger producers_max (shmlog broker --producers-max N, or producers_max in "
                f"its config file); each producer takes its ring_size of {shared_memory.DIRECTORY} "
                f"and one mapping of the broker's")
        appender = self.host.appender
        awaits_high_watermark = acks == -1
        if name not in self.rings:
            producer_id = self.producer_ids.allocate()   # first: it may refuse (a cluster's)
            attached = self._attach(name)
            self.rings[name] = (attached, producer_id)
            appender.add_ring(attached, awaits_high_watermark=awaits_high_watermark)
            log.info("producer ring %s registered (acks %d)", name, acks)
        attached, producer_id = self.rings[name]
        index = appender.index_of(attached)
        if index is not None:
            appender.set_awaits_high_watermark(index, awaits_high_watermark)
        self.host.drain_soon()
        return -1 if index is None else index, producer_id

    def _attach(self, name: str) -> Ring:
        """Map the ring; a limit of the broker's process hit on the way is a
        :class:`TooManyProducersError` naming it (CPython's mmap keeps a descriptor
        per mapping: a ring costs the broker an open file and a mapping)."""
        try:
            return Ring.attach(name)
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                limit = (f"the broker's open files (RLIMIT_NOFILE {soft}/{hard}, one per "
                         f"producer's ring): raise the broker's limit (ulimit -n, systemd's "
                         f"LimitNOFILE)")
            elif error.errno == errno.ENOMEM:
                limit = ("the broker's memory mappings (vm.max_map_count, one per producer's "
                         "ring) or its memory: raise sysctl vm.max_map_count")
            else:
                raise
            raise TooManyProducersError(
                f"cannot map ring {name!r} after {len(self.rings)} producers: {error.strerror}; "
                f"{limit}, or lower producers_max ({self.producers_max}) so producers are "
                f"refused before it") from None

    def new_producer_id(self, name: str) -> int:
        """A new producer id for a registered ring (Kafka's InitProducerId)."""
        if name not in self.rings:
            raise LocalProtocolError(f"ring {name!r} is not registered: register_producer first")
        attached, _ = self.rings[name]
        self.rings[name] = (attached, self.producer_ids.allocate())
        return self.rings[name][1]

    def unregister(self, name: str) -> None:
        """Drain what the producer published, then forget its ring and unmap it."""
        registered = self.rings.pop(name, None)
        if registered is not None:
            appender = self.host.appender
            appender.drain()
            index = appender.index_of(registered[0])
            if index is not None:              # else poisoned: removed already
                appender.remove_ring(index)

    def check_liveness(self, now: int) -> None:
        """The periodic check: drain (a safety net under the doorbell), adopt the
        rings left by producers that are gone, reclaim those of dead producers."""
        self.host.drain_soon()
        self.adopt_left_rings(include_alive=False)
        self.reap_dead_producers()

    def reap_dead_producers(self) -> None:
        """A producer that died leaves its published entries (appended here) and at
        most one unpublished, partial entry (never read): drain, then reclaim."""
        for name, (ring, _) in list(self.rings.items()):
            # A poisoned ring was unmapped when the appender stopped reading it.
            pid = int(ring.words[R.PRODUCER_PID_WORD]) \
                if self.host.appender.index_of(ring) is not None else 0
            if pid and process_alive(pid):
                continue
            log.warning("producer ring %s: process %d is gone; reclaiming the ring", name, pid)
            self.unregister(name)
            shared_memory.unlink(name)

    def adopt_left_rings(self, *, include_alive: bool) -> None:
        """Register the rings under our prefix that no producer registered with us,
        so that the entries in them are drained and :meth:`reap_dead_producers`
        reclaims those whose producer is gone: at start, all of them (left by a
        broker that stopped or died; a live producer registers again anyway); later,
        those whose maker is gone (it died before it registered, or between
        unregistering and removing its ring). A ring still being made (no pid in its
        header yet) is given limits.RING_CREATION_GRACE_S."""
        names = shared_memory.names(self.prefix + "-")
        self._ignored_rings &= set(names)
        for name in names:
            if name in (self.host.table_name, bells_name(self.host.table_name)) or \
                    name in self.rings or \
                    name in self._ignored_rings:
                continue
            try:
                pid = maker_pid(name)
                owner, group, age_s = shared_memory.owner_and_age_s(name)
            except FileNotFoundError:
                continue
            except OSError as error:
                self._ignore_ring(name, f"it cannot be read ({error})")
                continue
            refusal = self._refusal(owner, group, pid)
            if refusal is not None:
                self._ignore_ring(name, refusal)
                continue
            if pid == MAKER_PENDING and age_s < limits.RING_CREATION_GRACE_S:
                continue
            if pid != MAKER_PENDING and not include_alive and process_alive(pid):
                continue
            try:
                self.register(name, acks=ADOPTED_RING_ACKS, adopted=True)
            except ShmlogError as error:
                self._ignore_ring(name, str(error))

    @staticmethod
    def _refusal(owner: int, group: int, pid: int) -> str | None:
        """Why a ring under our prefix is not ours to adopt, or None."""
        if owner != os.geteuid() and group != access.current().group_id:
            # Not a producer's we serve: nobody else may make us map and read it.
            return (f"it belongs to {access.owner_name(owner)}, gid {group}, who may not "
                    f"produce here")
        if pid == MAKER_UNKNOWN:
            return "it is not a ring of this version"
        return None

    def _ignore_ring(self, name: str, reason: str) -> None:
        log.warning("leaving %s in %s alone: %s", name, shared_memory.DIRECTORY, reason)
        self._ignored_rings.add(name)
