"""docs/OPERATIONS.md's service, sizing and upgrade sections work as written: the
systemd unit passes ``systemd-analyze verify``, the broker's TOML file loads, the
/dev/shm formula is what a live broker and producer take, and the upgrade's restart
commands run against a real broker's data.

Method: the fenced blocks are read from the document by section and tag, never
copied into the test. Where a block names what only a real deployment has, the test
substitutes this host's: the unit's ExecStart points at this environment's
``shmlog``, the config's ``data_group`` is this user's group and its ``data_dir`` a
temporary directory. The sizing snippet is executed, its printed figure checked,
and its function compared with the sizes of the objects a real broker (the
package's shared one) and a producer made in /dev/shm. The upgrade block runs in bash
in a directory holding a stopped broker's data (a topic written through the log manager),
then the broker it started is stopped. The Docker section
is not run (no Docker daemon in the test environment).
"""

from __future__ import annotations

import grp
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import unlink_shared_memory, values_batch
from shmlog import LogManager
from shmlog.client.admin import Admin
from shmlog.client.producer import Producer
from shmlog.config.broker import BrokerConfig
from shmlog.protocol.control_client import request
from shmlog.shm import shared_memory

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
TIMEOUT_S = 120
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks(section: str, tag: str) -> list[str]:
    """The blocks tagged ``tag`` of the ``## section`` of OPERATIONS.md."""
    text = OPERATIONS.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    found = [body for found_tag, body in FENCE.findall(text[start:end if end > 0 else None])
             if found_tag.strip() == tag]
    assert found, f"OPERATIONS.md's section {section!r} has no {tag} block"
    return found


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_unit_verifies(tmp_path):
    unit = blocks("Run a broker as a systemd service", "ini")[0]
    shmlog = os.path.join(os.path.dirname(sys.executable), "shmlog")
    assert os.access(shmlog, os.X_OK), f"no shmlog command beside {sys.executable}"
    unit = unit.replace("/opt/shmlog/.venv/bin/shmlog", shmlog)
    path = tmp_path / "shmlog.service"
    path.write_text(unit)
    verified = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    assert verified.returncode == 0, verified.stderr
    assert "shmlog.service" not in verified.stderr, verified.stderr    # no warning about it


def test_the_broker_config_file_loads(tmp_path):
    config = blocks("Run a broker as a systemd service", "toml")[0]
    config = config.replace('"/var/lib/shmlog"', f'"{tmp_path / "data"}"')
    config = config.replace('data_group = "shmlog"',
                            f'data_group = "{grp.getgrgid(os.getgid()).gr_name}"')
    path = tmp_path / "broker.toml"
    path.write_text(config)
    loaded = BrokerConfig.load(str(path))
    assert loaded.data_dir == str(tmp_path / "data") and loaded.partitions_max == 16384
    assert loaded.data_group is not None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the certificate")
def test_the_kafka_listener_security_config_makes_its_listeners(tmp_path, caplog):
    from shmlog.wire.credentials import user_entry
    from shmlog.wire.kafka_listener import KafkaListener
    config = blocks("Kafka listener security", "toml")[0]
    certificate, key, users = tmp_path / "broker.pem", tmp_path / "broker.key", \
        tmp_path / "users.toml"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(certificate), "-days", "2", "-subj", "/CN=broker-1.example.com"],
                   check=True, capture_output=True, timeout=TIMEOUT_S)
    users.write_text(user_entry("alice", "secret", iterations=4096))
    for secret in (key, users):
        secret.chmod(0o600)
    # This host's files, and free loopback ports (the block binds every interface).
    for written, here in (("/var/lib/shmlog", tmp_path / "data"),
                          ("/etc/shmlog/tls/broker-1.pem", certificate),
                          ("/etc/shmlog/tls/broker-1.key", key),
                          ("/etc/shmlog/kafka-users.toml", users),
                          ('"EXTERNAL://0.0.0.0:9093,LOCAL://127.0.0.1:9092"',
                           '"EXTERNAL://127.0.0.1:0,LOCAL://127.0.0.1:0"')):
        assert written in config
        config = config.replace(written, str(here))
    path = tmp_path / "broker.toml"
    path.write_text(config)
    listener = KafkaListener(BrokerConfig.load(str(path)))
    try:
        assert [name for name, *_ in (endpoint.split("://") for endpoint in listener.endpoints)] \
            == ["EXTERNAL", "LOCAL"]
        assert listener.endpoints[0] == "EXTERNAL://broker-1.example.com:9093"
    finally:
        listener.stop()


def test_the_dev_shm_formula_is_what_a_broker_and_a_producer_take(integration_broker, capsys):
    snippet = blocks("Size /dev/shm", "python")[0]
    namespace: dict = {}
    exec(compile(snippet, "OPERATIONS.md", "exec"), namespace)
    assert capsys.readouterr().out.strip() == "403.7 MiB"
    dev_shm_bytes = namespace["dev_shm_bytes"]
    data_dir, ring_size = integration_broker, 1 << 20
    partitions_max = BrokerConfig().partitions_max          # the shared broker's
    Admin(data_dir).create_topic("sized")
    table = request(data_dir, "metadata")["state_table"]
    with Producer(data_dir, ring_size=ring_size) as producer:
        producer.send("sized", b"x").get(timeout=TIMEOUT_S)
        ring = os.stat(os.path.join(shared_memory.DIRECTORY, producer.ring.name))
    table_size = os.stat(os.path.join(shared_memory.DIRECTORY, table)).st_size
    assert table_size == dev_shm_bytes(partitions_max, [])
    assert ring.st_size == dev_shm_bytes(partitions_max, [ring_size]) - table_size
    assert ring.st_blocks * 512 >= ring.st_size          # allocated whole when made


def test_the_upgrade_restart_runs_as_written(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    data_dir = str(work / "data")
    with LogManager(data_dir) as logs:            # a stopped broker's data
        logs.create_topic("kept", 1)
        logs.partition_log("kept", 0).append(values_batch(10, 0))
    restart = blocks("Upgrade", "sh")[0]
    bin_directory = os.path.dirname(sys.executable)
    variables = {**os.environ, "PATH": f"{bin_directory}:{os.environ['PATH']}"}
    # The test stops the broker the block started, as the next step of a real upgrade
    # would leave it running.
    script = f"set -e -o pipefail\n{restart}\nshmlog topics describe kept --data-dir data\n" \
             f"kill %1\nwait %1\n"
    shell = subprocess.Popen(["bash", "-c", script], cwd=work, env=variables, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        output, _ = shell.communicate(timeout=TIMEOUT_S)
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)        # the block's broker, if it hung
        except ProcessLookupError:
            pass
        shell.wait()
        unlink_shared_memory(data_dir)
    assert shell.returncode == 0, output
    assert "kept" in output
