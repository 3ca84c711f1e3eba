"""rsyslog's omkafka (librdkafka inside rsyslogd, Debian's rsyslog-kafka) ships a host's
syslog lines into a topic through the Kafka listener, and shmlog's own Consumer reads
them back, in order.

Method: the module's broker; a private rsyslogd (never the system's): its own
configuration, work directory and pid file in tmp_path, ``-n`` (in the foreground, a
child of the test), imuxsock on a private socket (rate limiting off, the host's
/dev/log untouched), omkafka to the listener's 127.0.0.1 port. Lines are sent as
syslog datagrams to that socket (as ``logger -u SOCKET`` sends them; ``logger`` itself
sends one too when it is installed). Every wait is bounded; rsyslogd is stopped with
SIGTERM (killed past a bound) and reaped. Skips, saying why, where rsyslogd or its
omkafka module is not installed (``make test`` installs rsyslog and rsyslog-kafka as
root with apt-get).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from helpers import read_partition
from shmlog import Admin

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
RSYSLOGD = shutil.which("rsyslogd", path=SBIN_PATH)
# Where Debian (multiarch) and other distributions put rsyslog's modules.
OMKAFKA = next(iter(glob.glob("/usr/lib/*/rsyslog/omkafka.so") +
                    glob.glob("/usr/lib*/rsyslog/omkafka.so")), None)
LOGGER = shutil.which("logger")
WAIT_S = 60
STOP_WAIT_S = 20
POLL_S = 0.05
LINES = 200

pytestmark = pytest.mark.skipif(
    RSYSLOGD is None or OMKAFKA is None,
    reason=f"rsyslogd ({RSYSLOGD or 'not installed'}) and its omkafka module "
           f"({OMKAFKA or 'not installed'}) are needed: Debian's rsyslog and rsyslog-kafka "
           f"(make test installs them as root)")

CONFIG = """\
global(workDirectory="{work}")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="{socket}" CreatePath="on" RateLimit.Interval="0")
module(load="omkafka")
template(name="line" type="string" string="%syslogtag%%msg%")
action(type="omkafka" broker=["{broker}"] topic="{topic}" template="line"
       confParam=["queue.buffering.max.ms=5"])
"""


@pytest.fixture
def rsyslogd(tmp_path, kafka_broker):
    """Start a private rsyslogd shipping to ``topic``: a function of the topic that
    returns its socket's path; stopped and reaped at the end."""
    started: list[subprocess.Popen] = []

    def start(topic: str) -> str:
        work = tmp_path / "rsyslog"
        work.mkdir()
        path = str(work / "log.sock")
        config = work / "rsyslog.conf"
        config.write_text(CONFIG.format(work=work, socket=path, broker=kafka_broker[1],
                                        topic=topic))
        process = subprocess.Popen([RSYSLOGD, "-n", "-f", str(config), "-i",
                                    str(work / "rsyslogd.pid")], start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started.append(process)
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(path):
            if process.poll() is not None:
                pytest.fail(f"rsyslogd exited with {process.returncode}: "
                            f"{process.stdout.read().decode(errors='replace')[-3000:]}")
            assert time.monotonic() < deadline, f"rsyslogd made no socket in {WAIT_S} s"
            time.sleep(POLL_S)
        return path

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_WAIT_S)
        process.stdout.close()


def read(data_dir: str, topic: str, count: int) -> list:
    """The first ``count`` records of the topic (fewer if they do not come in WAIT_S)."""
    return read_partition(data_dir, topic, count, WAIT_S)


def test_omkafka_ships_syslog_lines_into_a_topic(kafka_broker, rsyslogd):
    data_dir, _ = kafka_broker
    topic = "rsyslog-lines"
    Admin(data_dir).create_topic(topic, 1)
    path = rsyslogd(topic)
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for index in range(LINES):
            # <14>: facility user, severity info; a tag, then the message.
            sender.sendto(b"<14>shmlog-test[%d]: line %d" % (os.getpid(), index), path)
    finally:
        sender.close()
    expected = [b"shmlog-test[%d]: line %d" % (os.getpid(), index) for index in range(LINES)]
    if LOGGER is not None:
        subprocess.run([LOGGER, "-u", path, "-t", "from-logger", "one more line"], check=True,
                       timeout=WAIT_S)
        expected.append(b"from-logger: one more line")
    records = read(data_dir, topic, len(expected))
    assert [record.value for record in records] == expected
