"""Planning a reset of a consumer group's committed offsets: the work of Kafka's
``kafka-consumer-groups --reset-offsets`` (ConsumerGroupCommand's
``prepareOffsetsToReset``), done through an :class:`~.admin.Admin`.

Rules
-----
* A plan changes nothing: it reads the group's commits and the partitions' offsets
  and says, per partition, the offset committed now and the new one; applying it is
  ``Admin.alter_consumer_group_offsets`` (the ``shmlog groups`` command does so with
  ``--execute``), which the broker takes only while the group has no members.
* Every new offset is clamped to the partition's [log start, log end], as Kafka's
  tool does, so a plan never names an offset a consumer could not start from.
* A bad target is a :class:`LocalProtocolError`, raised before the broker is asked.

Theory of operation
-------------------
The targets are Kafka's ``--to-earliest``, ``--to-latest``, ``--to-offset``,
``--to-timestamp``, ``--to-datetime``, ``--by-duration`` and ``--shift-by``. A date-time
or a duration is turned into a timestamp first (``iso8601``), and a timestamp into
each partition's first offset at or after it (Kafka's ListOffsets by time; the log
end when there is none). A shift moves the committed offset, or the log end for a
partition without a commit.
"""

from __future__ import annotations

import time

from ..common.errors import LocalProtocolError
from ..common.iso8601 import datetime_ms, duration_ms

__all__ = ["plan_offset_reset", "TARGETS"]

# Kafka's --to-* / --by-duration / --shift-by, by the name plan_offset_reset takes.
TARGETS = ("earliest", "latest", "offset", "timestamp", "datetime", "duration", "shift")
# The targets that need a value.
VALUE_TARGETS = ("offset", "timestamp", "datetime", "duration", "shift")


def plan_offset_reset(admin, group_id: str, topics: list[str], *, to: str,
                      value: int | str | None = None) -> list[dict]:
    """What ``kafka-consumer-groups --reset-offsets`` would do: per partition of
    ``topics``, ``{"topic", "partition", "current", "new"}``: the committed offset
    (None without one) and the new one.

    ``to`` is ``earliest``, ``latest``, ``offset`` (``value``), ``timestamp``
    (``value`` in ms: the first offset at or after it, else the end),
    ``datetime`` (``value`` an ISO-8601 date-time, local time without a zone:
    as ``timestamp``), ``duration`` (``value`` an ISO-8601 duration such as
    ``PT10M``: as ``timestamp`` that long before now) or ``shift`` (``value``
    added to the committed offset): Kafka's ``--to-*``, ``--by-duration`` and
    ``--shift-by``. New offsets are clamped to the partition's [log start, log
    end], as Kafka's tool does.

    Parameters
    ----------
    admin : Admin
        Asks the broker for the group's commits and the partitions' offsets.

    Raises
    ------
    LocalProtocolError
        An unknown target, or one without the value it needs.
    """
    if to not in TARGETS:
        raise LocalProtocolError(f"cannot reset offsets to {to!r}")
    if to in VALUE_TARGETS and value is None:
        raise LocalProtocolError(f"resetting to {to} needs a value")
    if to == "datetime":
        to, value = "timestamp", datetime_ms(value)
    elif to == "duration":
        to, value = "timestamp", round(time.time() * 1000) - duration_ms(value)
    committed = admin.list_consumer_group_offsets(group_id)
    plan = []
    for topic in topics:
        for entry in admin.list_offsets(topic):
            partition = entry["partition"]
            start, end = entry["log_start_offset"], entry["log_end_offset"]
            current = committed.get((topic, partition), (None, ""))[0]
            if to == "earliest":
                target = start
            elif to == "latest":
                target = end
            elif to == "offset":
                target = value
            elif to == "shift":
                target = (current if current is not None else end) + value
            else:
                found = admin.offset_for_time(topic, partition, value)
                target = end if found is None else found
            plan.append({"topic": topic, "partition": partition, "current": current,
                         "new": min(max(target, start), end)})
    return plan
