"""Internal topics keep their commits, and a malformed topic name is a typed error
(issue 27, rows 5 and 8).

* DeleteRecords of ``__consumer_offsets`` is refused per partition with Kafka's
  ``INVALID_TOPIC_EXCEPTION`` (``InternalTopicError`` through Admin), and nothing
  moves: after a restart the group's committed offsets are still there.
* A config change that could let retention delete ``__consumer_offsets``' records
  (a cleanup policy with ``delete``, its ``compact`` override removed, retention
  settings) is refused (``InternalTopicConfigError``), through ``alter_topic_config``
  and kafka-python's ``alter_configs``; a compaction setting may still change.
* ``shmlog delete-records`` and ``shmlog topics alter`` (clients of the same
  requests) fail with the broker's refusal, nothing changed.
* Every topic request with a list, a dict, an int or None where a topic name goes
  is answered ``LocalProtocolError`` naming the field, and the broker goes on serving.

Method: a real broker process of this module's own for the refusals (it is
restarted), the package's shared broker for the malformed names; Admin as a client
uses it, and raw control requests for what Admin shapes itself.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import unlink_shared_memory
from shmlog.client.admin import Admin, ConfigResource, ConfigResourceType
from shmlog.client.consumer import TopicPartition
from shmlog.client.producer import Producer
from shmlog.common.errors import (
    InternalTopicConfigError,
    InternalTopicError,
    LocalProtocolError,
)
from shmlog.common.internal_topics import OFFSETS_TOPIC
from shmlog.protocol.control_client import request
from shmlog.server.broker import Broker
from shmlog.storage import delete_records as deletion

GROUP = "keeper"
# A CLI command starts a Python process and asks once: seconds on a loaded machine.
CLI_TIMEOUT_S = 120
COMMITTED = {("kept", 0): 7, ("kept", 1): 11}


@pytest.fixture(scope="module")
def committed_broker(tmp_path_factory):
    """A broker with a topic and a group's commits in ``__consumer_offsets``;
    yields ``[broker]`` (a test restarts it in place)."""
    data_dir = str(tmp_path_factory.mktemp("internal-topics") / "data")
    holder = [Broker(data_dir).start()]
    try:
        admin = Admin(data_dir)
        admin.create_topic("kept", 2)
        with Producer(data_dir) as producer:
            for future in [producer.send("kept", b"record", partition=partition)
                           for partition in (0, 1) for _ in range(20)]:
                future.get(timeout=30)
        admin.alter_consumer_group_offsets(GROUP, COMMITTED)
        assert _committed(admin) == COMMITTED
        yield holder
    finally:
        holder[0].stop()
        unlink_shared_memory(data_dir)


def _committed(admin: Admin) -> dict:
    return {tuple(partition): entry.offset
            for partition, entry in admin.list_consumer_group_offsets(GROUP).items()}


def _restart(holder: list) -> Admin:
    """Stop and start the broker; its Admin once the group's commits are read back."""
    data_dir = holder[0].data_dir
    holder[0].stop()
    holder[0] = Broker(data_dir).start()
    return Admin(data_dir)


def test_delete_records_of_the_offsets_topic_is_refused(committed_broker):
    admin = Admin(committed_broker[0].data_dir)
    partitions = len(admin.describe_topic(OFFSETS_TOPIC)["partitions"])
    starts = [entry["log_start_offset"] for entry in admin.list_offsets(OFFSETS_TOPIC)]
    everything = {TopicPartition(OFFSETS_TOPIC, partition): deletion.HIGH_WATERMARK
                  for partition in range(partitions)}

    with pytest.raises(InternalTopicError, match="internal topic"):
        admin.delete_records(everything, timeout_ms=5_000)
    report = admin.delete_records_report(
        {tuple(key): offset for key, offset in everything.items()}, timeout_ms=5_000)
    assert {entry["error"] for entry in report} == {deletion.INVALID_TOPIC_EXCEPTION}
    assert len(report) == partitions
    mixed = admin.delete_records_report({("kept", 0): 0, (OFFSETS_TOPIC, 0): 0},
                                        timeout_ms=5_000)
    assert [entry["error"] for entry in mixed] == [None, deletion.INVALID_TOPIC_EXCEPTION]
    assert [entry["log_start_offset"] for entry in admin.list_offsets(OFFSETS_TOPIC)] == starts

    admin = _restart(committed_broker)
    assert _committed(admin) == COMMITTED


@pytest.mark.parametrize("change", [
    {"set": {"cleanup.policy": "delete", "retention.ms": "1"}},
    {"set": {"cleanup.policy": "compact,delete"}},
    {"delete": ["cleanup.policy"]},                     # Kafka's default is "delete"
    {"set": {"retention.ms": "1"}},
    {"set": {"retention.bytes": "1"}},
], ids=["delete-policy-and-retention", "compact-delete", "policy-removed", "retention-ms",
        "retention-bytes"])
def test_a_config_that_could_drop_commits_is_refused(committed_broker, change):
    admin = Admin(committed_broker[0].data_dir)
    before = admin.describe_topic(OFFSETS_TOPIC)["config"]
    with pytest.raises(InternalTopicConfigError, match="internal topic.*Nothing was changed"):
        admin.alter_topic_config(OFFSETS_TOPIC, **change)
    if "set" in change:
        with pytest.raises(InternalTopicConfigError):
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, OFFSETS_TOPIC,
                                                configs=change["set"])])
    assert admin.describe_topic(OFFSETS_TOPIC)["config"] == before


def test_commits_survive_a_restart_after_the_refused_configs(committed_broker):
    admin = Admin(committed_broker[0].data_dir)
    # What cannot drop a live commit stays free: compaction keeps each key's latest.
    admin.alter_topic_config(OFFSETS_TOPIC, set={"min.compaction.lag.ms": "1000"})
    admin.alter_topic_config(OFFSETS_TOPIC, delete=["min.compaction.lag.ms"])
    with pytest.raises(InternalTopicConfigError):
        admin.alter_topic_config(OFFSETS_TOPIC, set={"cleanup.policy": "delete",
                                                     "retention.ms": "1"})
    admin = _restart(committed_broker)
    assert admin.describe_topic(OFFSETS_TOPIC)["config"]["cleanup.policy"] == "compact"
    assert _committed(admin) == COMMITTED


def test_the_cli_refuses_too(committed_broker):
    data_dir = committed_broker[0].data_dir
    deleted = subprocess.run(
        [sys.executable, "-m", "shmlog", "delete-records", "--topic", OFFSETS_TOPIC,
         "--partition", "0", "--offset", "-1", "--data-dir", data_dir],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert deleted.returncode != 0
    assert f"{OFFSETS_TOPIC}-0\terror: delete-records of {OFFSETS_TOPIC}-0: " \
           f"{deletion.INVALID_TOPIC_EXCEPTION}" in deleted.stdout, deleted.stdout
    altered = subprocess.run(
        [sys.executable, "-m", "shmlog", "topics", "alter", OFFSETS_TOPIC, "--config",
         "cleanup.policy=delete", "--config", "retention.ms=1", "--data-dir", data_dir],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert altered.returncode != 0
    assert "internal topic" in altered.stderr and "Nothing was changed" in altered.stderr, \
        altered.stderr
    admin = Admin(data_dir)
    assert admin.describe_topic(OFFSETS_TOPIC)["config"]["cleanup.policy"] == "compact"
    assert {entry["log_start_offset"] for entry in admin.list_offsets(OFFSETS_TOPIC)} == {0}


BAD_NAMES = [["kept"], {"name": "kept"}, 7, None]
NAME_REQUESTS = [
    ("create_topic", lambda name: {"name": name, "partitions": 1}, "name"),
    ("delete_topic", lambda name: {"name": name}, "name"),
    ("describe_topic", lambda name: {"name": name}, "name"),
    ("add_partitions", lambda name: {"name": name, "total": 3}, "name"),
    ("alter_topic_config", lambda name: {"name": name, "set": {"retention.ms": "1"}}, "name"),
    ("list_offsets", lambda name: {"topic": name}, "topic"),
    ("offset_for_timestamp", lambda name: {"topic": name, "partition": 0, "timestamp": 0},
     "topic"),
    ("metadata", lambda name: {"topics": [name]}, "topics"),
    ("describe_log_dirs", lambda name: {"topics": [name]}, "topics"),
]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["list", "dict", "int", "none"])
@pytest.mark.parametrize("request_type,fields,field", NAME_REQUESTS,
                         ids=[entry[0] for entry in NAME_REQUESTS])
def test_a_malformed_topic_name_is_a_typed_error(integration_broker, request_type, fields,
                                                 field, bad):
    with pytest.raises(LocalProtocolError, match=f"field '{field}' must be str"):
        request(integration_broker, request_type, **fields(bad))
    assert isinstance(Admin(integration_broker).list_topics(), list)   # still serving


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["list", "dict", "int", "none"])
def test_malformed_names_in_many_topic_requests(integration_broker, bad):
    created = request(integration_broker, "create_topics",
                      topics=[{"name": bad}, {"name": "well-named-27"}])["topics"]
    assert created[0]["ok"] is False and created[0]["error"] == "LocalProtocolError"
    assert "field 'name' must be str" in created[0]["message"]
    assert created[1]["ok"] is True
    request(integration_broker, "delete_topic", name="well-named-27")
    with pytest.raises(LocalProtocolError, match=r"\[topic, partition, offset\]"):
        request(integration_broker, "delete_records", partitions=[[bad, 0, 0]])


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["list", "dict", "int", "none"])
def test_admin_with_a_malformed_name(integration_broker, bad):
    admin = Admin(integration_broker)
    for call in (lambda: admin.create_topic(bad), lambda: admin.delete_topic(bad),
                 lambda: admin.describe_topic(bad), lambda: admin.alter_topic_config(bad)):
        with pytest.raises(LocalProtocolError, match="field 'name' must be str"):
            call()
    assert isinstance(admin.list_topics(), list)
