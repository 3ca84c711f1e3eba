"""``shmlog.LogHandler``: Python's logging into a topic through a real broker's
shared-memory path.

What is checked: a record arrives formatted by the handler's Formatter, with its level
and logger as headers (and the extra ones), its logger's name as key, and its
creation time as timestamp; many threads' records all arrive, each thread's in order;
a full buffer drops and counts (overflow="drop"), or makes the logging call wait
(overflow="block"), and close reports what was dropped; a formatter that logs does
not recurse; a record the broker cannot take is counted as failed and said on stderr;
a handler made before os.fork ships from both processes without the child touching
the parent's producer or re-sending the parent's buffered records; a multiprocessing
child's records and a program's at a plain exit are shipped without a close.

Method: the integration package's broker; each test its own topic. To hold the
shipping thread still (and so fill the buffer deterministically, without timing),
a test holds the handler's producer's own lock, which every send takes; waits are
bounded. No figure of time is asserted.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from helpers import read_partition
from shmlog import Admin, Consumer, InvalidConfigError, LogHandler, UnknownTopicOrPartitionError
from shmlog.client.consumer import TopicPartition

WAIT_S = 60
POLL_S = 0.01


def make_topic(data_dir: str, name: str, **config) -> str:
    Admin(data_dir).create_topic(name, 1, config=config or None)
    return name


def read(data_dir: str, topic: str, count: int) -> list:
    """The first ``count`` records of the topic (fewer if they do not come in WAIT_S)."""
    return read_partition(data_dir, topic, count, WAIT_S)


def end_offset(data_dir: str, topic: str) -> int:
    partition = TopicPartition(topic, 0)
    with Consumer(bootstrap=data_dir) as consumer:
        return consumer.end_offsets([partition])[partition]


def logger_for(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(POLL_S)


class ShipperHeld:
    """Holds the handler's shipping thread still: it blocks in a send, on the lock of
    the handler's producer, once it has taken the records buffered so far."""

    def __init__(self, handler: LogHandler, logger: logging.Logger):
        self.handler, self.logger = handler, logger

    def __enter__(self) -> "ShipperHeld":
        self.handler.flush()                          # nothing buffered, nothing in flight
        self.handler._producer._lock.acquire()
        self.logger.info("taken by the shipping thread, which then waits")
        wait_until(lambda: not self.handler._buffer, "the shipping thread to take a record")
        return self

    def __exit__(self, *exc_info) -> None:
        self.handler._producer._lock.release()


@pytest.fixture
def handler_factory():
    made: list[LogHandler] = []

    def make(*args, **kwargs) -> LogHandler:
        handler = LogHandler(*args, **kwargs)
        made.append(handler)
        return handler
    yield make
    for handler in made:
        handler.close()


def test_a_record_carries_its_text_level_logger_key_headers_and_time(integration_broker,
                                                                     handler_factory):
    topic = make_topic(integration_broker, "log-fields")
    handler = handler_factory(topic, integration_broker, key="logger",
                              headers={"host": "web-1", "raw": b"\x00\x01"})
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logger_for(handler, "app.db")
    before_ms = int(time.time() * 1000)
    logger.warning("slow query: %d ms", 1234)
    logger.info("caf\u00e9 \udcff")                # text that is no valid UTF-8 as is
    handler.flush()
    first, second = read(integration_broker, topic, 2)
    assert first.value == b"WARNING app.db: slow query: 1234 ms"
    assert first.key == b"app.db"
    assert first.headers == [("level", b"WARNING"), ("logger", b"app.db"), ("host", b"web-1"),
                             ("raw", b"\x00\x01")]
    assert before_ms - 1 <= first.timestamp <= second.timestamp
    assert second.value == "INFO app.db: caf\u00e9 \\udcff".encode()
    assert (handler.dropped, handler.failed) == (0, 0)


def test_many_threads_records_all_arrive_each_threads_in_order(integration_broker,
                                                               handler_factory):
    topic = make_topic(integration_broker, "log-threads")
    threads, per_thread = 4, 500
    handler = handler_factory(topic, integration_broker, overflow="block")
    logger = logger_for(handler, "threads")

    def work(number: int) -> None:
        for index in range(per_thread):
            logger.info("%d %d", number, index)

    workers = [threading.Thread(target=work, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    handler.flush()
    records = read(integration_broker, topic, threads * per_thread)
    seen: dict[int, list[int]] = {number: [] for number in range(threads)}
    for record in records:
        number, index = map(int, record.value.split())
        seen[number].append(index)
    assert seen == {number: list(range(per_thread)) for number in range(threads)}
    assert (handler.dropped, handler.failed) == (0, 0)


def test_a_full_buffer_drops_and_counts_and_close_says_so(integration_broker, handler_factory,
                                                          caplog):
    topic = make_topic(integration_broker, "log-drop")
    handler = handler_factory(topic, integration_broker, buffer_records=10)
    logger = logger_for(handler, "drop")
    with ShipperHeld(handler, logger):
        for index in range(15):
            logger.info("record %d", index)         # 10 buffered, 5 dropped
        assert handler.dropped == 5
    handler.flush()
    records = read(integration_broker, topic, 11)
    assert [record.value for record in records[1:]] == [b"record %d" % n for n in range(10)]
    with caplog.at_level(logging.WARNING, logger="shmlog.client.log_handler"):
        handler.close()
    assert "'log-drop': 5 records dropped (overflow='drop', buffer_records=10), 0 failed" \
        in caplog.text
    logger.info("after close")
    assert handler.dropped == 6


def test_a_full_buffer_blocks_the_call_with_overflow_block(integration_broker, handler_factory):
    topic = make_topic(integration_broker, "log-block")
    handler = handler_factory(topic, integration_broker, buffer_records=3, overflow="block",
                              block_ms=WAIT_S * 1000)
    logger = logger_for(handler, "block")
    with ShipperHeld(handler, logger):
        for index in range(3):
            logger.info("record %d", index)
        blocked = threading.Thread(target=logger.info, args=("the fourth",))
        blocked.start()
        wait_until(lambda: handler._waiting == 1, "the fourth call to wait for room")
        assert blocked.is_alive()
    blocked.join(WAIT_S)
    handler.flush()
    assert [record.value for record in read(integration_broker, topic, 5)[1:]] == \
        [b"record 0", b"record 1", b"record 2", b"the fourth"]
    assert handler.dropped == 0


def test_a_blocked_call_drops_after_block_ms(integration_broker, handler_factory):
    topic = make_topic(integration_broker, "log-block-timeout")
    handler = handler_factory(topic, integration_broker, buffer_records=1, overflow="block",
                              block_ms=1)
    logger = logger_for(handler, "block-timeout")
    with ShipperHeld(handler, logger):
        logger.info("buffered")
        logger.info("dropped after 1 ms")
        assert handler.dropped == 1


def test_a_formatter_that_logs_does_not_recurse(integration_broker, handler_factory):
    topic = make_topic(integration_broker, "log-recursion")
    handler = handler_factory(topic, integration_broker)
    logger = logger_for(handler, "recursion")

    class Chatty(logging.Formatter):
        def format(self, record):
            logger.warning("formatting %s", record.msg)     # back into this handler
            return super().format(record)

    handler.setFormatter(Chatty())
    logger.info("one")
    handler.flush()
    assert [record.value for record in read(integration_broker, topic, 1)] == [b"one"]
    assert (handler.dropped, handler.failed) == (0, 0)


def test_a_record_the_topic_refuses_is_counted_and_said_on_stderr(integration_broker,
                                                                  handler_factory, capsys):
    topic = make_topic(integration_broker, "log-too-large", **{"max.message.bytes": "2048"})
    handler = handler_factory(topic, integration_broker)
    logger = logger_for(handler, "large")
    logger.info("x" * 4096)
    logger.info("y" * 4096)
    logger.info("small")
    handler.flush()
    assert handler.failed == 2
    assert [record.value for record in read(integration_broker, topic, 1)] == [b"small"]
    said = [line for line in capsys.readouterr().err.splitlines() if "RecordTooLargeError" in line]
    assert len(said) == 1 and "max.message.bytes (2048)" in said[0]


def test_bad_settings_and_an_unknown_topic_are_refused(integration_broker):
    with pytest.raises(InvalidConfigError, match="overflow"):
        LogHandler("anything", integration_broker, overflow="wait")
    with pytest.raises(InvalidConfigError, match="buffer_records"):
        LogHandler("anything", integration_broker, buffer_records=0)
    with pytest.raises(InvalidConfigError, match="key"):
        LogHandler("anything", integration_broker, key="thread")
    with pytest.raises(UnknownTopicOrPartitionError):
        LogHandler("log-no-such-topic", integration_broker)


def test_a_handler_made_before_fork_ships_from_parent_and_child(integration_broker,
                                                                handler_factory):
    topic = make_topic(integration_broker, "log-fork")
    handler = handler_factory(topic, integration_broker)
    logger = logger_for(handler, "fork")
    with ShipperHeld(handler, logger):
        logger.info("parent, buffered at the fork")
        pid = os.fork()
        if pid == 0:                                      # the child
            code = 1
            try:
                logger.info("child %d", os.getpid())
                logging.shutdown()
                code = 0 if (handler.dropped, handler.failed) == (0, 0) else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + WAIT_S
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not exit")
        time.sleep(POLL_S)
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    logger.info("parent, after the fork")
    handler.flush()
    values = sorted(record.value for record in read(integration_broker, topic, 4))
    assert values == sorted([b"taken by the shipping thread, which then waits",
                             b"parent, buffered at the fork", b"child %d" % pid,
                             b"parent, after the fork"])
    assert end_offset(integration_broker, topic) == 4          # nothing shipped twice


def _child_logs(topic: str, data_dir: str) -> None:
    logging.getLogger("mp").info("from a multiprocessing child")    # no close, no shutdown


def test_a_multiprocessing_child_ships_without_a_close(integration_broker, handler_factory):
    topic = make_topic(integration_broker, "log-multiprocessing")
    handler = handler_factory(topic, integration_broker)
    logger_for(handler, "mp").info("from the parent")
    child = multiprocessing.get_context("fork").Process(target=_child_logs,
                                                        args=(topic, integration_broker))
    child.start()
    child.join(WAIT_S)
    assert child.exitcode == 0
    handler.flush()
    assert sorted(record.value for record in read(integration_broker, topic, 2)) == \
        [b"from a multiprocessing child", b"from the parent"]


def test_a_program_exiting_without_close_ships_what_it_logged(integration_broker):
    topic = make_topic(integration_broker, "log-exit")
    program = textwrap.dedent(f"""
        import logging
        from shmlog import LogHandler
        logging.basicConfig(level=logging.INFO, handlers=[
            LogHandler({topic!r}, {integration_broker!r})])
        for index in range(1000):
            logging.info("line %d", index)
        """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=WAIT_S * 2)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read(integration_broker, topic, 1000)
    assert [record.value for record in records] == [b"INFO:root:line %d" % n for n in range(1000)]
