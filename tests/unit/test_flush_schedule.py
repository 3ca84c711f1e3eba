"""The flush schedule (``broker.flush_schedule``): flush.ms is met for the logs
whose time came, and the check looks at no other log (an idle broker with
thousands of partitions does no work per partition)."""

from __future__ import annotations

from helpers import values_batch
from shmlog.broker.flush_schedule import FlushSchedule
from shmlog.server.broker import BrokerConfig, BrokerCore
from shmlog.storage.topic_config import TopicConfig

HOUR_MS = 3_600_000


def test_a_log_is_flushed_when_its_flush_ms_comes_and_not_looked_at_before(open_log, tmp_path):
    due_soon = open_log(tmp_path / "soon", **{"flush.ms": HOUR_MS})
    never = open_log(tmp_path / "never")                    # flush.ms: the default, never
    clean = open_log(tmp_path / "clean", **{"flush.ms": HOUR_MS})
    schedule = FlushSchedule()
    for partition_log in (due_soon, never, clean):
        schedule.watch(partition_log)
    due_soon.append(values_batch(2, 0))
    never.append(values_batch(3, 0))
    assert schedule.scheduled() == 2, "a log without unflushed records is not scheduled"
    start = due_soon._last_flush_ms
    assert schedule.run(start + HOUR_MS - 1) == 0, "nothing looked at before its time"
    assert due_soon.recovery_point == 0
    assert schedule.run(start + HOUR_MS) == 1
    assert due_soon.recovery_point == 2 and never.recovery_point == 0
    assert schedule.scheduled() == 1, "flushed: no longer scheduled; the other waits"
    assert schedule.run(start + 100 * HOUR_MS) == 0, "the default flush.ms never comes"


def test_a_log_written_again_after_its_flush_is_scheduled_again(open_log):
    partition_log = open_log(**{"flush.ms": HOUR_MS})
    schedule = FlushSchedule()
    schedule.watch(partition_log)
    partition_log.append(values_batch(2, 0))
    schedule.run(partition_log._last_flush_ms + HOUR_MS)
    assert partition_log.recovery_point == 2 and schedule.scheduled() == 0
    partition_log.append(values_batch(1, 1))
    assert schedule.scheduled() == 1
    assert schedule.run(partition_log._last_flush_ms + HOUR_MS) == 1
    assert partition_log.recovery_point == 3


def test_a_flush_by_flush_messages_moves_the_flush_ms_time_on(open_log):
    partition_log = open_log(**{"flush.ms": HOUR_MS, "flush.messages": 3})
    schedule = FlushSchedule()
    schedule.watch(partition_log)
    partition_log.append(values_batch(1, 0))
    first_due = partition_log.flush_due_ms()
    partition_log.append(values_batch(2, 1))                # flush.messages: flushed inline
    assert partition_log.recovery_point == 3
    partition_log.append(values_batch(1, 2))
    schedule.run(first_due)                                  # its old time: looked at only
    assert partition_log.recovery_point == 3 and schedule.scheduled() == 1
    assert schedule.run(partition_log._last_flush_ms + HOUR_MS) == 1
    assert partition_log.recovery_point == 4


def test_a_lowered_flush_ms_takes_effect_for_a_log_already_waiting(open_log):
    partition_log = open_log()                               # flush.ms: never
    schedule = FlushSchedule()
    schedule.watch(partition_log)
    partition_log.append(values_batch(2, 0))
    partition_log.config = TopicConfig.from_overrides({"flush.ms": 1000})
    assert schedule.run(partition_log._last_flush_ms + 1000) == 1
    assert partition_log.recovery_point == 2


def test_a_forgotten_log_is_not_flushed(open_log):
    partition_log = open_log(**{"flush.ms": HOUR_MS})
    schedule = FlushSchedule()
    schedule.watch(partition_log)
    partition_log.append(values_batch(2, 0))
    schedule.forget(partition_log)
    assert schedule.run(partition_log._last_flush_ms + HOUR_MS) == 0
    assert partition_log.recovery_point == 0 and partition_log.flush_listener is None


def test_the_broker_flushes_hosted_partitions_at_their_flush_ms_and_forgets_deleted_ones(
        data_dir):
    core = BrokerCore(BrokerConfig(data_dir=data_dir, offsets_topic_num_partitions=1))
    try:
        core.host.create_topic("timed", 2, {"flush.ms": HOUR_MS})
        core.host.create_topic("gone", 1, {"flush.ms": HOUR_MS})
        core.host.append("timed", 1, values_batch(3, 0))
        core.host.append("gone", 0, values_batch(2, 1))
        timed = core.host.partition("timed", 1).log
        gone = core.host.partition("gone", 0).log
        core.host.delete_topic("gone")
        assert gone.flush_listener is None
        core.host.flush_due(timed._last_flush_ms + HOUR_MS - 1)
        assert timed.recovery_point == 0
        core.host.flush_due(timed._last_flush_ms + HOUR_MS)
        assert timed.recovery_point == 3
        assert core.host.partition("timed", 0).log.recovery_point == 0, "never written"
    finally:
        core.close()
