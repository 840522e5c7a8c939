"""The request and response bodies (pydantic), which are also the served OpenAPI schema."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Levels a log record may carry (case-insensitive on input, stored lower case).
LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "fatal", "critical")
Level = Literal["trace", "debug", "info", "warn", "warning", "error", "fatal", "critical"]

_HEX_ID = r"^[0-9a-fA-F]{1,64}$"


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


class LogIn(BaseModel):
    """One log record. Unknown fields are ignored; the project comes from the API key."""

    model_config = ConfigDict(extra="ignore")

    time: datetime = Field(description="When it happened: ISO 8601 (UTC unless it says otherwise).")
    service: str = Field(min_length=1, max_length=100)
    level: Level
    message: str = Field(min_length=1, max_length=1_000_000)
    metadata: dict[str, Any] | None = None
    trace_id: str | None = Field(default=None, pattern=_HEX_ID)
    span_id: str | None = Field(default=None, pattern=_HEX_ID)
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
    start_time: datetime
    end_time: datetime | None = None
    status: SpanStatus | None = None
    attributes: dict[str, Any] | None = None

    _kind = field_validator("kind", mode="before")(_lower)


class SpansIn(BaseModel):
    spans: list[SpanIn] = Field(min_length=1)


class MetricIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    time: datetime
    service: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=1000)
    type: Literal["gauge", "counter", "histogram", "summary"] = "gauge"
    value: float
    labels: dict[str, str] | None = None


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
    time: datetime
    service: str | None = None
    level: str | None = None
    message: str | None = None
    metadata: dict[str, Any] | None = None
    trace_id: str | None = None
    span_id: str | None = None


class LogsPage(BaseModel):
    logs: list[LogOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page.")


class Health(BaseModel):
    status: str
    detail: dict[str, Any] | None = None
