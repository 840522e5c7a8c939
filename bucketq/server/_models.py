"""The request and response bodies (pydantic), which are also the served OpenAPI schema."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

#: Levels a log record may carry (case-insensitive on input, stored lower case).
LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "fatal", "critical")
Level = Literal["trace", "debug", "info", "warn", "warning", "error", "fatal", "critical"]
#: A service name as a filter takes it.
ServiceName = Annotated[str, StringConstraints(max_length=100)]

_HEX_ID = r"^[0-9a-fA-F]{1,64}$"
#: A log record's trace, span or session id: any text of up to 128 characters without
#: control characters (LogTide takes any string: ``with_trace_id('request-123')``). Hex
#: ids are stored in lower case, so the W3C and OTLP forms of one id are one id.
TEXT_ID_CHARS = 128
_TEXT_ID = rf"^[^\x00-\x1f\x7f]{{1,{TEXT_ID_CHARS}}}$"
#: Object keys MongoDB can store (a NUL byte cannot be; nested keys are checked at encoding).
_KEYS: dict[str, Any] = {"propertyNames": {"pattern": "^[^\\u0000]*$"}}


def _to_utc(v: datetime) -> datetime:
    """Aware UTC (naive means UTC); a time that leaves years 1-9999 in UTC is refused."""
    if v.tzinfo is None:
        v = v.replace(tzinfo=UTC)
    try:
        return v.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValueError("time is out of range once converted to UTC") from None


_NUMBER = re.compile(r"^\s*[-+]?[0-9]+(\.[0-9]*)?\s*$")


def _iso_text(v: Any) -> Any:
    """A time comes as ISO 8601 text (as the schema says), not as a number, nor as a
    number in a string (``"1"``, which pydantic would read as epoch seconds)."""
    if isinstance(v, datetime) or (isinstance(v, str) and not _NUMBER.match(v)):
        return v
    raise ValueError("time must be an ISO 8601 string, e.g. 2024-05-01T10:00:00Z")


#: A time as stored: aware, in UTC.
UtcTime = Annotated[datetime, BeforeValidator(_iso_text), AfterValidator(_to_utc)]


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


class LogIn(BaseModel):
    """One log record. Unknown fields are ignored; the project comes from the API key."""

    model_config = ConfigDict(extra="ignore")

    time: UtcTime = Field(description="When it happened: ISO 8601 (UTC unless it says otherwise).")
    service: str = Field(min_length=1, max_length=100)
    level: Level
    message: str = Field(min_length=1, max_length=1_000_000)
    metadata: dict[str, Any] | None = Field(default=None, json_schema_extra=_KEYS)
    trace_id: str | None = Field(default=None, pattern=_TEXT_ID)
    span_id: str | None = Field(default=None, pattern=_TEXT_ID)
    session_id: str | None = Field(default=None, max_length=200)
    hostname: str | None = Field(default=None, max_length=255)

    _level = field_validator("level", mode="before")(_lower)


class LogsIn(BaseModel):
    logs: list[LogIn] = Field(min_length=1)


SpanKind = Literal["unspecified", "internal", "server", "client", "producer", "consumer"]


class SpanStatus(BaseModel):
    code: Literal["unset", "ok", "error"] = "unset"
    message: str | None = None


class SpanIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    trace_id: str = Field(pattern=_HEX_ID)
    span_id: str = Field(pattern=_HEX_ID)
    parent_span_id: str | None = Field(default=None, pattern=_HEX_ID)
    service: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=1000)
    kind: SpanKind = "internal"
    start_time: UtcTime
    end_time: UtcTime | None = None
    status: SpanStatus | None = None
    attributes: dict[str, Any] | None = Field(default=None, json_schema_extra=_KEYS)

    _kind = field_validator("kind", mode="before")(_lower)


class SpansIn(BaseModel):
    spans: list[SpanIn] = Field(min_length=1)


class MetricIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    time: UtcTime
    service: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=1000)
    type: Literal["gauge", "counter", "histogram", "summary"] = "gauge"
    value: float = Field(strict=True, allow_inf_nan=False)  # 1e400 decodes to infinity
    labels: dict[str, str] | None = Field(default=None, json_schema_extra=_KEYS)


class MetricsIn(BaseModel):
    metrics: list[MetricIn] = Field(min_length=1)


class Accepted(BaseModel):
    received: int = Field(description="Records accepted (stored, or held by the buffer).")
    timestamp: datetime


class ErrorDetail(BaseModel):
    index: int | None = Field(None, description="The record's position in the request.")
    field: str = Field(description="Where: e.g. `logs[3].level`.")
    message: str


class ErrorOut(BaseModel):
    error: str
    message: str
    request_id: str | None = None
    details: list[ErrorDetail] | None = None


class LogOut(BaseModel):
    id: str
    time: datetime | None = Field(description="null when the stored record has no valid time.")
    service: str | None = None
    level: str | None = None
    message: str | None = None
    metadata: dict[str, Any] | None = None
    trace_id: str | None = None
    span_id: str | None = None
    session_id: str | None = None
    hostname: str | None = None
    traceId: str | None = Field(None, description="LogTide's name of `trace_id`.")
    spanId: str | None = Field(None, description="LogTide's name of `span_id`.")
    sessionId: str | None = Field(None, description="LogTide's name of `session_id`.")
    projectId: str | None = Field(None, description="The key's project (LogTide's field).")


class LogsPage(BaseModel):
    logs: list[LogOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page.")
    total: int = Field(description="Records the filter keeps (from bucket summaries).")
    total_exact: bool = Field(
        description="False: `total` is a lower bound (the count stopped at its read budget)."
    )
    limit: int
    offset: int
    nextCursor: str | None = Field(None, description="LogTide's name of `next_cursor`.")


class Health(BaseModel):
    status: str
    detail: dict[str, Any] | None = None
