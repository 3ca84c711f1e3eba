"""A consumer's check that its broker lives reads the broker's pid from the state
table: a pid no process can have (issue 27) means the broker is gone, never an
OverflowError from kill(2) nor a kill(2) of a process group (0, negative)."""

from __future__ import annotations

import os

import pytest

from shmlog.client.consumer_metadata import ConsumerMetadata


class _Recording(ConsumerMetadata):
    """Counts the attaches the liveness check asks for (no broker runs here)."""

    attaches = 0

    def attach(self, reopen=lambda: None) -> None:
        self.attaches += 1


@pytest.mark.parametrize("pid", [1 << 40, 1 << 31, 0, -1])
def test_a_broker_pid_no_process_has_is_a_broker_gone(tmp_path, pid):
    metadata = _Recording(str(tmp_path))
    metadata._broker_pid = pid
    metadata.check_broker(lambda: None)
    assert metadata.attaches == 1


def test_a_live_broker_pid_is_left_alone(tmp_path):
    metadata = _Recording(str(tmp_path))
    metadata._broker_pid = os.getpid()
    metadata.check_broker(lambda: None)
    assert metadata.attaches == 0
