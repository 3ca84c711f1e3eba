"""ISO-8601 date-times and durations as Kafka's tools take them
(``kafka-consumer-groups --to-datetime 2026-11-25T00:00:00.000`` and
``--by-duration PT10M``), in milliseconds.

Rules
-----
* A date-time without a zone is local time, as Kafka's ``Utils.getDateTime`` reads
  it; ``Z`` and ``+hh:mm`` zones are taken as written.
* A duration is ``PnDTnHnMnS`` (Java's ``Duration.parse``, which Kafka uses; the
  seconds may have a fraction); weeks, months and years are not durations there
  and are refused here too, as is a negative one.

No imports beyond the standard library: the ``shmlog`` command's light verbs use it.
"""

from __future__ import annotations

import datetime
import re

from .errors import LocalProtocolError

__all__ = ["datetime_ms", "duration_ms"]

_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?",
                       re.IGNORECASE)
_MS_PER = {"days": 86_400_000, "hours": 3_600_000, "minutes": 60_000}


def datetime_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 date-time (local time when it
    names no zone).

    Raises
    ------
    LocalProtocolError
        Not a date-time: the message shows Kafka's format.
    """
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise LocalProtocolError(f"{text!r} is not a date-time; Kafka's format is "
                                 f"YYYY-MM-DDTHH:mm:SS.sss (a zone such as Z or +01:00 "
                                 f"may follow)") from None
    return round(moment.timestamp() * 1000)      # naive: timestamp() reads local time


def duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration ``PnDTnHnMnS``.

    Raises
    ------
    LocalProtocolError
        Not such a duration (or an empty one, ``P`` or ``PT``).
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()) or text.strip().upper().endswith("T"):
        raise LocalProtocolError(f"{text!r} is not a duration; Kafka's format is PnDTnHnMnS, "
                                 f"e.g. PT10M or P1DT2H")
    days, hours, minutes, seconds = match.groups()
    total = sum(int(value) * _MS_PER[unit] for unit, value in
                (("days", days), ("hours", hours), ("minutes", minutes)) if value)
    return total + (round(float(seconds) * 1000) if seconds else 0)
