"""``shmlog produce`` and ``shmlog consume`` against a real broker, as Kafka's console
tools behave: headers go in (per line and ``--header``) and come out
(``--print-headers`` and the other ``print.*`` fields); the consumer follows the
topic until Ctrl-C, and as a group member commits exactly what it printed; the
producer shows a rate line on a terminal only, ends with a summary, and gets
through more lines than its window of unacknowledged records holds.

Method: the package's shared broker (``integration_broker``: a group's first
rebalance without Kafka's initial delay). The commands run through ``cli.main`` in this
process, with stdin and stdout replaced, except where a process of their own is the point: following
until SIGINT (records sent after the consumer printed the first ones, then the
signal), and a real pseudo-terminal (``os.openpty``) on the producer's stderr.
Every read and wait is bounded.
"""

from __future__ import annotations

import fcntl
import io
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from shmlog import cli
from shmlog.client.admin import Admin
from shmlog.client.consumer import Consumer, TopicPartition
from shmlog.client.producer import Producer
from shmlog.common import limits

TIMEOUT_S = 120


@pytest.fixture
def broker(integration_broker):
    return integration_broker


@pytest.fixture
def shmlog(monkeypatch, capsysbinary):
    """``shmlog(data_dir, *arguments, stdin=b"")``: the command run in this process
    (what a subprocess would pay again: numba and the kernels are loaded here
    already), with ``stdin`` as its input; (exit code, stdout, stderr) as bytes."""
    def run(data_dir, *arguments, stdin=b""):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = cli.main([*arguments, "--data-dir", data_dir])
        captured = capsysbinary.readouterr()
        return code, captured.out, captured.err
    return run


def end_offsets(data_dir, topic) -> int:
    """The records of every partition of ``topic``."""
    count = len(Admin(data_dir).describe_topic(topic)["partitions"])
    with Consumer(bootstrap=data_dir) as consumer:
        return sum(consumer.end_offsets([TopicPartition(topic, partition)
                                         for partition in range(count)]).values())


def committed_total(data_dir, group_id) -> int:
    """The sum of a group's committed offsets (each entry's first field is the offset)."""
    return sum(entry[0] for entry in
               Admin(data_dir).list_consumer_group_offsets(group_id).values())


def test_headers_go_in_per_line_and_per_flag_and_come_out_as_kafka_prints_them(broker, shmlog):
    Admin(broker).create_topic("headed", 1)
    code, _, errors = shmlog(broker, "produce", "headed", "--parse-headers", "--key-separator",
                             ":", "--header", "source=cli",
                             stdin=b"trace:7,flag\tk1:first\n\tsecond\n")
    assert code == 0, errors
    assert errors.startswith(b"produced 2 records")
    code, printed, errors = shmlog(broker, "consume", "headed", "--from-beginning",
                                   "--max-messages", "2", "--print-partition",
                                   "--print-offset", "--print-headers", "--print-key",
                                   "--property", "null.literal=NULL")
    assert code == 0, errors
    assert printed.splitlines() == [
        b"Partition:0\tOffset:0\ttrace:7,flag:NULL,source:cli\tk1\tfirst",
        b"Partition:0\tOffset:1\tsource:cli\tNULL\tsecond"]
    assert b"Processed a total of 2 messages" in errors


def read_line(stream, deadline: float) -> bytes:
    """One line of a child's stdout pipe, waiting until ``deadline`` at most."""
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no line in time (so far {line!r})"
        byte = os.read(stream.fileno(), 1)
        assert byte, f"the consumer ended (so far {line!r})"
        line += byte
    return line


def test_consume_follows_the_topic_until_ctrl_c(broker):
    Admin(broker).create_topic("followed", 1)
    with Producer(broker) as producer:
        for number in range(3):
            producer.send("followed", b"early %d" % number).get(timeout=TIMEOUT_S)
    consumer = subprocess.Popen([sys.executable, "-m", "shmlog", "consume", "followed",
                                 "--from-beginning", "--data-dir", broker],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        assert [read_line(consumer.stdout, deadline) for _ in range(3)] == \
            [b"early 0\n", b"early 1\n", b"early 2\n"]
        with Producer(broker) as producer:            # sent while it waits
            for number in range(2):
                producer.send("followed", b"late %d" % number).get(timeout=TIMEOUT_S)
        assert [read_line(consumer.stdout, deadline) for _ in range(2)] == \
            [b"late 0\n", b"late 1\n"]
        assert consumer.poll() is None, "the consumer stopped without being asked"
        consumer.send_signal(signal.SIGINT)
        _, errors = consumer.communicate(timeout=TIMEOUT_S)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    assert consumer.returncode == 130, errors        # 128 + SIGINT, as Kafka's consumer
    assert b"Processed a total of 5 messages" in errors


def test_a_group_member_commits_what_it_printed_and_the_next_goes_on_from_there(broker,
                                                                              shmlog):
    Admin(broker).create_topic("grouped", 2)
    with Producer(broker) as producer:
        for number in range(10):
            producer.send("grouped", b"r%d" % number, key=b"k%d" % number)
    code, first, errors = shmlog(broker, "consume", "grouped", "--group", "printers",
                                 "--from-beginning", "--max-messages", "4")
    assert code == 0, errors
    assert len(first.splitlines()) == 4
    assert committed_total(broker, "printers") == 4
    code, rest, errors = shmlog(broker, "consume", "grouped", "--group", "printers",
                                "--max-messages", "6")
    assert code == 0, errors
    assert sorted(first.splitlines() + rest.splitlines()) == \
        sorted(b"r%d" % number for number in range(10))
    assert committed_total(broker, "printers") == 10


def test_a_file_on_a_terminal_shows_a_rate_line_then_a_summary(broker, tmp_path, shmlog):
    Admin(broker).create_topic("rated", 1)
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"line %d\n" % number for number in range(5000)))
    controller, terminal = os.openpty()
    # 120 columns, and no rows: as a new pseudo-terminal says (tqdm hid its line then).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 120, 0, 0))
    producer = subprocess.Popen([sys.executable, "-m", "shmlog", "produce", "rated",
                                 str(lines), "--data-dir", broker],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=terminal)
    os.close(terminal)
    shown = b""
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:                   # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            elif producer.poll() is not None:
                break
        producer.wait(timeout=TIMEOUT_S)
    finally:
        os.close(controller)
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    assert producer.returncode == 0, shown
    assert b"\r" in shown and b"records/s" in shown and b"B/s" in shown, shown   # tqdm's line
    assert b"5,000 records" in shown, shown
    assert b"produced 5000 records" in shown, shown

    code, _, errors = shmlog(broker, "produce", "rated", str(lines))   # stderr: no terminal
    assert code == 0, errors
    assert errors.count(b"\n") == 1 and b"\r" not in errors
    assert errors.startswith(b"produced 5000 records (0.0 MB) to rated in ")
    assert end_offsets(broker, "rated") == 10000


def test_more_lines_than_the_window_holds_are_all_acknowledged(broker, tmp_path, shmlog):
    Admin(broker).create_topic("windowed", 2)
    count = limits.CONSOLE_PRODUCE_UNACKNOWLEDGED_RECORDS_MAX * 2 + 1
    lines = tmp_path / "many.txt"
    lines.write_bytes(b"".join(b"k%d\tv\n" % (number % 100) for number in range(count)))
    code, _, errors = shmlog(broker, "produce", "windowed", str(lines), "--property",
                             "parse.key=true", "--quiet")
    assert code == 0, errors
    assert errors == b""
    assert end_offsets(broker, "windowed") == count


def test_a_refused_record_ends_produce_with_the_brokers_reason(broker, shmlog):
    code, _, errors = shmlog(broker, "produce", "no-such-topic", stdin=b"lost\n")
    assert code == 1
    assert b"no-such-topic" in errors
