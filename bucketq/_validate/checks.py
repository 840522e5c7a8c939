"""Checks of every option and argument where it enters bucketq.

Each check takes the argument's name and value and returns the value (converted
where that is safe, e.g. a float for a number option); a bad value raises
:class:`~bucketq.errors.ConfigurationError` whose message names the argument and the
accepted range. Booleans are never counts or seconds, and NaN or infinity is never a
number of anything. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError

#: The longest any time option may be (30 days, in seconds): longer is a mistake in
#: units, and a background loop's wait must stay within what a thread can wait.
MAX_OPTION_SECONDS = 30 * 86400.0
#: The longest ``delay`` of a push or rollback (100 years, in seconds).
MAX_DELAY = 100 * 365 * 86400.0
#: The latest ``mature`` / ``next_t`` (the end of year 9999, the last a BSON datetime
#: and Python's datetime share), in seconds since the epoch.
MAX_TIMESTAMP = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def _fail(name: str, need: str, value: Any) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {need}; got {value!r}.")


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(lo: float | None, hi: float | None, *, open_lo: bool, unit: str) -> str:
    u = f" {unit}" if unit else ""
    if lo is not None and hi is not None:
        if open_lo:
            return f"greater than {_n(lo)} and at most {_n(hi)}{u}"
        return f"from {_n(lo)} to {_n(hi)}{u}"
    if lo is not None:
        return f"{'greater than' if open_lo else 'at least'} {_n(lo)}{u}"
    if hi is not None:
        return f"at most {_n(hi)}{u}"
    return "finite"


def number(
    name: str,
    value: Any,
    *,
    lo: float | None = 0.0,
    hi: float | None = MAX_OPTION_SECONDS,
    open_lo: bool = False,
    unit: str = "seconds",
) -> float:
    """A finite real number (int or float, not bool) in ``[lo, hi]`` (``(lo, hi]`` when
    ``open_lo``)."""
    # The message is built only for a bad value: this check runs on every reserve().
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (lo is not None and (value < lo or (open_lo and value == lo)))
        or (hi is not None and value > hi)
    ):
        raise _fail(name, f"a finite number {_range(lo, hi, open_lo=open_lo, unit=unit)}", value)
    return float(value)


def optional_number(name: str, value: Any, **kw: Any) -> float | None:
    return None if value is None else number(name, value, **kw)


def timeout(name: str, value: Any) -> float | None:
    """A wait: None (no limit) or seconds from 0 to :data:`MAX_DELAY`."""
    if (type(value) is float or type(value) is int) and 0.0 <= value <= MAX_DELAY:
        return value  # the common case, checked first: reserve(timeout) is called per item
    return optional_number(name, value, lo=0.0, hi=MAX_DELAY)


def count(
    name: str, value: Any, *, lo: int = 0, hi: int | None = None, unit: str = "", note: str = ""
) -> int:
    """A whole number (int, not bool) in ``[lo, hi]``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        need = f"a whole number {_range(lo, hi, open_lo=False, unit=unit)}{note}"
        raise _fail(name, need, value)
    return value


def partition_key(value: Any, name: str = "key") -> str | bytes | int | None:
    """A push's partition key: None (the producer's partition), a str, bytes, or a whole
    number (int, not bool: it picks partition ``key % partitions``)."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _fail(name, "a str, bytes, or a whole number >= 0", value)
        return value
    raise _fail(
        name, "a str, bytes, or a whole number >= 0 (or None: the producer's partition)", value
    )


def flag(name: str, value: Any, *, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise _fail(name, "True or False" + (" (or None)" if optional else ""), value)
    return value


def choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise _fail(name, "one of " + ", ".join(repr(o) for o in options), value)
    return value


def text(name: str, value: Any, *, optional: bool = False, hi: int | None = None) -> str | None:
    """A non-empty string (of at most ``hi`` characters); None too when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or (hi is not None and len(value) > hi):
        need = "a non-empty string" + (f" of at most {hi} characters" if hi else "")
        raise _fail(name, need + (" (or None)" if optional else ""), value)
    return value


def collection_name(name: str, value: Any, *, optional: bool = False) -> str:
    """A name MongoDB accepts for a collection (bucketq also adds suffixes such as
    ``.dlq`` and ``.meta`` to it, and the reservoir ``:<shard>``): the one check of a
    queue, stream or collection name. Empty is allowed (unset) when ``optional``."""
    if optional and value == "":
        return value
    need = (
        "a non-empty string of at most 200 bytes, without '$' or NUL, not starting or "
        "ending with '.', without '..', and not starting with 'system.'"
    )
    if (
        not isinstance(value, str)
        or not value
        or "$" in value
        or "\0" in value
        or value.startswith(".")
        or value.endswith(".")
        or ".." in value
        or value.startswith("system.")
        or len(value.encode("utf-8", "surrogatepass")) > 200
    ):
        raise _fail(name, need, value)
    return value


#: Characters MongoDB refuses in a database name (on any platform).
_DB_FORBIDDEN = frozenset('/\\. "$*<>:|?\0')


def database_name(name: str, value: Any, *, optional: bool = False) -> str:
    """A name MongoDB accepts for a database. Empty is allowed (unset) when ``optional``."""
    if optional and value == "":
        return value
    if (
        not isinstance(value, str)
        or not value
        or any(c in _DB_FORBIDDEN for c in value)
        or len(value.encode("utf-8", "surrogatepass")) > 63
    ):
        need = 'a non-empty string of at most 63 bytes without /\\. "$*<>:|? or NUL'
        raise _fail(name, need + (" (or empty: unset)" if optional else ""), value)
    return value


def headers(value: Any, name: str = "headers") -> dict[str, Any] | None:
    """Item headers: None, or a dict (any mapping) with string keys."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _fail(name, "None or a dict with string keys", value)
    bad = [k for k in value if not isinstance(k, str) or not k or "\0" in k]
    if bad:
        raise ConfigurationError(
            f"{name} must be a dict with non-empty string keys (without NUL); "
            f"key {bad[0]!r} is not one."
        )
    return value if isinstance(value, dict) else dict(value)


def delay(value: Any, name: str = "delay") -> float:
    """Seconds from now: from 0 to :data:`MAX_DELAY`."""
    return number(name, value, lo=0.0, hi=MAX_DELAY)


def timestamp(value: Any, name: str = "mature") -> float:
    """A point in time: an aware or naive (UTC) datetime, or seconds since the epoch,
    from 1970 to the end of year 9999."""
    if isinstance(value, datetime):
        d = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            t = d.timestamp()
        except (OverflowError, ValueError, OSError) as exc:
            raise _fail(name, "a datetime from 1970 to 9999", value) from exc
        if not 0 <= t <= MAX_TIMESTAMP:
            raise _fail(name, "a datetime from 1970 to 9999", value)
        return t
    need = (
        "a datetime, or seconds since the epoch (a finite number from 0 to "
        f"{MAX_TIMESTAMP:.0f}, the end of year 9999)"
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, need, value)
    if not math.isfinite(value) or not 0 <= value <= MAX_TIMESTAMP:
        raise _fail(name, need, value)
    return float(value)


def payloads(value: Any, name: str = "payloads") -> list[Any]:
    """An iterable of payloads; a str, bytes or dict is one payload, not several."""
    if isinstance(value, str | bytes | bytearray | memoryview | Mapping):
        raise ConfigurationError(
            f"{name} must be a list (or another iterable) of payloads, not a "
            f"{type(value).__name__}: wrap a single payload in a list, e.g. push_many([item])."
        )
    try:
        return list(value)
    except TypeError:
        raise _fail(name, "a list (or another iterable) of payloads", value) from None


def write_concern(name: str, value: Any) -> Any:
    """None, a pymongo ``WriteConcern``, or a dict of its keywords; an unacknowledged one
    (``w=0``) is refused: receipts could not say whether an item was stored."""
    from pymongo.write_concern import WriteConcern

    if value is None:
        return None
    if isinstance(value, dict):
        try:
            wc = WriteConcern(**value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{name} {value!r} is not a valid write concern ({exc}); give a dict of "
                "pymongo WriteConcern keywords such as {'w': 'majority', 'wtimeout': 5000}."
            ) from None
    elif isinstance(value, WriteConcern):
        wc = value
    else:
        raise _fail(name, "None, a pymongo WriteConcern or a dict like {'w': 'majority'}", value)
    if not wc.acknowledged:
        raise ConfigurationError(
            f"{name} {value!r} is unacknowledged (w=0): a receipt could not say whether its "
            "item was stored. Use w=1 or more, or 'majority'."
        )
    return value


def url(name: str, value: Any, schemes: tuple[str, ...], *, optional: bool = True) -> str:
    """A URL with one of ``schemes`` (empty is allowed when ``optional``)."""
    if not isinstance(value, str):
        raise _fail(name, "a string", value)
    v = value.strip()
    if not v and optional:
        return v
    scheme, sep, rest = v.partition("://")
    if not sep or scheme.lower() not in schemes or not rest:
        raise ConfigurationError(
            f"{name} must be a URL starting with "
            + " or ".join(f"{s}://" for s in schemes)
            + f"; got {value!r}."
        )
    return v


REDIS_SCHEMES = ("redis", "rediss", "unix")
MONGODB_SCHEMES = ("mongodb", "mongodb+srv")
