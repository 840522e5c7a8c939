"""The ingest service's configuration: one table of environment variables, read here.

:data:`SETTINGS` lists every variable the service reads (the buffer's own
``RESERVOIR_BUFFER_*`` variables are read by :func:`bucketq.reservoir.from_env`);
:func:`from_env` builds a :class:`ServerConfig`; :func:`config_table` renders the
Markdown table in ``docs/server.md``. No I/O besides reading the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import ConfigurationError

#: Largest request body, in bytes (after gzip decompression for OTLP).
DEFAULT_MAX_BODY_BYTES = 5 * 1024 * 1024
#: Most records one request may carry.
DEFAULT_MAX_RECORDS = 1000
#: How long an API key lookup is cached; a revoked key stops working within this.
DEFAULT_KEY_CACHE_MS = 1000
#: ``Retry-After`` (seconds) of a 429/503 answer.
DEFAULT_RETRY_AFTER_S = 5
#: Most records one ``GET /api/v1/logs`` page returns.
DEFAULT_QUERY_MAX_LIMIT = 1000
#: MongoDB server selection and operation timeout of the service's client, in ms.
DEFAULT_MONGODB_TIMEOUT_MS = 5000
#: Longest an ingest may wait for the reservoir (and the tee) before it answers 503.
DEFAULT_INGEST_TIMEOUT_MS = 5000
#: Longest a ``GET /api/v1/logs`` (its key lookup and its query) may take before a 503.
DEFAULT_READ_TIMEOUT_MS = 5000
#: Ingest and read requests served at once; one more is answered 503 at once.
DEFAULT_MAX_REQUESTS_IN_FLIGHT = 64
#: Records handed to the reservoir and not yet answered; a request that would pass it: 503.
DEFAULT_MAX_RECORDS_IN_FLIGHT = 20000
#: Open connections at most; past it a connection's request is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 512
#: A connection that has not sent a whole request head within this is closed.
DEFAULT_HEADER_TIMEOUT_MS = 10000
#: A request whose body has not arrived within this (from its head) is answered 408.
DEFAULT_BODY_TIMEOUT_MS = 30000
#: Known keys remembered, and unknown keys remembered (each its own bound).
DEFAULT_KEY_CACHE_SIZE = 10000
#: Lookups per second of keys not in the cache; past it such a request is answered 429.
DEFAULT_KEY_LOOKUPS_PER_S = 200
#: The database when neither the URI nor ``BUCKETQ_DATABASE`` names one.
DEFAULT_DATABASE = "bucketq"


def _int(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            top = f" and <= {maximum}" if maximum is not None else ""
            raise ValueError(f"must be a whole number >= {minimum}{top}")
        return value

    return parse


def _text(text: str) -> str:
    return text.strip()


def _name(text: str) -> str:
    value = text.strip()
    if value and ("$" in value or " " in value or "\x00" in value):
        raise ValueError("must be a collection name without spaces or '$'")
    return value


def _names(text: str) -> str:
    value = text.strip()
    if value != "*":
        for n in value.split(","):
            _name(n)
    return value


def _secret(text: str) -> str:
    value = text.strip()
    if value and len(value) < 32:
        raise ValueError(
            "must be at least 32 characters (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    env: str
    field: str
    default: str
    help: str
    parse: Callable[[str], Any]


SETTINGS: tuple[Setting, ...] = (
    Setting("BUCKETQ_MONGODB_URI", "mongodb_uri", "",
            "MongoDB for storage, keys and the buffer; unset: `bucketq serve` starts the embedded server.", _text),
    Setting("BUCKETQ_DATABASE", "database", "",
            "Database for logs, spans, metrics and API keys (default: the URI's, else `bucketq`).", _name),
    Setting("BUCKETQ_MAX_BODY_BYTES", "max_body_bytes", str(DEFAULT_MAX_BODY_BYTES),
            "Largest request body (OTLP: after gunzip); larger answers 413.", _int(1)),
    Setting("BUCKETQ_MAX_RECORDS", "max_records", str(DEFAULT_MAX_RECORDS),
            "Most records per request; more answers 413.", _int(1)),
    Setting("BUCKETQ_KEY_CACHE_MS", "key_cache_ms", str(DEFAULT_KEY_CACHE_MS),
            "How long a key lookup is cached (at most 1000: a revoked key fails within a second).",
            _int(0, 1000)),
    Setting("BUCKETQ_RETRY_AFTER_S", "retry_after_s", str(DEFAULT_RETRY_AFTER_S),
            "`Retry-After` of a 503 answer, in seconds.", _int(1)),
    Setting("BUCKETQ_MONGODB_TIMEOUT_MS", "mongodb_timeout_ms", str(DEFAULT_MONGODB_TIMEOUT_MS),
            "Server selection timeout of the service's MongoDB client.", _int(100)),
    Setting("BUCKETQ_INGEST_TIMEOUT_MS", "ingest_timeout_ms", str(DEFAULT_INGEST_TIMEOUT_MS),
            "Longest an ingest waits for the reservoir (storage or transport) before it answers 503.", _int(1)),
    Setting("BUCKETQ_READ_TIMEOUT_MS", "read_timeout_ms", str(DEFAULT_READ_TIMEOUT_MS),
            "Longest a `GET /api/v1/logs` (key lookup and query) may take; past it, 503 + `Retry-After`.", _int(1)),
    Setting("BUCKETQ_MAX_REQUESTS_IN_FLIGHT", "max_requests_in_flight", str(DEFAULT_MAX_REQUESTS_IN_FLIGHT),
            "Ingest and read requests served at once (per process); one more is answered 503 + `Retry-After` at once.",
            _int(1)),
    Setting("BUCKETQ_MAX_RECORDS_IN_FLIGHT", "max_records_in_flight", str(DEFAULT_MAX_RECORDS_IN_FLIGHT),
            "Records handed to the reservoir and not yet answered (per process); a request that would pass it "
            "is answered 503 + `Retry-After` at once.", _int(1)),
    Setting("BUCKETQ_MAX_CONNECTIONS", "max_connections", str(DEFAULT_MAX_CONNECTIONS),
            "Open connections (per process); a request on one more is answered 503 + `Retry-After` and its "
            "connection closed.", _int(1)),
    Setting("BUCKETQ_HEADER_TIMEOUT_MS", "header_timeout_ms", str(DEFAULT_HEADER_TIMEOUT_MS),
            "A connection that has not sent a whole request head within this is closed.", _int(100)),
    Setting("BUCKETQ_BODY_TIMEOUT_MS", "body_timeout_ms", str(DEFAULT_BODY_TIMEOUT_MS),
            "A request body not received whole within this (from its head) is answered 408 and its "
            "connection closed.", _int(100)),
    Setting("BUCKETQ_KEY_CACHE_SIZE", "key_cache_size", str(DEFAULT_KEY_CACHE_SIZE),
            "Known keys remembered, and unknown keys remembered: two bounds, so unknown keys never evict "
            "known ones.", _int(1)),
    Setting("BUCKETQ_KEY_LOOKUPS_PER_S", "key_lookups_per_s", str(DEFAULT_KEY_LOOKUPS_PER_S),
            "Lookups per second of keys not in the cache (per process); past it such a request is answered "
            "429 + `Retry-After` without a lookup.", _int(1)),
    Setting("BUCKETQ_TEE_STREAM", "tee_stream", "",
            "Also append every accepted log record to this stream-mode queue (for `bucketq pipeline`).", _name),
    Setting("BUCKETQ_WATCH_QUEUES", "watch_queues", "",
            "Queues and streams (of this database) whose sizes `/metrics` exports: comma-separated names, `*` for every one.", _names),
    Setting("BUCKETQ_OPERATOR_KEY", "operator_key", "",
            "A key that opens the console at `/console` (at least 32 characters), besides `bucketq keys create --operator` keys.", _secret),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The service's settings; build with :func:`from_env` or with keywords."""

    mongodb_uri: str = ""
    database: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_records: int = DEFAULT_MAX_RECORDS
    key_cache_ms: int = DEFAULT_KEY_CACHE_MS
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    mongodb_timeout_ms: int = DEFAULT_MONGODB_TIMEOUT_MS
    ingest_timeout_ms: int = DEFAULT_INGEST_TIMEOUT_MS
    read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS
    max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT
    max_records_in_flight: int = DEFAULT_MAX_RECORDS_IN_FLIGHT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_ms: int = DEFAULT_HEADER_TIMEOUT_MS
    body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS
    key_cache_size: int = DEFAULT_KEY_CACHE_SIZE
    key_lookups_per_s: int = DEFAULT_KEY_LOOKUPS_PER_S
    tee_stream: str = ""
    watch_queues: str = ""
    operator_key: str = ""

    def __post_init__(self) -> None:
        by_field = {s.field: s for s in SETTINGS}
        for f in fields(self):
            s = by_field[f.name]
            value = getattr(self, f.name)
            try:
                s.parse(str(value))
            except ValueError as exc:
                raise ConfigurationError(f"{f.name} ({s.env}) {exc}; got {value!r}.") from None

    def with_(self, **changes: Any) -> ServerConfig:
        return replace(self, **changes)


def from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerConfig:
    """Read :data:`SETTINGS` from ``environ`` (default ``os.environ``); ``overrides``
    (not None) win. An invalid value raises ConfigurationError naming the variable."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw = env.get(s.env)
        try:
            values[s.field] = s.parse(s.default if raw is None else raw)
        except ValueError as exc:
            raise ConfigurationError(f"{s.env} {exc}; got {raw!r}. Fix or unset it.") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ServerConfig(**values)


def config_table() -> str:
    """The configuration as a Markdown table (the one in ``docs/server.md``)."""
    lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "(unset)"
        lines.append(f"| `{s.env}` | {default} | {s.help} |")
    return "\n".join(lines) + "\n"
