"""Idempotent producers' state across rolls, restarts and truncation (design note
section 4.5, item 1): a producer whose last batch sits in an older segment is
still known after the partition is opened again or truncated, so its re-send is
acknowledged with the original offset, not appended twice.

Goal: "roll, reopen, re-send the last batch: deduped", after a clean close and
after a crash, with the producer snapshots there, missing or damaged; each of the
last five batches (Kafka's window) recognised after a restart, from snapshots of
this version or the one before; after a
truncation that keeps or removes the producer's batch; retention forgetting a
producer whose batches are gone; the header walk against a plain Python model.

Method: a real LogManager, partition logs on disk with small segments and a real
appender with a state table in /dev/shm; a crash is a log abandoned without
closing (mappings dropped, nothing flushed or sealed).
"""

from __future__ import annotations

import json
import os
import random
import uuid

import numpy as np
import pytest

from helpers import abandon
from shmlog import LogManager
from shmlog.broker.appender import Appender, CompletionCode
from shmlog.broker.appender.producer_state import (
    SEQUENCE_DUPLICATE,
    SEQUENCE_FENCED,
    SEQUENCE_NEW,
    SEQUENCE_OUT_OF_ORDER,
    ProducerStateTable,
)
from shmlog.common.limits import PRODUCER_BATCHES_MAX
from shmlog.native import typed_containers as typed
from shmlog.record import batch_layout as B
from shmlog.record.records import encode_batch
from shmlog.segments import PartitionLog
from shmlog.shm.completion import SEQUENCE_MODULUS
from shmlog.shm.state import PartitionStateTable, unlink_table
from shmlog.storage.producer_snapshots import SNAPSHOT_SUFFIX, ProducerState, snapshot_offsets
from shmlog.storage.producer_window import WINDOW_WORDS
from shmlog.storage.topic_config import TopicConfig

SMALL = {"segment.bytes": 8 << 10, "index.interval.bytes": 256, "segment.index.bytes": 4096}


def producer_batch(producer_id: int, sequence: int, count: int = 4, size: int = 60):
    return encode_batch([b"%d-%d-%d" % (producer_id, sequence, index) + b"." * size
                         for index in range(count)],
                        producer_id=producer_id, producer_epoch=0, base_sequence=sequence)


class Broker:
    """A data directory with topic "t" and an appender hosting t-0; opened again
    by :meth:`restart` (after a clean close or a crash)."""

    def __init__(self, directory):
        self.directory = directory
        self.name = f"shmlog-test-{os.getpid()}-{uuid.uuid4().hex[:6]}-state"
        self.table = PartitionStateTable.create(self.name, 8)
        self.logs = LogManager(directory)
        self.logs.create_topic("t", 1, SMALL)
        self.other_sequence = 0          # the next sequence of bury()'s producer
        self._host()

    def _host(self):
        self.appender = Appender(self.logs, self.table)
        self.row = self.appender.register_partition("t", 0)

    @property
    def log(self):
        return self.logs.partition_log("t", 0)

    def append(self, batch) -> int:
        return self.appender.append(self.row, batch)[0]

    def restart(self, crash: bool = False) -> None:
        self.appender.unregister_partition("t", 0)
        if crash:
            abandon(self.log)
        self.logs.close()
        self.logs = LogManager(self.directory)
        self._host()

    def close(self):
        self.logs.close()
        unlink_table(self.name)


@pytest.fixture
def broker(tmp_path):
    opened = Broker(str(tmp_path / "data"))
    yield opened
    opened.close()


def bury(broker, batches: int = 40, rolls: int = 2) -> None:
    """Another producer (id 8) appends ``batches`` batches, rolling the segments at
    least ``rolls`` times."""
    segments = len(broker.log.segments)
    for _ in range(batches):
        assert broker.append(producer_batch(8, broker.other_sequence)) >= 0
        broker.other_sequence += 4
    assert len(broker.log.segments) >= segments + rolls


@pytest.mark.parametrize("crash", [False, True])
def test_a_resend_after_roll_and_reopen_is_a_duplicate(broker, crash):
    first = broker.append(producer_batch(7, 0))
    last = broker.append(producer_batch(7, 4))
    bury(broker)
    end = broker.log.log_end_offset
    broker.restart(crash=crash)
    assert broker.log.log_end_offset == end
    assert broker.append(producer_batch(7, 4)) == last                 # deduped
    assert broker.log.log_end_offset == end
    assert broker.append(producer_batch(7, 8)) == end                  # and it goes on
    assert first == 0


def as_version_1(directory: str) -> None:
    """Rewrite every producer snapshot as an older broker wrote it: version 1, each
    producer's last batch alone."""
    for offset in snapshot_offsets(directory):
        path = os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")
        with open(path) as source:
            body = json.load(source)
        assert body["version"] == 3 and body["transactions"] == []
        last = {row[0]: row for row in body["producers"]}     # a producer's rows in log order
        with open(path, "w") as target:
            json.dump({"version": 1, "producers": sorted(last.values())}, target)


@pytest.mark.parametrize("reopen", ["clean", "crash", "no snapshots", "version 1"])
def test_the_last_five_batches_are_recognised_after_a_restart(broker, reopen):
    """The window comes back from the log: four of producer 7's last five batches lie
    below the active segment (the snapshot's, or a walk's when there is none) and
    the last one in it. A version-1 snapshot (an older broker's) knew only the last
    batch below the active segment: the ones before it are then out of order."""
    sent, offsets = [], []
    for index in range(7):
        if index == 6:
            bury(broker, 30, rolls=1)           # the last batch alone in the active segment
        sent.append(producer_batch(7, 4 * index))
        offsets.append(broker.append(sent[-1]))
        bury(broker, 12, rolls=0)
    assert offsets[5] < broker.log.active.base_offset <= offsets[6]
    assert offsets[2] < broker.log.segments[-2].base_offset           # two segments' worth
    end = broker.log.log_end_offset
    directory = broker.log.directory
    broker.restart(crash=reopen == "crash")
    if reopen == "no snapshots":
        for offset in snapshot_offsets(directory):
            os.unlink(os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}"))
    if reopen == "version 1":
        as_version_1(directory)
    if reopen in ("no snapshots", "version 1"):
        broker.restart()
    out_of_order = -CompletionCode.OUT_OF_ORDER_SEQUENCE
    known = range(5, 7) if reopen == "version 1" else range(2, 7)
    assert [broker.append(sent[index]) for index in range(1, 7)] == \
        [offsets[index] if index in known else out_of_order for index in range(1, 7)]
    assert broker.log.log_end_offset == end
    assert broker.append(producer_batch(7, 28)) == end                 # and it goes on


def test_the_window_follows_sequences_across_their_wrap():
    """Sequences wrap to 0 after SEQUENCE_MODULUS - 1: a batch across the wrap is held
    with its last sequence past it, its re-send recognised, and 0's batch follows."""
    table = ProducerStateTable()
    top = SEQUENCE_MODULUS - 1
    firsts = [top - 9, top - 5, top - 1, 2, 6, 10]         # four records each; across: top - 1
    for index, first in enumerate(firsts):
        assert table.check(0, 7, 0, first, 3) == (SEQUENCE_NEW, -1)
        table.remember(0, 7, 0, first, 100 + 4 * index, 4)
    assert [table.check(0, 7, 0, first, 3) for first in firsts[1:]] == \
        [(SEQUENCE_DUPLICATE, 100 + 4 * index) for index in range(1, 6)]
    assert table.check(0, 7, 0, firsts[0], 3) == (SEQUENCE_OUT_OF_ORDER, -1)     # sixth-last
    assert table.check(0, 7, 0, top - 1, 2) == (SEQUENCE_OUT_OF_ORDER, -1)       # ends elsewhere
    assert table.check(0, 7, 0, 14, 0) == (SEQUENCE_NEW, -1)
    assert table.check(1, 7, 0, 14, 0) == (SEQUENCE_NEW, -1)             # another partition's


def test_a_new_epoch_starts_the_window_again():
    table = ProducerStateTable()
    for index in range(3):
        table.remember(0, 7, 0, 4 * index, 4 * index, 4)
    table.remember(0, 7, 1, 0, 12, 4)                                   # KIP-360's bump
    assert table.check(0, 7, 1, 0, 3) == (SEQUENCE_DUPLICATE, 12)
    assert table.check(0, 7, 0, 4, 3)[0] == SEQUENCE_FENCED
    assert table.check(0, 7, 1, 4, 3) == (SEQUENCE_NEW, -1)


def pieces(producer_id: int, sequence: int, count: int) -> np.ndarray:
    """A Kafka client's batch of ``4 * count`` records as ``kafka_batches.from_kafka``
    stores it when it passes max.message.bytes: ``count`` batches back to back, one
    producer, sequences running on from ``sequence``."""
    return np.concatenate([producer_batch(producer_id, sequence + 4 * index)
                           for index in range(count)])


@pytest.mark.parametrize("crash", [False, True])
def test_a_batch_stored_in_pieces_is_one_resent_batch_before_and_after_a_restart(broker,
                                                                               crash):
    """Appended, it is one batch of the window (first sequence to its last piece's
    last): its re-send is deduped with its first offset. After a restart the log's
    walk remembers its pieces one by one, and the re-send matches their run."""
    first = broker.append(pieces(7, 0, 3))
    second = broker.append(pieces(7, 12, 2))
    end = broker.log.log_end_offset
    assert (first, second, end) == (0, 12, 20)
    assert [broker.append(pieces(7, 0, 3)), broker.append(pieces(7, 12, 2))] == [0, 12]
    assert broker.append(pieces(7, 0, 2)) == -CompletionCode.OUT_OF_ORDER_SEQUENCE  # ends inside
    broker.restart(crash=crash)
    assert [broker.append(pieces(7, 0, 3)), broker.append(pieces(7, 12, 2))] == [0, 12]
    assert broker.log.log_end_offset == end
    assert broker.append(pieces(7, 20, 2)) == end                       # and it goes on


def test_a_run_of_pieces_held_is_the_batch_they_were():
    """Pieces remembered one by one (a follower's appends, the log's walk): a batch
    from the first of a run to the last of a later one is the run's duplicate, at
    its first piece's offset; one that starts or ends between pieces is not."""
    table = ProducerStateTable()
    held = [producer_batch(7, 4 * index) for index in range(4)]   # sequences 0-15
    for index, piece in enumerate(held):             # at offsets 0-15, as the leader's log
        piece[B.BASE_OFFSET_OFFSET:B.BASE_OFFSET_OFFSET + 8] = \
            np.frombuffer(np.int64(4 * index).tobytes(), np.uint8)
    table.remember_batches(0, np.concatenate(held))
    assert table.check(0, 7, 0, 0, 15) == (SEQUENCE_DUPLICATE, 0)
    assert table.check(0, 7, 0, 4, 7) == (SEQUENCE_DUPLICATE, 4)
    assert table.check(0, 7, 0, 0, 9) == (SEQUENCE_OUT_OF_ORDER, -1)
    assert table.check(0, 7, 0, 2, 13) == (SEQUENCE_OUT_OF_ORDER, -1)
    assert table.check(0, 7, 0, 12, 3) == (SEQUENCE_DUPLICATE, 12)      # the last piece
    assert table.check(0, 7, 0, 16, 3) == (SEQUENCE_NEW, -1)


def test_a_batch_of_more_pieces_than_the_window_after_a_restart_is_refused_not_doubled(broker):
    """The walk after a restart holds the last five pieces: a re-send of a batch of
    more is out of order (the producer's error), never appended a second time."""
    assert broker.append(pieces(7, 0, PRODUCER_BATCHES_MAX + 2)) == 0
    end = broker.log.log_end_offset
    assert broker.append(pieces(7, 0, PRODUCER_BATCHES_MAX + 2)) == 0     # whole: deduped
    broker.restart()
    assert broker.append(pieces(7, 0, PRODUCER_BATCHES_MAX + 2)) == \
        -CompletionCode.OUT_OF_ORDER_SEQUENCE
    assert broker.log.log_end_offset == end


def test_a_producer_window_is_as_wide_as_the_dicts_hold():
    assert typed.WINDOW.count == WINDOW_WORDS


def test_without_snapshots_the_open_walks_the_whole_log(broker):
    last = broker.append(producer_batch(7, 0))
    bury(broker)
    broker.restart()
    directory = broker.log.directory
    for offset in snapshot_offsets(directory):
        os.unlink(os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}"))
    # A damaged one is as good as none.
    with open(os.path.join(directory, f"{broker.log.active.base_offset:020d}{SNAPSHOT_SUFFIX}"),
              "w") as damaged:
        damaged.write('{"version": 1, "producers": [[1, 2]]}')
    end = broker.log.log_end_offset
    broker.restart()
    assert broker.append(producer_batch(7, 0)) == last
    assert broker.log.log_end_offset == end
    # The walk left the snapshot below the active segment for the next open.
    assert snapshot_offsets(directory)[-1] == broker.log.active.base_offset


def test_a_truncation_keeps_producers_of_older_segments(broker):
    last = broker.append(producer_batch(7, 0))
    bury(broker)
    cut = broker.log.active.base_offset + 2
    bury(broker, 1, rolls=0)
    broker.log.truncate_to(cut)
    broker.appender.rebuild_producer_state(broker.row)
    end = broker.log.log_end_offset
    assert broker.append(producer_batch(7, 0)) == last
    assert broker.log.log_end_offset == end


def test_a_truncation_forgets_the_batches_it_removed(broker):
    bury(broker, 10, rolls=0)
    cut = broker.log.log_end_offset
    resent = producer_batch(7, 0)
    broker.append(resent)
    bury(broker)                            # the producer's batch is in an older segment now
    broker.log.truncate_to(cut)
    assert all(offset <= broker.log.active.base_offset
               for offset in snapshot_offsets(broker.log.directory))
    broker.appender.rebuild_producer_state(broker.row)
    assert broker.append(resent) == cut                                 # appended again
    assert broker.append(resent) == cut                                 # then a duplicate


def test_retention_forgets_producers_whose_batches_are_gone(broker):
    broker.append(producer_batch(7, 0))
    bury(broker)
    broker.log.config = TopicConfig.from_overrides({**SMALL, "retention.bytes": 1})
    assert broker.log.delete_old_segments()
    assert all(offset >= broker.log.log_start_offset
               for offset in snapshot_offsets(broker.log.directory))
    assert 7 not in broker.log.producer_batches()[:, 0].tolist()
    assert 8 in broker.log.producer_batches()[:, 0].tolist()


def test_the_header_walk_matches_a_plain_model():
    rng = random.Random(5)
    producers = list(range(100)) + [-1]             # more than the walk keeps locally
    batches, model = [], {}
    for base in range(0, 2000, 4):
        producer_id = rng.choice(producers)
        sequence = rng.randrange(1000)
        batch = encode_batch([b"v"] * 4, producer_id=producer_id, producer_epoch=3,
                             base_sequence=sequence) if producer_id >= 0 else \
            encode_batch([b"v"] * 4)
        batch[:B.HEADER_LENGTH].view(B.BATCH_HEADER_DTYPE)["base_offset"] = base
        batches.append(batch)
        if producer_id >= 0 and base >= 400:          # each producer's last five batches
            model[producer_id] = (model.get(producer_id, []) +
                                  [[producer_id, 3, sequence, base, 3]])[-PRODUCER_BATCHES_MAX:]
    state = ProducerState()
    data = np.concatenate(batches)
    state.remember(data, 0, data.size, min_offset=400)
    expected = [row for key in sorted(model) for row in model[key]]
    assert state.rows().tolist() == expected
    assert ProducerState(state.rows()).rows().tolist() == expected
    assert state.rows(min_last_offset=1000).tolist() == \
        [row for row in expected if row[3] + 3 >= 1000]


def test_a_walk_without_producers_is_not_repeated(tmp_path):
    directory = str(tmp_path / "partition")
    partition_log = PartitionLog(directory, TopicConfig.from_overrides(SMALL))
    for seed in range(40):
        partition_log.append(encode_batch([b"%d" % seed + b"." * 400] * 4))   # no producer id
    assert len(partition_log.segments) > 2
    partition_log.close()
    for offset in snapshot_offsets(directory):
        os.unlink(os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}"))
    reopened = PartitionLog(directory, TopicConfig.from_overrides(SMALL))
    assert snapshot_offsets(directory) == [reopened.active.base_offset]
    assert reopened.producer_batches().shape == (0, 5)
    reopened.close()


def test_the_last_five_batches_are_recognised_and_the_sixth_is_not():
    from shmlog.broker.appender.producer_state import (
        SEQUENCE_DUPLICATE,
        SEQUENCE_NEW,
        SEQUENCE_OUT_OF_ORDER,
        ProducerStateTable,
    )
    from shmlog.common import limits
    table = ProducerStateTable()
    for batch in range(limits.PRODUCER_BATCHES_MAX + 1):          # six batches of 10 records
        assert table.check(3, 42, 0, batch * 10, 9) == (SEQUENCE_NEW, -1)
        table.remember(3, 42, 0, batch * 10, 1000 + batch * 10, 10)
    for batch in range(1, limits.PRODUCER_BATCHES_MAX + 1):       # the last five: duplicates
        assert table.check(3, 42, 0, batch * 10, 9) == (SEQUENCE_DUPLICATE, 1000 + batch * 10)
    assert table.check(3, 42, 0, 0, 9) == (SEQUENCE_OUT_OF_ORDER, -1)       # forgotten
    assert table.check(3, 42, 0, 60, 9) == (SEQUENCE_NEW, -1)               # the next
    assert table.check(3, 42, 0, 70, 9) == (SEQUENCE_OUT_OF_ORDER, -1)      # a gap
    table.remember(3, 42, 1, 0, 2000, 5)               # a new epoch starts again
    assert table.check(3, 42, 1, 50, 4) == (SEQUENCE_OUT_OF_ORDER, -1)
    assert table.check(3, 42, 1, 0, 4) == (SEQUENCE_DUPLICATE, 2000)
    assert table.check(3, 43, 0, 50, 9) == (SEQUENCE_NEW, -1)            # another producer
