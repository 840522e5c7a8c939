"""The ingest service's configuration: one table of environment variables, read here.

:data:`SETTINGS` lists every variable the service reads (the buffer's own
``RESERVOIR_BUFFER_*`` variables are read by :func:`bucketq.reservoir.from_env`);
:func:`from_env` builds a :class:`ServerConfig`; :func:`config_table` renders the
Markdown table in ``docs/server.md``. No I/O besides reading the environment.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError
from ..supervisor import DEFAULT_RESTART_BACKOFF_S, DEFAULT_RESTARTS

#: Where ``bucketq serve`` listens unless told (``--host``, ``--port``; 0: any free port).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Largest request body, in bytes (after gzip decompression for OTLP): LogTide's SDK's
#: largest default batch (100 records of up to 100 KB each) with room for its JSON.
DEFAULT_MAX_BODY_BYTES = 12 * 1024 * 1024
#: Most records one request may carry.
DEFAULT_MAX_RECORDS = 1000
#: Most levels of objects and arrays in a record's free-form fields (``metadata``,
#: ``attributes``, ``labels``, OTLP attribute values); MongoDB refuses documents nested
#: past 100 levels, and reads past 255 could not be answered.
DEFAULT_MAX_DEPTH = 32
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
#: Reads of one project served at once; one more is answered 429 at once (so one
#: project's readers cannot take the store from the others' ingest and reads).
DEFAULT_READS_PER_PROJECT = 1
#: Live log streams (``GET /api/v1/logs/stream``) open at once per project, and in all.
DEFAULT_STREAMS_PER_PROJECT = 4
DEFAULT_MAX_STREAMS = 64
#: A live stream's heartbeat comment, when no record went out for this long.
#: The signals that stop ``bucketq serve`` gracefully.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_STREAM_HEARTBEAT_MS = 15000
DEFAULT_STREAM_SEND_TIMEOUT_MS = 10000
#: How log records are stored (``BUCKETQ_LOG_LAYOUT``).
LOG_LAYOUTS = ("buckets", "documents")
#: Days log records are kept (LogTide's default); 0 keeps them forever.
DEFAULT_RETENTION_DAYS = 90
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
#: ``bucketq serve``'s log levels (``BUCKETQ_LOG_LEVEL``, ``--log-level``).
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The database when neither the URI nor ``BUCKETQ_DATABASE`` names one.
DEFAULT_DATABASE = "bucketq"


def queue_names(name: str, value: str) -> str:
    """Comma-separated queue or stream names (each a valid collection name), or ``*``."""
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name} must be comma-separated queue names, or '*'; got {value!r}."
        )
    if value.strip() not in ("", "*"):
        for n in value.split(","):
            v.collection_name(f"{name} (each name)", n.strip())
    return value.strip()


def secret(name: str, value: str) -> str:
    """Empty (unset), or a secret of at least 32 characters."""
    if not isinstance(value, str) or (value and len(value) < 32):
        raise ConfigurationError(
            f"{name} must be at least 32 characters (e.g. `python -c 'import secrets; "
            "print(secrets.token_hex(32))'`), or empty."
        )
    return value


# Each variable is a field of ServerConfig, declared once with its check and its help
# (bucketq._validate.option): the same check reads the environment and keyword values.
# fmt: off
@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The service's settings; build with :func:`from_env` or with keywords."""

    mongodb_uri: str = v.option("", v.url, schemes=v.MONGODB_SCHEMES, env=v.MONGODB_URI_ENV,
        help="MongoDB for storage, keys and the buffer; unset: `bucketq serve` starts the embedded server.")
    database: str = v.option("", v.database_name, optional=True, env="BUCKETQ_DATABASE",
        help="Database for logs, spans, metrics and API keys (default: the URI's, else `bucketq`).")
    max_body_bytes: int = v.option(DEFAULT_MAX_BODY_BYTES, v.count, lo=1, env="BUCKETQ_MAX_BODY_BYTES",
        help="Largest request body (OTLP: after gunzip); larger answers 413.")
    max_records: int = v.option(DEFAULT_MAX_RECORDS, v.count, lo=1, env="BUCKETQ_MAX_RECORDS",
        help="Most records per request; more answers 413.")
    max_depth: int = v.option(DEFAULT_MAX_DEPTH, v.count, lo=1, hi=64, env="BUCKETQ_MAX_DEPTH",
        help="Most levels of nesting in a record's `metadata`, `attributes` or `labels` (OTLP: "
             "attribute values); deeper answers 422 naming the field (OTLP: the record is rejected).")
    key_cache_ms: int = v.option(DEFAULT_KEY_CACHE_MS, v.count, lo=0, hi=1000, env="BUCKETQ_KEY_CACHE_MS",
        help="How long a key lookup is cached (at most 1000: a revoked key fails within a second).")
    retry_after_s: int = v.option(DEFAULT_RETRY_AFTER_S, v.count, lo=1, env="BUCKETQ_RETRY_AFTER_S",
        help="`Retry-After` of a 503 answer, in seconds.")
    mongodb_timeout_ms: int = v.option(DEFAULT_MONGODB_TIMEOUT_MS, v.count, lo=100, env="BUCKETQ_MONGODB_TIMEOUT_MS",
        help="Server selection timeout of the service's MongoDB client.")
    ingest_timeout_ms: int = v.option(DEFAULT_INGEST_TIMEOUT_MS, v.count, lo=1, env="BUCKETQ_INGEST_TIMEOUT_MS",
        help="Deadline of an ingest (from its arrival, again once its body is in); records already handed to the reservoir wait 0.8 x it longer for their outcome before a 503.")
    read_timeout_ms: int = v.option(DEFAULT_READ_TIMEOUT_MS, v.count, lo=1, env="BUCKETQ_READ_TIMEOUT_MS",
        help="Longest a `GET /api/v1/logs` (key lookup and query) may take; past it, 503 + `Retry-After`.")
    reads_per_project: int = v.option(DEFAULT_READS_PER_PROJECT, v.count, lo=1, env="BUCKETQ_READS_PER_PROJECT",
        help="Log reads (API and console) of one project served at once; one more waits up to 1 s (behind at most 8), then is answered 429 + `Retry-After`.")
    streams_per_project: int = v.option(DEFAULT_STREAMS_PER_PROJECT, v.count, lo=1, env="BUCKETQ_STREAMS_PER_PROJECT",
        help="Live log streams (`GET /api/v1/logs/stream`) of one project open at once; one more is answered 429 + `Retry-After`.")
    max_streams: int = v.option(DEFAULT_MAX_STREAMS, v.count, lo=1, env="BUCKETQ_MAX_STREAMS",
        help="Live log streams open at once in all (per process); one more is answered 503 + `Retry-After`.")
    stream_heartbeat_ms: int = v.option(DEFAULT_STREAM_HEARTBEAT_MS, v.count, lo=100, env="BUCKETQ_STREAM_HEARTBEAT_MS",
        help="A live stream sends a heartbeat comment (`: heartbeat`) when nothing else went out for this long.")
    stream_send_timeout_ms: int = v.option(DEFAULT_STREAM_SEND_TIMEOUT_MS, v.count, lo=100, env="BUCKETQ_STREAM_SEND_TIMEOUT_MS",
        help="A live stream whose reader takes nothing of what is sent for this long is closed (its connection dropped, its place among the streams freed): what it does not read is not kept for it.")
    log_layout: str = v.option("buckets", v.choice, options=LOG_LAYOUTS, env="BUCKETQ_LOG_LAYOUT",
        help="`buckets`: log records packed into bucket documents (what reads and the console read). `documents`: one document per record in `logs`, as releases before the bucketed log store did: for comparing the two in `bucketq bench ingest` only; reads do not see such records.")
    retention_days: int = v.option(DEFAULT_RETENTION_DAYS, v.count, lo=0, env="BUCKETQ_RETENTION_DAYS",
        help="Days log records are kept; whole buckets of older records are deleted. 0: kept forever.")
    max_requests_in_flight: int = v.option(DEFAULT_MAX_REQUESTS_IN_FLIGHT, v.count, lo=1,
        env="BUCKETQ_MAX_REQUESTS_IN_FLIGHT",
        help="Ingest and read requests served at once (per process); one more is answered 503 + `Retry-After` at once.")
    max_records_in_flight: int = v.option(DEFAULT_MAX_RECORDS_IN_FLIGHT, v.count, lo=1,
        env="BUCKETQ_MAX_RECORDS_IN_FLIGHT",
        help="Records handed to the reservoir and not yet answered (per process); a request that would pass it "
             "is answered 503 + `Retry-After` at once.")
    max_connections: int = v.option(DEFAULT_MAX_CONNECTIONS, v.count, lo=1, env="BUCKETQ_MAX_CONNECTIONS",
        help="Open connections (per process); a request on one more is answered 503 + `Retry-After` and its "
             "connection closed.")
    header_timeout_ms: int = v.option(DEFAULT_HEADER_TIMEOUT_MS, v.count, lo=100, env="BUCKETQ_HEADER_TIMEOUT_MS",
        help="A connection that has not sent a whole request head within this is closed.")
    body_timeout_ms: int = v.option(DEFAULT_BODY_TIMEOUT_MS, v.count, lo=100, env="BUCKETQ_BODY_TIMEOUT_MS",
        help="A request body not received whole within this (from its head) is answered 408 and its "
             "connection closed.")
    key_cache_size: int = v.option(DEFAULT_KEY_CACHE_SIZE, v.count, lo=1, env="BUCKETQ_KEY_CACHE_SIZE",
        help="Known keys remembered, and unknown keys remembered: two bounds, so unknown keys never evict "
             "known ones.")
    key_lookups_per_s: int = v.option(DEFAULT_KEY_LOOKUPS_PER_S, v.count, lo=1, env="BUCKETQ_KEY_LOOKUPS_PER_S",
        help="Lookups per second of keys not in the cache (per process); past it such a request is answered "
             "429 + `Retry-After` without a lookup.")
    tee_stream: str = v.option("", v.collection_name, optional=True, env="BUCKETQ_TEE_STREAM",
        help="Also append every accepted log record to this stream-mode queue (for `bucketq pipeline`).")
    watch_queues: str = v.option("", queue_names, env="BUCKETQ_WATCH_QUEUES",
        help="Queues and streams (of this database) whose sizes `/metrics` exports: comma-separated names, "
             "`*` for every one.")
    operator_key: str = v.option("", secret, env="BUCKETQ_OPERATOR_KEY",
        help="A key that opens the console at `/console` (at least 32 characters), besides "
             "`bucketq keys create --operator` keys.")
    log_level: str = v.option("info", v.choice, options=LOG_LEVELS, env="BUCKETQ_LOG_LEVEL",
        help="Log level of `bucketq serve` on stderr: `debug`, `info`, `warning` or `error` (`--log-level` wins).")
    store_restarts: int = v.option(DEFAULT_RESTARTS, v.count, lo=0, env="BUCKETQ_STORE_RESTARTS",
        help="The embedded store (no `BUCKETQ_MONGODB_URI`) is restarted when it dies or its storage fails; "
             "after this many failed restarts in a row `bucketq serve` exits 1.")
    store_restart_backoff_ms: int = v.option(int(DEFAULT_RESTART_BACKOFF_S * 1000), v.count, lo=10,
        env="BUCKETQ_STORE_RESTART_BACKOFF_MS",
        help="The first wait before a restart of the embedded store, doubled per failed attempt up to 30 s.")
    # fmt: on

    def __post_init__(self) -> None:
        v.check_options(self, SETTINGS)

    def with_(self, **changes: Any) -> ServerConfig:
        return replace(self, **changes)


#: Every variable the service reads, in :class:`ServerConfig`'s field order.
SETTINGS: tuple[v.Setting, ...] = v.settings(ServerConfig)


def from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerConfig:
    """Read :data:`SETTINGS` from ``environ`` (default ``os.environ``); ``overrides``
    (not None) win. An invalid value raises ConfigurationError naming the variable."""
    values = v.read_env(SETTINGS, environ)
    values.update({k: x for k, x in overrides.items() if x is not None})
    return ServerConfig(**values)


def config_table() -> str:
    """The configuration as a Markdown table (the one in ``docs/server.md``)."""
    return v.settings_table(SETTINGS)
