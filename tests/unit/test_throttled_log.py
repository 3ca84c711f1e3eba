"""ThrottledWarnings: a warning a peer or client can provoke in a loop is logged at
most once per interval, and the next one logged counts those suppressed."""

from __future__ import annotations

import logging

from shmlog.common.throttled_log import ThrottledWarnings


def test_warnings_within_the_interval_are_counted_not_logged(caplog):
    log = logging.getLogger("shmlog.test.throttled")
    warnings = ThrottledWarnings(log, interval_s=3600.0)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for number in range(3):
            warnings.warn("refused %d", number)
        assert [record.getMessage() for record in caplog.records] == ["refused 0"]
        warnings.last -= 3600.0                   # the interval has passed
        warnings.warn("refused %d", 3)
    assert [record.getMessage() for record in caplog.records] == [
        "refused 0", "refused 3 (2 similar warnings suppressed)"]
