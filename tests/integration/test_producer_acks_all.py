"""acks="all" end to end: a Producer tells the broker its acks, and a batch of an
acks=all producer completes once its partition's high watermark covers it; on a
single broker (the high watermark is the log end) that is once appended, as acks=1.
Under min.insync.replicas the producer's futures fail with the typed errors, and its
idempotent sequence stays right: a batch refused before the append (NOT_ENOUGH_REPLICAS:
no sequence used) is followed by an accepted one (KIP-360's epoch bump), a batch failed
after it (NOT_ENOUGH_REPLICAS_AFTER_APPEND: in the log, its sequence used) by the next
sequence under the same epoch.

Method: a real broker process (``Broker``) for the single-broker case. For the
min.insync cases no replica service exists yet to mark a partition under min ISR, so
the test runs a real ``BrokerCore`` and its ZeroMQ control endpoint in a thread of
this process, as ``serve`` runs them, and makes the replica service's calls
(``set_under_min_isr``, ``advance_high_watermark``) on that loop thread; the
Producer is the real one, through its ring in /dev/shm. The records are checked in
the logs.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import pytest

from helpers import all_records
from shmlog import LogManager
from shmlog.broker.appender import HighWatermarkPolicy
from shmlog.broker.control_server import ControlEndpoint, remove_control_socket
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.common import access
from shmlog.common.errors import (
    LocalProtocolError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
)
from shmlog.common.paths import RUN_DIRECTORY, control_address
from shmlog.server.broker import Broker, BrokerConfig, BrokerCore, request

WAIT_TIMEOUT_S = 30.0
LOOP_PAUSE_S = 0.0002


@pytest.fixture
def data_dir(clean_data_dir):
    return clean_data_dir


def logged_values(data_dir, topic):
    with LogManager(data_dir) as logs:
        return [record.value for record in all_records(logs.partition_log(topic, 0))]


def test_acks_all_on_a_single_broker_works_like_acks_1(data_dir):
    with Broker(data_dir):
        Admin(data_dir).create_topic("t")
        with Producer(data_dir, acks="all", batch_size=64) as strict, \
                Producer(data_dir, acks=-1) as minus_one, Producer(data_dir, acks=1) as leader:
            assert (strict.acks, minus_one.acks, leader.acks) == (-1, -1, 1)
            offsets = [producer.send("t", b"%d-%d" % (number, index)).get(timeout=30).offset
                       for index in range(20)
                       for number, producer in enumerate((strict, minus_one, leader))]
            assert offsets == list(range(60))
            batch = strict.send_batch("t", [b"b0", b"b1"]).get(timeout=30)
            assert (batch.base_offset, batch.record_count) == (60, 2)
        with pytest.raises(LocalProtocolError, match="acks"):
            request(data_dir, "register_producer", ring="x", acks=2)
    assert len(logged_values(data_dir, "t")) == 62


class ThreadBroker:
    """A BrokerCore and its control endpoint served by a thread of this process (the
    loop of ``broker.serve``, without its signals and warm-up); ``on_loop`` runs a
    function of the core on that thread, as a service of the broker would."""

    def __init__(self, data_dir: str):
        self.core = BrokerCore(BrokerConfig(data_dir=data_dir))
        access.make_directories(os.path.join(self.core.data_dir, RUN_DIRECTORY))
        self.control = ControlEndpoint(control_address(self.core.data_dir),
                                       self.core.host.table.appender_doorbell)
        self._calls: collections.deque = collections.deque()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            while self._calls:
                function, done, outcome = self._calls.popleft()
                outcome.append(function(self.core))
                done.set()
            handled = self.core.run_once(requests_waiting=self.control.waiting)
            answered = self.control.answer(self.core.handle)
            for ticket, reply in self.core.take_replies():
                self.control.send(ticket, reply)
            if not (handled or answered):
                time.sleep(LOOP_PAUSE_S)

    def on_loop(self, function):
        """``function(core)`` run on the loop thread; its result."""
        done, outcome = threading.Event(), []
        self._calls.append((function, done, outcome))
        assert done.wait(WAIT_TIMEOUT_S), "the loop did not run the call"
        return outcome[0]

    def wait_for_log_end(self, topic: str, offset: int) -> None:
        table = self.core.host.table
        row = self.on_loop(lambda core: core.host.appender.row_of(topic, 0))
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while table.snapshot(row).log_end_offset < offset:
            assert time.monotonic() < deadline, f"{topic} never reached offset {offset}"
            time.sleep(0.001)

    def close(self) -> None:
        """Stop the loop and close the broker (the logs can be opened then); once."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join(WAIT_TIMEOUT_S)
        self.control.stop()
        remove_control_socket(self.core.data_dir)
        self.core.close()


@pytest.fixture
def broker(data_dir):
    served = ThreadBroker(data_dir)
    yield served
    served.close()


def under_min_isr(broker, topic: str, under: bool, policy=None):
    def mark(core):
        appender = core.host.appender
        row = appender.row_of(topic, 0)
        if policy is not None:
            appender.set_high_watermark_policy(row, policy)
        appender.set_under_min_isr(row, under)
    broker.on_loop(mark)


def test_refused_before_the_append_fails_the_batch_and_the_next_one_is_accepted(
        broker, data_dir):
    Admin(data_dir).create_topic("t")
    under_min_isr(broker, "t", True)
    with Producer(data_dir, acks="all", linger_ms=0) as strict, \
            Producer(data_dir, acks=1, linger_ms=0) as leader:
        for value in (b"refused-0", b"refused-1"):
            with pytest.raises(NotEnoughReplicasError, match="min.insync.replicas"):
                strict.send("t", value).get(timeout=30)
        assert leader.send("t", b"acks=1 ignores it").get(timeout=30).offset == 0
        under_min_isr(broker, "t", False)
        assert strict.send("t", b"accepted").get(timeout=30).offset == 1
        assert strict.producer_epoch == 2, "each refused batch left a gap: a new epoch each"
        assert strict.send("t", b"next").get(timeout=30).offset == 2
    broker.close()
    assert logged_values(data_dir, "t") == [b"acks=1 ignores it", b"accepted", b"next"]


def test_failed_after_the_append_keeps_the_sequence_and_the_epoch(broker, data_dir):
    Admin(data_dir).create_topic("t")
    under_min_isr(broker, "t", False, HighWatermarkPolicy.EXTERNAL)
    with Producer(data_dir, acks="all", linger_ms=0) as strict:
        late = strict.send("t", b"late")
        broker.wait_for_log_end("t", 1)
        under_min_isr(broker, "t", True)         # the ISR shrank while it was parked
        broker.on_loop(lambda core: core.host.appender.advance_high_watermark(
            core.host.appender.row_of("t", 0), 1))
        with pytest.raises(NotEnoughReplicasAfterAppendError, match="appended"):
            late.get(timeout=30)
        under_min_isr(broker, "t", False)
        following = strict.send("t", b"following")
        broker.wait_for_log_end("t", 2)
        broker.on_loop(lambda core: core.host.appender.advance_high_watermark(
            core.host.appender.row_of("t", 0), 2))
        assert following.get(timeout=30).offset == 1, "sequence 1 under epoch 0: accepted"
        assert strict.producer_epoch == 0, "no gap, no new epoch"
    broker.close()
    assert logged_values(data_dir, "t") == [b"late", b"following"]
