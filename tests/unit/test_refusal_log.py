"""RefusalLog: appends the log refused are all counted, and logged as one line at
the first, then one line with the count since, no more often than
``limits.APPEND_REFUSAL_LOG_INTERVAL_S``; never a traceback.

Method: a RefusalLog with a clock the test moves, and pytest's log capture.
"""

from __future__ import annotations

import logging

from shmlog.broker.appender.log_appends import RefusalLog
from shmlog.common import limits
from shmlog.common.errors import StorageError

INTERVAL = limits.APPEND_REFUSAL_LOG_INTERVAL_S


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "shmlog.broker.appender"]


def test_the_first_refusal_is_one_line_without_a_traceback(caplog):
    refusals = RefusalLog(Clock())
    with caplog.at_level(logging.ERROR):
        refusals.refused("/data/topics/t/0", StorageError("disk full: cannot reserve 4096 bytes"))
    [record] = lines(caplog)
    assert record.exc_info is None
    assert record.getMessage() == ("append to /data/topics/t/0 refused: disk full: cannot "
                                   "reserve 4096 bytes (1 refused since the broker started)")
    assert refusals.count == 1


def test_a_run_of_refusals_is_counted_and_summed_up_once_per_interval(caplog):
    clock = Clock()
    refusals = RefusalLog(clock)
    with caplog.at_level(logging.ERROR):
        for _ in range(1000):                      # all within one interval
            refusals.refused("/d", StorageError("disk full"))
            clock.now += INTERVAL / 2000
        assert len(lines(caplog)) == 1
        clock.now += INTERVAL
        refusals.refused("/d", StorageError("disk full"))
    assert refusals.count == 1001
    assert len(lines(caplog)) == 2
    assert lines(caplog)[1].getMessage() == ("append to /d refused: disk full (999 more "
                                             "refused since the last report) (1001 refused "
                                             "since the broker started)")


def test_a_refusal_after_a_quiet_interval_is_logged_again(caplog):
    clock = Clock()
    refusals = RefusalLog(clock)
    with caplog.at_level(logging.ERROR):
        refusals.refused("/d", StorageError("disk full"))
        clock.now += INTERVAL
        refusals.refused("/d", StorageError("I/O error"))
    assert [record.getMessage() for record in lines(caplog)][1] == \
        "append to /d refused: I/O error (2 refused since the broker started)"
