"""Client settings are checked in the constructor, before any broker is asked:
every setting of the wrong type or out of range raises ``InvalidConfigError`` (a
``LocalProtocolError``) naming the setting.

Method: construct ``Producer``, ``Consumer`` and ``Admin`` against a data directory
where no broker runs. A valid setting would go on to ask the broker (and fail with
``BrokerNotAvailableError``), so an ``InvalidConfigError`` proves the check came
first and nothing was created. The integration tests of each client use edge values
(0, numpy integers) that must pass.
"""

from __future__ import annotations

import pytest

from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer
from shmlog.client.producer import Producer
from shmlog.common.errors import InvalidConfigError, LocalProtocolError


@pytest.fixture
def nowhere(tmp_path):
    """A data directory without a broker (nor a directory)."""
    return str(tmp_path / "no-broker")


@pytest.mark.parametrize("settings, named", [
    ({"linger_ms": -1}, "linger_ms"),
    ({"linger_ms": 2**31}, "linger_ms"),
    ({"linger_ms": 5.0}, "linger_ms"),
    ({"linger_ms": "5"}, "linger_ms"),
    ({"batch_size": -1}, "batch_size"),
    ({"batch_size": 2**40}, "batch_size"),
    ({"batch_size": True}, "batch_size"),
    ({"max_block_ms": -5}, "max_block_ms"),
    ({"max_block_ms": None}, "max_block_ms"),
    ({"acks": 2}, "acks"),
    ({"acks": True}, "acks"),
    ({"acks": "1"}, "acks"),
    ({"compression": "gzip"}, "compression"),
    ({"ring_size": 1000}, "ring capacity"),
    ({"enable_idempotence": "false"}, "enable_idempotence"),
    ({"bootstrap": 7}, "bootstrap"),
])
def test_bad_producer_settings(nowhere, settings, named):
    settings = {"bootstrap": nowhere, **settings}
    with pytest.raises(LocalProtocolError, match=named):
        Producer(**settings)


@pytest.mark.parametrize("settings, named", [
    ({"max_poll_records": 0}, "max_poll_records"),
    ({"max_poll_records": 2**31}, "max_poll_records"),
    ({"max_poll_records": 10.5}, "max_poll_records"),
    ({"fetch_max_bytes": 0}, "fetch_max_bytes"),
    ({"fetch_max_bytes": "1MB"}, "fetch_max_bytes"),
    ({"consumer_timeout_ms": -1}, "consumer_timeout_ms"),
    ({"consumer_timeout_ms": 1e3}, "consumer_timeout_ms"),
    ({"auto_offset_reset": "smallest"}, "auto_offset_reset"),
    ({"auto_offset_reset": None}, "auto_offset_reset"),
    ({"enable_auto_commit": 1}, "enable_auto_commit"),
    ({"auto_commit_interval_ms": -1}, "auto_commit_interval_ms"),
    ({"session_timeout_ms": 0}, "session_timeout_ms"),
    ({"heartbeat_interval_ms": "3s"}, "heartbeat_interval_ms"),
    ({"max_poll_interval_ms": 2**40}, "max_poll_interval_ms"),
    ({"group_id": 5}, "group_id"),
    ({"client_id": b"me"}, "client_id"),
    ({"partition_assignment_strategy": ["sticky"]}, "partition_assignment_strategy"),
])
def test_bad_consumer_settings(nowhere, settings, named):
    settings = {"bootstrap": nowhere, **settings}
    with pytest.raises(InvalidConfigError if named != "partition_assignment_strategy"
                       else LocalProtocolError, match=named):
        Consumer(**settings)


@pytest.mark.parametrize("timeout_ms", [-1, 2**31, 1.5, "10"])
def test_bad_admin_settings(nowhere, timeout_ms):
    with pytest.raises(InvalidConfigError, match="timeout_ms"):
        Admin(nowhere, timeout_ms=timeout_ms)

