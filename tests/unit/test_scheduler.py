"""The broker loop's scheduler: tasks run when due, in the order added, once per
turn however late the turn is, and are due again an interval after that turn.

Method: a Scheduler driven with explicit times; tasks record the times they ran at.
"""

from __future__ import annotations

import errno
import logging

import pytest

from shmlog.broker.scheduler import Scheduler
from shmlog.common import limits
from shmlog.common.errors import ResourceLimitError, StorageError


def test_tasks_run_when_due_in_the_order_added():
    ran = []
    scheduler = Scheduler()
    scheduler.every(100, lambda now: ran.append(("slow", now)), now=0)
    scheduler.every(10, lambda now: ran.append(("fast", now)), now=0)
    assert scheduler.next_due() == 10
    scheduler.run_due(9)
    assert ran == []
    scheduler.run_due(100)
    assert ran == [("slow", 100), ("fast", 100)]
    assert scheduler.next_due() == 110


def test_a_late_turn_runs_a_task_once_and_it_is_due_an_interval_after_that_turn():
    ran = []
    scheduler = Scheduler()
    scheduler.every(10, ran.append, now=0)
    scheduler.run_due(1_000)               # a hundred intervals late
    scheduler.run_due(1_005)
    assert ran == [1_000]
    scheduler.run_due(1_010)
    assert ran == [1_000, 1_010]


def test_no_task_means_nothing_due():
    assert Scheduler().next_due() is None


def emfile(now):
    raise OSError(errno.EMFILE, "Too many open files")


def test_a_limit_is_logged_once_until_every_work_it_refused_runs_again(caplog):
    refusing = {"listing": True, "writing": True}

    def listing(now):
        if refusing["listing"]:
            raise ResourceLimitError("too many open files (RLIMIT_NOFILE)",
                                     limit="RLIMIT_NOFILE")

    def writing(now):
        if refusing["writing"]:
            try:
                emfile(now)
            except OSError as error:        # typed further up, as durable_files does
                raise StorageError(f"cannot write: {error}") from error

    scheduler = Scheduler()
    scheduler.every(10, listing, now=0)
    scheduler.every(10, writing, now=0)
    with caplog.at_level(logging.INFO, logger="shmlog.broker.scheduler"):
        for now in range(10, 110, 10):
            scheduler.run_due(now)
        refused = [record for record in caplog.records if "refused by a limit" in record.message]
        assert len(refused) == 1
        assert "RLIMIT_NOFILE" in refused[0].message
        refusing["listing"] = False
        scheduler.run_due(110)                # one runs again, the other is still refused
        assert not any("periodic work runs again" in record.message for record in caplog.records)
        refusing["writing"] = False
        scheduler.run_due(120)
        assert sum("periodic work runs again" in record.message for record in caplog.records) == 1
        refusing["listing"] = True
        scheduler.run_due(130)                # hit again after recovering: said again
    assert sum("refused by a limit" in record.message for record in caplog.records) == 2


def test_other_limits_and_other_failures_are_each_their_own(caplog):
    scheduler = Scheduler()
    scheduler.every(10, lambda now: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", "/data/x")), now=0)
    scheduler.every(10, lambda now: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")),
                    now=0)
    with caplog.at_level(logging.INFO, logger="shmlog.broker.scheduler"):
        scheduler.run_due(10)
        scheduler.run_due(20)
    refused = [record.message for record in caplog.records if "refused by a limit" in
               record.message]
    assert len(refused) == 1 and "disk space" in refused[0] and "/data/x" in refused[0]
    assert sum("I/O error" in record.message for record in caplog.records) == 2


class Ticking:
    """A service whose tick fails while ``failing`` (its deadline does not move)."""

    def __init__(self, deadline: int):
        self.deadline, self.failing, self.ticks = deadline, True, []

    def next_deadline(self) -> int:
        return self.deadline

    def tick(self, now: int) -> None:
        self.ticks.append(now)
        if self.failing:
            emfile(now)
        self.deadline = now + 5_000


def test_a_service_whose_tick_fails_is_held_back_not_ticked_every_turn():
    service = Ticking(deadline=100)
    scheduler = Scheduler()
    scheduler.tick([service], 100)
    assert scheduler.next_due([service]) == 100 + limits.PERIODIC_RETRY_MS
    scheduler.tick([service], 101)
    assert service.ticks == [100]
    service.failing = False
    scheduler.tick([service], 100 + limits.PERIODIC_RETRY_MS)
    assert service.ticks == [100, 100 + limits.PERIODIC_RETRY_MS]
    assert scheduler.next_due([service]) == service.deadline


def test_a_programming_error_still_propagates():
    scheduler = Scheduler()
    scheduler.every(10, lambda now: [][1], now=0)
    with pytest.raises(IndexError):
        scheduler.run_due(10)
