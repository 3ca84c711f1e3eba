"""The broker loop's scheduler: tasks run when due, in the order added, once per
turn however late the turn is, and are due again an interval after that turn.

Method: a Scheduler driven with explicit times; tasks record the times they ran at.
"""

from __future__ import annotations

from shmlog.broker.scheduler import Scheduler


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
