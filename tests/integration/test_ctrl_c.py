"""Ctrl-C ends every command that runs until stopped (``produce`` from a pipe that
never ends, ``consume`` following a topic, ``status --watch``): promptly, without a
traceback, with 130 (128 + SIGINT, as Kafka's console tools exit), also when the
command was started with SIGINT ignored (as a shell starts a background command),
and ``produce`` loses nothing it acknowledged.

Method: the package's shared broker; each command runs as a process of its own
(``python -m shmlog``), is given time to be at work (``produce``: records arrive in
the log; ``consume`` and ``status``: a first line on stdout), then SIGINT after a
random pause, ``ROUNDS`` times per command, half of them with SIGINT ignored by the
parent; two rounds run at a time (``LANES``: each command's start-up, its imports
and numba's cache, is most of a round). ``produce`` reads ``yes hello``; ``consume``
follows a topic a thread of this process keeps producing to, so both work under
load. Each command's end is
waited for ``EXIT_WITHIN_S`` at most (then the test fails and the process is
killed); every process and pipe is closed.
"""

from __future__ import annotations

import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shmlog.client.admin import Admin
from shmlog.client.producer import Producer

ROUNDS = 50
LANES = 2
EXIT_WITHIN_S = 30          # a bound for a loaded machine, never a measurement
START_WITHIN_S = 60
PAUSE_MAX_S = 0.3           # the random pause between "at work" and the signal
INTERRUPTED = 130
ACKNOWLEDGED = re.compile(rb"stopped by SIGINT: (\d+) records acknowledged")


@pytest.fixture(scope="module")
def broker(integration_broker):
    return integration_broker


def ignore_sigint() -> None:
    """What a shell does to a command it starts in the background (``cmd &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(data_dir: str, *arguments: str, sigint_ignored: bool, stdin=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shmlog", *arguments, "--data-dir", data_dir],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ignore_sigint if sigint_ignored else None)


def wait_for_output(command: subprocess.Popen) -> None:
    """Until the command writes to stdout (it is at work), at most START_WITHIN_S."""
    ready, _, _ = select.select([command.stdout], [], [], START_WITHIN_S)
    assert ready, f"no output within {START_WITHIN_S} s"


def interrupt(command: subprocess.Popen, rng: random.Random) -> tuple[int, bytes, bytes]:
    """SIGINT after a random pause; the exit status and the output, or a failure if
    it does not end within EXIT_WITHIN_S."""
    time.sleep(rng.uniform(0, PAUSE_MAX_S))
    command.send_signal(signal.SIGINT)
    try:
        out, errors = command.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_WITHIN_S} s after SIGINT")
    return command.returncode, out, errors


def end_command(command: subprocess.Popen) -> None:
    if command.poll() is None:
        command.kill()
    command.communicate(timeout=EXIT_WITHIN_S)


def check_ended(code: int, errors: bytes, round_number: int) -> None:
    assert b"Traceback" not in errors, f"round {round_number}: {errors.decode()[-3000:]}"
    assert code == INTERRUPTED, f"round {round_number}: exit {code}: {errors.decode()[-3000:]}"


def run_rounds(one_round) -> None:
    """``one_round(round_number, lane)`` for every round, LANES at a time; the first
    failure is raised."""
    def lane(number: int) -> None:
        for round_number in range(number, ROUNDS, LANES):
            one_round(round_number, number)
    with ThreadPoolExecutor(LANES) as pool:
        for done in [pool.submit(lane, number) for number in range(LANES)]:
            done.result()


def log_end(data_dir: str, topic: str) -> int:
    [partition] = Admin(data_dir).list_offsets(topic)
    return partition["log_end_offset"]


def test_produce_from_an_endless_pipe_stops_on_ctrl_c_keeping_what_it_acknowledged(broker):
    for lane in range(LANES):
        Admin(broker).create_topic(f"ctrl-c-produce-{lane}", 1)

    def one_round(round_number: int, lane: int) -> None:
        topic = f"ctrl-c-produce-{lane}"            # this lane's producer is its only one
        before = log_end(broker, topic)
        lines = subprocess.Popen(["yes", "hello"], stdout=subprocess.PIPE)
        command = start(broker, "produce", topic, stdin=lines.stdout,
                        sigint_ignored=round_number % 2 == 1)
        lines.stdout.close()                   # the producer holds the pipe's only reader
        try:
            deadline = time.monotonic() + START_WITHIN_S
            while log_end(broker, topic) == before:
                assert command.poll() is None, command.communicate()[1].decode()[-3000:]
                assert time.monotonic() < deadline, f"no record within {START_WITHIN_S} s"
                time.sleep(0.02)
            code, _, errors = interrupt(command, random.Random(round_number))
        finally:
            end_command(command)
            lines.kill()
            lines.wait(timeout=EXIT_WITHIN_S)
        check_ended(code, errors, round_number)
        found = ACKNOWLEDGED.search(errors)
        assert found, f"round {round_number}: {errors.decode()[-3000:]}"
        assert log_end(broker, topic) - before >= int(found.group(1)), \
            f"round {round_number}: acknowledged records are missing"
    run_rounds(one_round)


@pytest.fixture(scope="module")
def steady_producer(broker):
    """A thread producing to ``ctrl-c-follow`` until the test ends: the consumers
    follow a topic under load."""
    Admin(broker).create_topic("ctrl-c-follow", 1)
    stop = threading.Event()

    def produce():
        with Producer(broker, linger_ms=5) as producer:
            number = 0
            while not stop.is_set():
                producer.send("ctrl-c-follow", b"record %d" % number)
                number += 1
                if number % 200 == 0:
                    producer.flush()
                    stop.wait(0.01)
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=EXIT_WITHIN_S)
    assert not thread.is_alive()


def test_consume_following_a_busy_topic_stops_on_ctrl_c(broker, steady_producer):
    def one_round(round_number: int, lane: int) -> None:
        command = start(broker, "consume", "ctrl-c-follow",
                        sigint_ignored=round_number % 2 == 1)
        try:
            wait_for_output(command)
            code, _, errors = interrupt(command, random.Random(round_number))
        finally:
            end_command(command)
        check_ended(code, errors, round_number)
        assert b"Processed a total of" in errors, errors.decode()[-3000:]
    run_rounds(one_round)


def test_status_watch_stops_on_ctrl_c(broker, steady_producer):
    def one_round(round_number: int, lane: int) -> None:
        command = start(broker, "status", "--watch", "0.1",
                        sigint_ignored=round_number % 2 == 1)
        try:
            wait_for_output(command)
            code, _, errors = interrupt(command, random.Random(round_number))
        finally:
            end_command(command)
        check_ended(code, errors, round_number)
    run_rounds(one_round)


def test_the_exit_codes_are_documented():
    from shmlog.cli import exit_codes
    assert exit_codes.EXIT_INTERRUPTED == INTERRUPTED
    assert exit_codes.exit_on_signal(signal.SIGTERM) == 143
    assert "130" in exit_codes.__doc__ and "143" in exit_codes.__doc__
