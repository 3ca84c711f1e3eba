"""The idempotent producer's identity (the idempotent part of Kafka's
``TransactionManager``, KIP-360): the producer id and epoch, each partition's next
sequence, and the epoch bump that starts a partition again after the broker refused
one of its batches.

Rules
-----
* Every method runs under the producer's lock.
* Without idempotence (``enable_idempotence=False``, or acks=0, as in Kafka) the
  producer id is -1 and batches carry no identity; nothing here is kept but the
  sequences, which no batch carries then.
* A sequence moves on only once its batch is in the ring (:meth:`EpochManager.sent`):
  a batch refused before that leaves no gap the broker would take for a lost one.
* The broker takes a higher epoch only at sequence 0 and fences a lower one, so a
  partition moves to a new epoch only when nothing of it is in flight, from
  sequence 0: then nothing is appended twice.

Theory of operation
-------------------
Batches carry the producer id, the epoch their partition runs under and the
partition's next sequence (:meth:`EpochManager.identity`). A batch the broker refuses
(too large, storage error, corrupt; with acks=all ``NOT_ENOUGH_REPLICAS``,
``NOT_LEADER_OR_FOLLOWER`` and ``REQUEST_TIMED_OUT``, whose batch may or may not be in
the log: the new epoch starts at 0 either way) uses up no sequence there, so every
batch of that partition already in flight behind it comes back out of order, never
appended. The sender reports the refusal (:meth:`EpochManager.sequence_broken`); the
batches it kept out are held, with their bytes (:meth:`EpochManager.hold`), until
nothing of that partition is in flight (:meth:`EpochManager.restartable`). Then the
epoch is bumped (a new producer id from the broker once the epochs are used up:
Kafka's InitProducerId), the partition starts again at sequence 0
(:meth:`EpochManager.restart`) and the sender sends the first held batch again, and
the others (``following``) once the broker appended it: a broker that holds nothing
of this producer for the partition takes its first batch at any sequence (Kafka's
rule too), so were the first refused again, one behind it would be appended ahead
of it. Batches shipped meanwhile join ``following``; a refusal of the first puts
them back behind what it holds (:meth:`EpochManager.defer_following`).
Other partitions move to the new epoch, from sequence 0, the next time they have
nothing in flight. A batch refused as too large and split (KIP-126) is such a
refusal: its parts are held first, before the batches behind it, so they are sent
again where it was, under the new epoch, with sequences of their own (the refused
batch used none: the broker deduplicates the parts as any batch).
``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` is not reported: that batch is in the log and
its sequence used, so nothing is sent again and the epoch stays.
"""

from __future__ import annotations

from ..common.errors import ShmlogError
from ..protocol.control_client import request
from ..record import batch_layout as B
from ..shm.completion import SEQUENCE_MODULUS

__all__ = ["EpochManager"]

class EpochManager:
    """One producer's id, epochs and sequences, by partition (``(topic, partition)``).

    Parameters
    ----------
    data_dir : str
        The broker's data directory (asked for a new producer id).
    ring_name : str
        The producer's ring, as registered with the broker.
    registration : dict
        The broker's answer to ``register_producer``: the producer id and epoch.
    idempotent : bool
        Whether batches carry them.
    """

    def __init__(self, data_dir: str, ring_name: str, registration: dict, idempotent: bool):
        self.data_dir, self.ring_name = data_dir, ring_name
        self.producer_id = registration["producer_id"] if idempotent else -1
        self.producer_epoch = registration["producer_epoch"] if idempotent else -1
        self.sequences: dict[tuple[str, int], int] = {}
        self.epochs: dict[tuple[str, int], int] = {}     # the epoch the sequences run under
        self.in_flight_counts: dict[tuple[str, int], int] = {}   # batches in the ring
        # Partitions whose sequence a refused batch broke: the batches it kept out,
        # to send again under a new epoch once nothing of the partition is in flight.
        self.resend: dict[tuple[str, int], list] = {}
        # Partitions started again whose first batch is in flight: the batches to send
        # once the broker appended it (see the module's theory of operation).
        self.following: dict[tuple[str, int], list] = {}
        # A transactional producer's TransactionManager (None: not transactional): its
        # coordinator gives the id and epochs, and a refused batch is never sent again.
        self.transactions = None

    def adopt(self, producer_id: int, producer_epoch: int) -> None:
        """The transaction coordinator's producer id and epoch (init_transactions):
        every partition starts again from sequence 0 under them (lock held)."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.sequences, self.epochs = {}, {}
        self.resend, self.following = {}, {}

    def identity(self, topic: str, partition: int) -> dict:
        """Producer id, epoch and the next batch's first sequence."""
        if self.producer_id < 0:
            return {"producer_id": B.NO_PRODUCER_ID, "producer_epoch": B.NO_PRODUCER_EPOCH,
                    "base_sequence": B.NO_SEQUENCE}
        key = (topic, partition)
        epoch = self.epochs.setdefault(key, self.producer_epoch)
        if epoch != self.producer_epoch and not self.in_flight_counts.get(key):
            # The epoch was bumped (for another partition): this one follows once
            # nothing of it is in flight, from sequence 0 as the broker requires.
            epoch = self.epochs[key] = self.producer_epoch
            self.sequences[key] = 0
        if self.transactions is not None:
            self.transactions.ensure_added(topic, partition)
            return {"producer_id": self.producer_id, "producer_epoch": epoch,
                    "base_sequence": self.sequences.get(key, 0), "transactional": True}
        return {"producer_id": self.producer_id, "producer_epoch": epoch,
                "base_sequence": self.sequences.get(key, 0)}

    def sent(self, key: tuple[str, int], count: int) -> None:
        """A batch of ``count`` records of the partition is in the ring: its sequence
        moves on, and (idempotent) it is in flight until :meth:`completed`."""
        self.sequences[key] = (self.sequences.get(key, 0) + count) % SEQUENCE_MODULUS
        if self.producer_id >= 0:
            self.in_flight_counts[key] = self.in_flight_counts.get(key, 0) + 1

    def completed(self, key: tuple[str, int]) -> None:
        """The broker completed a batch of the partition (appended or not): one less in
        flight, for the idempotent producer (what :meth:`sent` counted)."""
        if self.producer_id >= 0:
            self.in_flight_counts[key] -= 1

    def identity_to_restamp(self) -> dict:
        """An identity to encode a batch with that :meth:`restart` sends again, whose
        header the sender stamps with the partition's then (``restamp_batch``)."""
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "base_sequence": 0}

    def hold(self, key: tuple[str, int], batch) -> bool:
        """An out-of-order batch: held to be sent again (True) when a refused batch
        before it broke the partition's sequence."""
        held = self.resend.get(key)
        if held is None:
            return False
        held.append(batch)
        return True

    def sequence_broken(self, key: tuple[str, int]) -> None:
        """The broker refused a batch of the partition and took none of its sequences:
        every batch of the partition in flight behind it comes back out of order."""
        if self.producer_id >= 0:
            self.resend.setdefault(key, [])

    def restartable(self) -> list[tuple[str, int]]:
        """The partitions whose sequence broke and that have nothing in flight now."""
        return [key for key in self.resend if not self.in_flight_counts.get(key)]

    def restart(self, key: tuple[str, int]) -> list | None:
        """Start a :meth:`restartable` partition again under a new epoch, from
        sequence 0; the batches to send again, in order (None: no broker answered for
        a new producer id; try again later)."""
        if self.epochs.get(key, self.producer_epoch) == self.producer_epoch \
                and not self.bump_epoch():
            return None
        held = self.resend.pop(key)
        self.epochs[key] = self.producer_epoch
        self.sequences[key] = 0
        return held

    def bump_epoch(self) -> bool:
        """The next epoch, or a new producer id once this one's are used up (Kafka's
        InitProducerId), under which every partition starts again. False when no
        broker answered."""
        if self.producer_epoch < B.PRODUCER_EPOCH_MAX:
            self.producer_epoch += 1
            return True
        try:
            reply = request(self.data_dir, "init_producer_id", ring=self.ring_name)
        except ShmlogError:
            return False
        self.producer_id, self.producer_epoch = reply["producer_id"], reply["producer_epoch"]
        self.epochs = dict.fromkeys(self.epochs, self.producer_epoch)
        self.sequences = {}
        return True

    def defer_following(self, key: tuple[str, int]) -> None:
        """The first batch sent again after a restart was refused: the batches that
        were to follow it are held behind what the refusal holds (lock held)."""
        following = self.following.pop(key, None)
        if following:
            self.resend.setdefault(key, []).extend(following)

    def held(self) -> list:
        """The batches held to be sent again, every partition's, in order."""
        return [batch for held in (*self.resend.values(), *self.following.values())
                for batch in held]

    def forget(self, topic: str) -> list:
        """Drop the topic's partitions (the broker hosts it no more); the batches
        held for them, which will never be sent."""
        for known in (self.sequences, self.epochs):
            for key in [key for key in known if key[0] == topic]:
                del known[key]
        return [batch for waiting in (self.resend, self.following)
                for key in [key for key in waiting if key[0] == topic]
                for batch in waiting.pop(key)]

    def registered_again(self, registration: dict) -> None:
        """The broker took the ring again (it may have restarted): its producer id,
        unless a transaction coordinator gave this producer its identity
        (``init_transactions``): that one is the coordinator's, and holds across a
        restart of the broker."""
        if self.producer_id >= 0 and self.transactions is None:
            self.producer_id = registration["producer_id"]
