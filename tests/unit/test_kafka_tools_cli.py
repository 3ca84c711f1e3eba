"""The Kafka tools' pieces that need no broker: ISO-8601 date-times and durations
(Kafka's ``--to-datetime`` and ``--by-duration``), kafka-get-offsets' partition
patterns, the configs' sources of ``topics describe``, Kafka's ASSIGNMENT column,
and the argument checks of the new verbs.

Method: plain values in, values out, one Kafka rule per test where there is one.
"""

from __future__ import annotations

import datetime

import pytest

from shmlog.cli import build_parser, main
from shmlog.cli.admin import config_sources, describe_topic_lines
from shmlog.cli.tools import partition_filter
from shmlog.common.errors import LocalProtocolError
from shmlog.common.iso8601 import datetime_ms, duration_ms


@pytest.mark.parametrize("text, expected_ms", [
    ("PT10M", 600_000), ("P1D", 86_400_000), ("P1DT2H", 93_600_000), ("PT1.5S", 1_500),
    ("PT0S", 0), ("pt1h30m", 5_400_000)])
def test_durations_are_javas_duration_parse(text, expected_ms):
    """Kafka's ``--by-duration`` takes ``java.time.Duration.parse``'s PnDTnHnMnS."""
    assert duration_ms(text) == expected_ms


@pytest.mark.parametrize("text", ["P", "PT", "10M", "P1W", "P1M", "-PT1M", "PT1M2H"])
def test_what_is_not_such_a_duration_is_refused(text):
    with pytest.raises(LocalProtocolError, match="PnDTnHnMnS"):
        duration_ms(text)


def test_a_datetime_with_a_zone_is_taken_as_written():
    assert datetime_ms("2026-11-25T00:00:00.000Z") == 1_795_564_800_000
    assert datetime_ms("2026-11-25T01:00:00.000+01:00") == 1_795_564_800_000


def test_a_datetime_without_a_zone_is_local_time():
    """Kafka's ``Utils.getDateTime``: no zone, the local one."""
    local = datetime.datetime(2026, 11, 25, 0, 0, 0).timestamp()
    assert datetime_ms("2026-11-25T00:00:00.000") == round(local * 1000)
    with pytest.raises(LocalProtocolError, match="YYYY-MM-DDTHH:mm:SS.sss"):
        datetime_ms("25/11/2026")


@pytest.mark.parametrize("pattern, topic, accepted", [
    ("clicks", "clicks", [0, 1, 2, 3]), ("clicks:2", "clicks", [2]),
    ("clicks:1-3", "clicks", [1, 2]), ("clicks:2-", "clicks", [2, 3]),
    ("clicks:-2", "clicks", [0, 1]), (":1", "anything", [1]), ("cl.*", "clicks", [0, 1, 2, 3])])
def test_partition_patterns_are_kafka_get_offsets(pattern, topic, accepted):
    """kafka-get-offsets' --topic-partitions: a topic regular expression, then N,
    N-M (upper bound excluded), N- or -M."""
    expression, accepts = partition_filter(pattern)
    assert expression.fullmatch(topic)
    assert [number for number in range(4) if accepts(number)] == accepted


@pytest.mark.parametrize("pattern", ["t:x", "t:1-2-3", "t:", "(:1"])
def test_a_bad_partition_pattern_is_refused(pattern):
    with pytest.raises(LocalProtocolError):
        partition_filter(pattern)


def test_the_topics_own_settings_are_dynamic_topic_configs_the_rest_defaults():
    described = {"config": {"min.insync.replicas": 2, "retention.ms": 604_800_000},
                 "overrides": {"min.insync.replicas": "2"}}
    assert config_sources(described) == [("min.insync.replicas", "2", "DYNAMIC_TOPIC_CONFIG"),
                                          ("retention.ms", 604_800_000, "DEFAULT_CONFIG")]


def test_sources_the_broker_tells_get_kafkas_names():
    described = {"config": {"retention.ms": 1, "min.insync.replicas": 2, "segment.ms": 3},
                 "config_sources": {"retention.ms": {"value": 1, "source": "topic"},
                                    "min.insync.replicas": {"value": 2, "source": "broker"},
                                    "segment.ms": {"value": 3, "source": "default"}}}
    assert config_sources(described) == [("min.insync.replicas", 2, "STATIC_BROKER_CONFIG"),
                                          ("retention.ms", 1, "DYNAMIC_TOPIC_CONFIG"),
                                          ("segment.ms", 3, "DEFAULT_CONFIG")]


def test_describe_lines_show_offsets_and_only_overrides_unless_all():
    described = {"name": "t", "topic_id": "id", "partitions": [{"partition": 0}],
                 "config": {"retention.ms": 60_000, "segment.bytes": 1_073_741_824},
                 "overrides": {"retention.ms": 60_000}}
    offsets = [{"partition": 0, "log_start_offset": 2, "log_end_offset": 9,
                "high_watermark": 9, "size": 300, "segment_count": 1}]
    lines = describe_topic_lines(described, offsets)
    assert lines == [
        "Topic: t\tTopicId: id\tPartitionCount: 1\tReplicationFactor: 1"
        "\tConfigs: retention.ms=60000",
        "\tTopic: t\tPartition: 0\tLogStartOffset: 2\tLogEndOffset: 9\tHighWatermark: 9"
        "\tSize: 300\tSegments: 1",
        "\tConfig: retention.ms=60000\tSource: DYNAMIC_TOPIC_CONFIG"]
    assert "\tConfig: segment.bytes=1073741824\tSource: DEFAULT_CONFIG" in \
        describe_topic_lines(described, offsets, every_config=True)


@pytest.mark.parametrize("arguments", [
    ["delete-records"], ["delete-records", "--topic", "t", "--partition", "0"],
    ["delete-records", "--offsets", "f.json", "--topic", "t"],
    ["groups", "describe"], ["groups", "describe", "g", "--all-groups"],
    ["groups", "describe", "g", "--members", "--state"],
    ["groups", "delete", "--all-groups"]])
def test_the_new_verbs_refuse_what_does_not_go_together(arguments, capsys):
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2


def test_the_version_option_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("shmlog ")
