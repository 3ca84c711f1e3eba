"""Log compaction against a reference model: random keys, values, tombstones and
codecs; cleaned repeatedly while the log grows; reopened; a swap cut short at each
of its file operations; the order in which a swap makes its steps durable.

Method: real files in a temporary directory; a crash is an exception raised in
place of a chosen rename or unlink (patched ``os.replace`` / ``os.unlink``), after
which the log is abandoned as a killed process leaves it and opened again."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from shmlog import LogManager
from shmlog.record.records import encode_batch
from shmlog.segments import (
    CLEANING_DIRECTORY,
    SWAP_MANIFEST_FILE,
    PartitionLog,
    write_swap_manifest,
)
from shmlog.storage import cleaner, local_log
from shmlog.storage.topic_config import TopicConfig
from tests.helpers import abandon, all_records

DAY_MS = 24 * 3600 * 1000
NOW = 1_700_000_000_000


def compact_config(**overrides) -> TopicConfig:
    return TopicConfig.from_overrides({"cleanup.policy": "compact", "segment.bytes": 8192,
                                       "min.cleanable.dirty.ratio": 0.01,
                                       "delete.retention.ms": DAY_MS, **overrides})


def produce(partition_log, rng, batches: int, keys: int, timestamp: int, written: dict) -> None:
    """Append random batches; ``written`` maps every offset to (key, value, timestamp)."""
    for _ in range(batches):
        count = rng.randint(1, 12)
        keyed = [None if rng.random() < 0.05 else f"key-{rng.randrange(keys)}".encode()
                 for _ in range(count)]
        values = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 40))
                  for _ in range(count)]
        stamps = [timestamp + index for index in range(count)]
        batch = encode_batch(values, keys=keyed, timestamps=stamps,
                             compression="zstd" if rng.random() < 0.3 else None)
        result = partition_log.append(batch)
        for index in range(count):
            written[result.base_offset + index] = (keyed[index], values[index], stamps[index])


def run_cleaning(partition_log, now: int, keys_max: int = 1 << 20) -> bool:
    planned = cleaner.plan(partition_log, now)
    if planned is None:
        return False
    return partition_log.replace_segments(cleaner.clean(planned, now, keys_max))


def check_against_model(partition_log, written: dict, tombstones_expired: bool) -> None:
    """What the guarantee says: every record read is the one written at its offset,
    in offset order; the last record of every key is there (a tombstone may be gone
    once expired); below the clean offset no key appears twice."""
    records = all_records(partition_log)
    offsets = [record.offset for record in records]
    assert offsets == sorted(set(offsets))
    for record in records:
        assert (record.key, record.value, record.timestamp) == written[record.offset]
    present = set(offsets)
    last_of_key = {}
    for offset in sorted(written):
        key = written[offset][0]
        if key is not None:
            last_of_key[key] = offset
        else:
            assert offset in present, "records without a key are never removed"
    for key, offset in last_of_key.items():
        if offset in present:
            continue
        assert tombstones_expired and written[offset][1] is None and \
            offset < partition_log.clean_offset, f"latest record of {key!r} at {offset} lost"
    clean = [record for record in records if record.offset < partition_log.clean_offset
             and record.key is not None]
    keys = [record.key for record in clean]
    assert len(keys) == len(set(keys)), "a key appears twice in the cleaned part"
    for record in clean:
        assert last_of_key[record.key] >= record.offset


@pytest.mark.parametrize("seed", range(4))
def test_compaction_matches_the_reference_model(tmp_path, seed):
    rng = random.Random(seed)
    written: dict = {}
    with PartitionLog(str(tmp_path / "p"), compact_config()) as partition_log:
        for round_number in range(5):
            produce(partition_log, rng, 60, keys=25, timestamp=NOW + round_number, written=written)
            partition_log.roll()
            size_before = partition_log.size
            assert run_cleaning(partition_log, NOW + 1000)
            assert partition_log.size < size_before
            check_against_model(partition_log, written, tombstones_expired=False)
        # Tombstones older than delete.retention.ms go too.
        produce(partition_log, rng, 5, keys=25, timestamp=NOW + 100, written=written)
        partition_log.roll()
        assert run_cleaning(partition_log, NOW + DAY_MS + 1_000)
        check_against_model(partition_log, written, tombstones_expired=True)
        end_offset = partition_log.log_end_offset
    with PartitionLog(str(tmp_path / "p"), compact_config()) as reopened:
        assert reopened.recovery_report.clean
        assert reopened.log_end_offset == end_offset
        assert reopened.clean_offset == partition_log.clean_offset
        check_against_model(reopened, written, tombstones_expired=True)


def test_a_small_map_cleans_in_several_passes(tmp_path):
    rng = random.Random(7)
    written: dict = {}
    with PartitionLog(str(tmp_path / "p"), compact_config()) as partition_log:
        produce(partition_log, rng, 200, keys=500, timestamp=NOW, written=written)
        partition_log.roll()
        passes = 0
        while run_cleaning(partition_log, NOW + 1000, keys_max=100):
            passes += 1
            check_against_model(partition_log, written, tombstones_expired=False)
        assert passes > 1
        assert partition_log.clean_offset == partition_log.log_end_offset


def test_what_is_not_cleaned(tmp_path):
    rng = random.Random(3)
    config = compact_config(**{"min.compaction.lag.ms": 60_000, "segment.bytes": 1 << 20})
    with PartitionLog(str(tmp_path / "p"), config) as partition_log:
        produce(partition_log, rng, 40, keys=5, timestamp=NOW, written={})
        assert len(partition_log.segments) == 1
        assert cleaner.plan(partition_log, NOW + 120_000) is None, "the active segment"
        partition_log.roll()
        assert cleaner.plan(partition_log, NOW + 30_000) is None, "min.compaction.lag.ms"
        assert run_cleaning(partition_log, NOW + 120_000)
        assert cleaner.plan(partition_log, NOW + 120_000) is None, "nothing dirty is left"
    with PartitionLog(str(tmp_path / "d"), TopicConfig.from_overrides(
            {"segment.bytes": 8192})) as deleting:
        produce(deleting, rng, 40, keys=5, timestamp=NOW, written={})
        deleting.roll()
        assert cleaner.plan(deleting, NOW + 120_000) is None, "cleanup.policy=delete"


def test_dirty_ratio_gates_cleaning(tmp_path):
    rng = random.Random(5)
    written: dict = {}
    config = compact_config(**{"min.cleanable.dirty.ratio": 0.9})
    with PartitionLog(str(tmp_path / "p"), config) as partition_log:
        produce(partition_log, rng, 60, keys=5, timestamp=NOW, written=written)
        partition_log.roll()
        planned = cleaner.plan(partition_log, NOW + 1000)
        assert planned is not None and planned.dirty_ratio == 1.0
        partition_log.replace_segments(cleaner.clean(planned, NOW + 1000, 1 << 20))
        produce(partition_log, rng, 2, keys=5, timestamp=NOW, written=written)
        partition_log.roll()
        assert cleaner.plan(partition_log, NOW + 1000) is None, "a little dirt waits"


def test_compact_only_topics_keep_old_segments(tmp_path):
    rng = random.Random(9)
    config = compact_config(**{"retention.ms": 1000, "retention.bytes": 1})
    with PartitionLog(str(tmp_path / "p"), config) as partition_log:
        produce(partition_log, rng, 40, keys=5, timestamp=NOW, written={})
        partition_log.roll()
        assert partition_log.delete_old_segments(NOW + DAY_MS) == []
        partition_log.config = compact_config(**{"retention.ms": 1000,
                                                 "cleanup.policy": "compact,delete"})
        assert partition_log.delete_old_segments(NOW + DAY_MS) != []


def merging_cleaning(directory: str):
    """(partition log, cleaning, written): a log whose next cleaning merges several
    segments into each of at least two groups (a first cleaning shrank them)."""
    rng = random.Random(11)
    written: dict = {}
    partition_log = PartitionLog(directory, compact_config())
    produce(partition_log, rng, 240, keys=10, timestamp=NOW, written=written)
    partition_log.roll()
    assert run_cleaning(partition_log, NOW + 1000)      # cleaned segments shrink...
    produce(partition_log, rng, 120, keys=10, timestamp=NOW, written=written)
    partition_log.roll()
    planned = cleaner.plan(partition_log, NOW + 1000)    # ...so this pass merges them
    cleaning = cleaner.clean(planned, NOW + 1000, 1 << 20)
    assert len(cleaning.groups) > 1 and any(len(group.replaces) > 1 for group in cleaning.groups)
    return partition_log, cleaning, written


class Crash(Exception):
    """Stands for the process dying at a chosen file operation."""


def trace_swap(monkeypatch, directory: str, crash_at=None) -> list:
    """Record the swap's file operations as (kind, name) - kind one of "fsync",
    "manifest", "rename" (a cleaned file into place), "delete" (a replaced segment's
    file), "unmanifest" - and raise Crash instead of the ``crash_at`` = (kind, n)-th
    operation of its kind."""
    cleaning_directory = os.path.join(directory, CLEANING_DIRECTORY)
    events: list = []
    real_replace, real_unlink = os.replace, os.unlink
    real_fsync_directory = local_log.fsync_directory

    def record(kind, path):
        if crash_at is not None and crash_at == (kind, sum(event[0] == kind for event in events)):
            raise Crash(f"{kind} of {path}")
        events.append((kind, os.path.relpath(path, directory)))

    def replace(source, target, *args, **kwargs):
        source, target = os.fspath(source), os.fspath(target)
        if os.path.dirname(source) == cleaning_directory:
            record("rename", target)
        elif os.path.basename(target) == SWAP_MANIFEST_FILE:
            record("manifest", target)
        return real_replace(source, target, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        path = os.fspath(path)
        if os.path.dirname(path) == directory:
            name = os.path.basename(path)
            if name == SWAP_MANIFEST_FILE:
                record("unmanifest", path)
            elif name[:20].isdigit():
                record("delete", path)
        return real_unlink(path, *args, **kwargs)

    def fsync_directory(path):
        record("fsync", path)
        return real_fsync_directory(path)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(local_log, "fsync_directory", fsync_directory)
    return events


def test_the_swap_is_durable_before_anything_is_deleted(tmp_path, monkeypatch):
    """The order a crash can rely on: the cleaned files, then the manifest, are on
    disk (directories fsynced) before the first rename; every cleaned file of every
    group is renamed in, and the directory fsynced, before the first replaced
    segment is deleted; the deletions are durable before the manifest goes, and its
    removal is durable before the swap returns."""
    directory = str(tmp_path / "p")
    partition_log, cleaning, written = merging_cleaning(directory)
    events = trace_swap(monkeypatch, directory)
    assert partition_log.replace_segments(cleaning)
    monkeypatch.undo()
    kinds = [kind for kind, _ in events]
    first_rename, last_rename = kinds.index("rename"), len(kinds) - 1 - kinds[::-1].index("rename")
    first_delete, last_delete = kinds.index("delete"), len(kinds) - 1 - kinds[::-1].index("delete")
    manifest, unmanifest = kinds.index("manifest"), kinds.index("unmanifest")
    assert ("fsync", CLEANING_DIRECTORY) in events[:manifest], "cleaned files reachable"
    assert ("fsync", ".") in events[manifest:first_rename], "manifest durable"
    assert last_rename < first_delete, "every cleaned file is in place before any deletion"
    assert ("fsync", ".") in events[last_rename:first_delete], "renames durable"
    assert ("fsync", ".") in events[last_delete:unmanifest], "deletions durable"
    assert events[-1] == ("fsync", "."), "the manifest's removal is durable"
    renamed = {name for kind, name in events if kind == "rename"}
    assert renamed == {f"{group.base_offset:020d}{suffix}" for group in cleaning.groups
                       for suffix in (".index", ".timeindex", ".log")}
    check_against_model(partition_log, written, tombstones_expired=False)
    partition_log.close()


@pytest.mark.parametrize("crash_at", [("manifest", 0), ("rename", 0), ("rename", 1),
                                      ("rename", 4), ("delete", 0), ("delete", 4),
                                      ("unmanifest", 0)])
def test_a_swap_cut_short_at_any_step_is_finished_on_open(tmp_path, monkeypatch, crash_at):
    """The process dies at a file operation of the swap (before the manifest is
    written, before the first rename, between renames, before or between the
    deletions, before the manifest goes): reopening finishes the swap or finds the
    old segments whole, and every record is the one written."""
    directory = str(tmp_path / "p")
    partition_log, cleaning, written = merging_cleaning(directory)
    segments_before = len(partition_log.segments)
    trace_swap(monkeypatch, directory, crash_at)
    with pytest.raises(Crash):
        partition_log.replace_segments(cleaning)
    monkeypatch.undo()
    abandon(partition_log)
    with PartitionLog(directory, compact_config()) as reopened:
        assert not os.path.exists(os.path.join(directory, CLEANING_DIRECTORY))
        assert not os.path.exists(os.path.join(directory, SWAP_MANIFEST_FILE))
        expected = segments_before if crash_at == ("manifest", 0) else len(cleaning.groups) + 1
        assert len(reopened.segments) == expected
        check_against_model(reopened, written, tombstones_expired=False)


def test_a_swap_cut_short_is_finished_on_open(tmp_path):
    directory = str(tmp_path / "p")
    partition_log, cleaning, written = merging_cleaning(directory)
    # The manifest is committed and the first cleaned log renamed in; then the
    # process dies (the later segments of its group are still there).
    write_swap_manifest(directory, cleaning.groups)
    first = cleaning.groups[0].base_offset
    name = f"{first:020d}.log"
    os.replace(os.path.join(directory, CLEANING_DIRECTORY, name), os.path.join(directory, name))
    abandon(partition_log)
    with PartitionLog(directory, compact_config()) as reopened:
        assert not os.path.exists(os.path.join(directory, CLEANING_DIRECTORY))
        assert not os.path.exists(os.path.join(directory, SWAP_MANIFEST_FILE))
        assert len(reopened.segments) == len(cleaning.groups) + 1
        check_against_model(reopened, written, tombstones_expired=False)


def test_cleaned_files_without_a_manifest_are_discarded(tmp_path):
    rng = random.Random(13)
    written: dict = {}
    directory = str(tmp_path / "p")
    partition_log = PartitionLog(directory, compact_config())
    produce(partition_log, rng, 60, keys=10, timestamp=NOW, written=written)
    partition_log.roll()
    cleaner.clean(cleaner.plan(partition_log, NOW + 1000), NOW + 1000, 1 << 20)
    segments_before = len(partition_log.segments)
    abandon(partition_log)                      # died before committing the swap
    with PartitionLog(directory, compact_config()) as reopened:
        assert not os.path.exists(os.path.join(directory, CLEANING_DIRECTORY))
        assert len(reopened.segments) == segments_before
        assert [record.offset for record in all_records(reopened)] == sorted(written)


def test_a_swap_is_refused_when_the_log_changed(tmp_path):
    rng = random.Random(17)
    written: dict = {}
    config = compact_config(**{"cleanup.policy": "compact,delete", "retention.ms": 1000})
    with PartitionLog(str(tmp_path / "p"), config) as partition_log:
        produce(partition_log, rng, 60, keys=10, timestamp=NOW, written=written)
        partition_log.roll()
        cleaning = cleaner.clean(cleaner.plan(partition_log, NOW + 1000), NOW + 1000, 1 << 20)
        assert partition_log.delete_old_segments(NOW + DAY_MS)      # retention meanwhile
        assert not partition_log.replace_segments(cleaning)
        assert not os.path.exists(os.path.join(partition_log.directory, CLEANING_DIRECTORY))


def test_a_swap_is_refused_for_a_topic_recreated_meanwhile(tmp_path):
    """A topic deleted and created again under the same name while its partition was
    being cleaned: the new partition has the same directory, and here the same
    segment layout (records of equal sizes, other values), and the cleaner left its
    files there. The swap compares topic ids, refuses, and throws the files away."""
    config = {"cleanup.policy": "compact", "segment.bytes": 8192,
              "min.cleanable.dirty.ratio": 0.01}

    def produce_named(partition_log, prefix: bytes) -> dict:
        written = {}
        for batch in range(40):
            first = partition_log.log_end_offset
            keys = [b"key-%d" % ((first + index) % 7) for index in range(5)]
            values = [prefix + b"-%05d" % (first + index) for index in range(5)]
            partition_log.append(encode_batch(values, keys=keys, timestamps=[NOW] * 5))
            written.update({first + index: (keys[index], values[index]) for index in range(5)})
            if batch % 10 == 9:
                partition_log.roll()
        return written

    with LogManager(str(tmp_path / "data")) as logs:
        logs.create_topic("t", config=config)
        old_log = logs.partition_log("t", 0)
        produce_named(old_log, b"old")
        cleaning = cleaner.clean(cleaner.plan(old_log, NOW + 1000), NOW + 1000, 1 << 20)
        stale = str(tmp_path / "stale-cleaning")
        shutil.copytree(os.path.join(old_log.directory, CLEANING_DIRECTORY), stale)
        old_layout = [(segment.base_offset, segment.size) for segment in old_log.segments]
        logs.delete_topic("t")
        logs.create_topic("t", config=config)
        new_log = logs.partition_log("t", 0)
        written = produce_named(new_log, b"new")
        assert new_log.directory == cleaning.plan.directory
        assert [(segment.base_offset, segment.size) for segment in new_log.segments] == old_layout
        # What the cleaner thread wrote after the topic came back.
        shutil.copytree(stale, os.path.join(new_log.directory, CLEANING_DIRECTORY))
        assert not new_log.replace_segments(cleaning)
        assert not os.path.exists(os.path.join(new_log.directory, CLEANING_DIRECTORY))
        assert [(record.offset, record.key, record.value) for record in all_records(new_log)] == \
            [(offset, key, value) for offset, (key, value) in sorted(written.items())]
