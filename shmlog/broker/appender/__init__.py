"""The appender: drains every producer's ring into the partition logs.

Its face: ``from shmlog.broker.appender import Appender, HighWatermarkPolicy, ...``.

Rules
-----
* Every batch is validated (length, magic, version, CRC32C, record structure)
  before a byte of it reaches a log; a bad batch is completed back to its producer
  with a negative :class:`CompletionCode` and never appended.
* A ring whose bytes cannot be entries is poisoned: its entries before the damage
  stand, nothing after it is read, and ``consumer_error`` tells the producer.
* Offsets come from the log; the partition's row in the state table is published
  (high watermark last, release) after each batch, so consumers see it at once.
* An entry is appended only to the partition it names: its topic key and
  partition number, not its row, decide. An entry whose row is not that
  partition's (the topic was deleted and the row reused, or the rows were handed
  out anew after a crash that lost ``partition-rows.json``) goes to the partition
  of that identity if this appender hosts it, else it is refused with
  ``UNKNOWN_PARTITION``. Entries for an internal topic (``__consumer_offsets``,
  which only the broker writes) are refused with ``INTERNAL_TOPIC``.
* Releasing an entry's ring space and completing it are two steps. The space goes
  back to the producer as soon as the batch is copied into the log (or refused).
  The completion (its result, then the acknowledged count) is stored at once,
  unless the ring awaits the high watermark (``add_ring(...,
  awaits_high_watermark=True)``: a producer with acks=all): then it is *parked*
  until the partition's high watermark covers the batch's last offset, as Kafka's
  ReplicaManager holds an acks=all produce in purgatory (``completions``).
* The high watermark follows a per-row :class:`HighWatermarkPolicy`: ``LOG_END``
  or ``EXTERNAL`` (replication moves it: ``partition_rows``).
* acks=all and ``min.insync.replicas`` (Kafka's ``Partition.appendRecordsToLeader``
  and ``checkEnoughReplicasReachOffset``): while a partition is marked under min
  ISR (:meth:`Appender.set_under_min_isr`), an entry of an acks=all ring bound for
  it is refused with ``NOT_ENOUGH_REPLICAS`` before anything else is looked at
  (nothing appended, no sequence used); a parked acks=all batch whose partition is
  under min ISR when the high watermark covers it completes with
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` (it is in the log, its sequence used).
  Entries of other rings never look at the mark.
* A leader marked fenced (:meth:`Appender.set_fenced`: it may have been replaced
  and must acknowledge no acks=all entry, yet not resign) refuses acks=all entries
  with ``NOT_LEADER_OR_FOLLOWER``, before the min ISR mark is looked at; acks=0/1
  entries are not affected. Cluster mode no longer sets it on a suspended
  ZooKeeper session (``cluster.replication.hosted_replicas``: Kafka's leader goes
  on serving then).
* A parked completion the high watermark will never cover (its partition went, its
  offsets were truncated away after a leadership change) is refused
  (:meth:`Appender.refuse_parked`, :meth:`Appender.refuse_parked_from`): it
  completes with the code given once those before it in its ring have.
* An entry bound for a partition another broker leads (:meth:`Appender.set_is_leader`)
  is refused with ``NOT_LEADER_OR_FOLLOWER``, unless a forwarder is set
  (:meth:`Appender.set_forwarder`, cluster mode): then it is handed to the leader
  (``appender``). Entries for partitions this broker leads never take that path:
  the compiled loop is unchanged for them.
* Every batch appended to a partition (compiled path, slow path,
  :meth:`Appender.append`) is stamped with its row's leader epoch
  (:meth:`Appender.set_leader_epoch`, 0 until replication sets one), as Kafka's
  leader stamps ``partitionLeaderEpoch``.
* Idempotent producers: a re-sent batch is acknowledged with its original offsets
  and not appended again; a sequence out of order or an older epoch is refused
  (``producer_state``).

Theory of operation
-------------------
The modules, lowest first:

* ``layout``: the columns of the appender's tables and the compiled loop's codes;
* ``producer_state``: idempotence, what is remembered of each producer per partition;
* ``completions``: finishing an entry, and the parked completions;
* ``drain``: the compiled loop, and the kernels every entry passes through;
* ``partition_rows``: the hosted partitions by row, their views, settings and marks;
* ``rings``: the rings drained by slot, and their parked completions' queues;
* ``log_appends``: the appends made in Python through a partition's log, and the
  bookkeeping every append leaves (producer state, partitions appended to);
* ``appender``: :class:`Appender`, which composes them, drives the loop and runs the
  slow path (one entry at a time in Python) and forwarding.

The compiled loop finishes the common entry (one uncompressed batch for a CreateTime
partition) without Python; anything else it hands back one entry at a time, and the
slow path appends it through ``PartitionLog.append`` or refuses it, then calls the
loop again. Per-record work never happens in Python.
"""

from ...shm.completion import SEQUENCE_MODULUS, CompletionCode
from .appender import Appender, ForwardedEntry
from .layout import DRAIN_ENTRIES_MAX, HighWatermarkPolicy

__all__ = ["Appender", "CompletionCode", "ForwardedEntry", "HighWatermarkPolicy",
           "DRAIN_ENTRIES_MAX", "SEQUENCE_MODULUS"]
