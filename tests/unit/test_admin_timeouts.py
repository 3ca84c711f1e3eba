"""Admin's timeouts: a topic change waits past a cluster broker's own wait for it to
take effect (``limits.ADMIN_TOPIC_CHANGE_WAIT_MS``), so a loaded broker's answer comes
before a false "no broker answered"; a timeout given is the one used.

Method: a control socket that takes requests and never answers (a broker too busy),
bound where the broker's would be; the change wait shortened for the test."""

from __future__ import annotations

import os

import pytest
import zmq

from shmlog.client.admin import Admin
from shmlog.common import limits
from shmlog.common.errors import BrokerNotAvailableError
from shmlog.common.paths import control_address, control_path


@pytest.fixture
def silent_broker(tmp_path):
    data_dir = str(tmp_path / "data")
    os.makedirs(os.path.dirname(control_path(data_dir)), exist_ok=True)
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(control_address(data_dir))
    yield data_dir
    socket.close()


def test_a_topic_change_waits_the_change_wait_and_a_given_timeout_wins(silent_broker,
                                                                       monkeypatch):
    monkeypatch.setattr(limits, "ADMIN_TOPIC_CHANGE_WAIT_MS", 300)
    admin = Admin(silent_broker)
    assert admin.timeout_ms == 10_000
    for change in (lambda: admin.create_topic("t"), lambda: admin.delete_topic("t"),
                   lambda: admin.add_partitions("t", 2),
                   lambda: admin.alter_topic_config("t", {"retention.ms": "1"})):
        with pytest.raises(BrokerNotAvailableError, match="within 300 ms.*may be busy"):
            change()
    with pytest.raises(BrokerNotAvailableError, match="within 200 ms"):
        Admin(silent_broker, timeout_ms=200).create_topic("t")
    with pytest.raises(BrokerNotAvailableError, match="within 100 ms"):
        admin.delete_topics(["t"], timeout_ms=100)
