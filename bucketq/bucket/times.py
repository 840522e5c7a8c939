"""Times: floats (seconds since the epoch) in memory, BSON datetimes in MongoDB, and
the mature time of a push.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError


def to_datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def from_datetime(d: datetime) -> float:
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return d.timestamp()


def mature_time(now: float, delay: Any, mature: Any, *, mature_name: str = "mature") -> float:
    """When a pushed item may first be delivered ("not before"): ``delay`` seconds from
    ``now``, or ``mature`` (a datetime or seconds since the epoch). Both are checked here,
    at push time, so every item's time can become a BSON datetime."""
    if delay is not None and mature is not None:
        raise ConfigurationError(f"Give either delay or {mature_name}, not both.")
    if delay is not None:
        return now + v.delay(delay)
    if mature is not None:
        return v.timestamp(mature, mature_name)
    return now
