"""Item values between BSON and JSON, the one converter every package uses: a decoded
BSON value as JSON (``json_bytes``: Spark's rows; ``jsonable``: what an operator is
shown) and a value made storable as BSON (``bson_value``: Spark's written rows).

JSON has no type for dates, ObjectIds, decimals or bytes: ``json_scalar`` is the one
rule for them (dates ISO 8601, bytes as its caller shows them, the rest as text).
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128

__all__ = ["bson_value", "json_bytes", "json_list", "json_scalar", "jsonable"]


def _base64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def json_scalar(v: Any, bytes_text: Callable[[bytes], str] = _base64) -> Any:
    """A value JSON has no type for, as JSON: a date or time ISO 8601, bytes as
    ``bytes_text`` writes them (base64 unless told), anything else (an ObjectId, a
    decimal) as its text."""
    if isinstance(v, _dt.date):  # a datetime is a date too
        return v.isoformat()
    if isinstance(v, bytes):
        return bytes_text(v)
    return str(v)


_std_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=json_scalar).encode

try:  # the spark extra installs it: faster than the standard library's encoder
    from orjson import JSONEncodeError as _OrjsonError
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover
    _orjson_dumps = None  # type: ignore[assignment]

    class _OrjsonError(Exception):  # type: ignore[no-redef]
        pass


def json_bytes(v: Any) -> bytes:
    """Compact UTF-8 JSON text of a decoded BSON value (dates ISO 8601, ObjectIds and
    decimals as strings, bytes base64): orjson's when it can (not for NaN or infinity,
    which it writes as null), else the standard library's, which writes the same text."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(v, default=json_scalar)
        except _OrjsonError:
            pass  # nested deeper than orjson follows, say: the standard library's text
    return _std_json(v).encode()


def json_list(values: list[Any]) -> list[bytes]:
    """:func:`json_bytes` of each value, in one comprehension when orjson takes them all."""
    if _orjson_dumps is not None:
        dumps, default = _orjson_dumps, json_scalar
        try:
            return [dumps(v, default=default) for v in values]
        except _OrjsonError:
            pass
    return [json_bytes(v) for v in values]


def _bytes_size(b: bytes) -> str:
    return f"<{len(b)} bytes>"


def jsonable(value: Any) -> Any:
    """A decoded BSON value as plain JSON data to show: keys as text, bytes as their
    size, NaN and infinities as text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json_scalar(value, _bytes_size)


def bson_value(v: Any) -> Any:
    """``v`` with the values BSON cannot take as they are made storable: decimals as
    Decimal128, dates (not datetimes) ISO 8601, bytearrays as bytes, keys as text."""
    if isinstance(v, dict):
        return {str(k): bson_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [bson_value(x) for x in v]
    if isinstance(v, Decimal):
        return Decimal128(v)
    if isinstance(v, _dt.date) and not isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, bytearray):
        return bytes(v)
    return v
