"""The buffer's configuration: one table of environment variables, read in one place.

The fields of :class:`BufferConfig` are the only list of variables: each declares its
default, check and help once (:func:`bucketq._validate.option`, the mechanism the
server's, the SDK's and Spark's options share), and :data:`SETTINGS` lists them.
:func:`from_env` reads them and :func:`config_table` renders them as the Markdown table
in ``docs/reservoir.md`` (a test keeps the two equal). No I/O besides reading the
environment mapping it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError
from ._breaker import RULES
from ._policy import KINDS, RETRY_PRESETS, SHARD_KEYS, parse_window

#: Names the Redis keys and bucketq queues of the buffer: ``<prefix>:<shard>``, ``<prefix>:dlq``.
DEFAULT_STREAM_PREFIX = "logtide:buffer"

log = logging.getLogger("bucketq.reservoir.config")

PREFIX = "RESERVOIR_BUFFER_"
TRANSPORTS = ("memory", "redis", "bucketq", "passthrough")
#: Marks a variable of bucketq's own in the docs' table (the others are LogTide's).
ADDED = " *(bucketq addition)*"

Setting = v.Setting


def _pairs(name: str, value: Any, example: str) -> Iterable[tuple[str, str]]:
    """``kind=spec`` pairs of comma-separated text, each kind one of :data:`KINDS`."""
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        kind, sep, spec = part.partition("=")
        if not sep or kind.strip() not in KINDS:
            raise ConfigurationError(
                f"{name} must look like {example} (kinds {', '.join(KINDS)}); got {part!r}."
            )
        yield kind.strip(), spec


def _by_kind_check(name: str, value: Any, per_kind: Any, example: str) -> dict[str, Any]:
    """A per-kind setting: text like ``example``, or a dict by kind."""
    if isinstance(value, str):
        return {kind: per_kind(f"{name} ({kind})", spec, True)
                for kind, spec in _pairs(name, value, example)}  # fmt: skip
    if not isinstance(value, Mapping) or any(k not in KINDS for k in value):
        raise ConfigurationError(
            f"{name} must be text like {example} or a dict by kind ({', '.join(KINDS)}); "
            f"got {value!r}."
        )
    return {k: per_kind(f"{name} ({k})", x, False) for k, x in value.items()}


def _attempts_base(name: str, value: Any, text: bool) -> tuple[int, int]:
    if text:
        attempts, colon, base = value.partition(":")
        if not colon:
            raise ConfigurationError(
                f"{name} must be attempts:base_ms, e.g. 6:5000; got {value!r}."
            )
        return (v.parse(v.count, f"{name} attempts", attempts, lo=1),
                v.parse(v.count, f"{name} base_ms", base, lo=1))  # fmt: skip
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ConfigurationError(f"{name} must be (attempts, base_ms); got {value!r}.")
    return v.count(f"{name} attempts", value[0], lo=1), v.count(f"{name} base_ms", value[1], lo=1)


def _ms(name: str, value: Any, text: bool) -> int:
    return v.parse(v.count, name, value) if text else v.count(name, value)


def retry_by_kind(name: str, value: Any) -> dict[str, tuple[int, int]]:
    """Per-kind attempts and first delay: ``span=6:5000,metric=2:100`` or a dict."""
    return _by_kind_check(name, value, _attempts_base, "span=6:5000,metric=2:100")


def ms_by_kind(name: str, value: Any) -> dict[str, int]:
    """Per-kind milliseconds >= 0: ``span=5000,log=1000`` or a dict."""
    return _by_kind_check(name, value, _ms, "span=5000,log=1000")


def window(name: str, value: Any) -> str:
    """A UTC ``HH:MM-HH:MM`` window."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be text like 23:45-00:15; got {value!r}.")
    try:
        parse_window(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name} {exc}.") from None
    return value.strip()


def projects(name: str, value: Any) -> frozenset[str]:
    """Project ids: comma-separated text, or any collection of strings."""
    if isinstance(value, str):
        return frozenset(p.strip() for p in value.split(",") if p.strip())
    if not isinstance(value, Iterable) or not all(isinstance(p, str) and p for p in value):
        raise ConfigurationError(f"{name} must be project ids (strings); got {value!r}.")
    return frozenset(value)


for _check in (retry_by_kind, ms_by_kind, window, projects):
    v.reads(str)(_check)  # the text as it is: each check reads its own format


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """The buffer's settings (times in milliseconds, as in the environment).

    Build it with :func:`from_env`, or directly with keywords for tests and embedding.
    Each field is also an environment variable (:data:`SETTINGS`), in this order in
    the documentation's table.
    """

    # fmt: off
    enabled: bool = v.option(False, v.flag, help="Put the buffer between the ingest API and storage.")
    transport: str = v.option("memory", v.choice, options=TRANSPORTS, help="`memory`, `redis`, `bucketq` or `passthrough` (see Transports).")
    shards: int = v.option(8, v.count, lo=1, help="Shards, each with one flush consumer: `mmh3(project_id) % SHARDS`.")
    max_batch_size: int = v.option(500, v.count, lo=1, help="A flush batch is written at this many records...")
    max_batch_age_ms: int = v.option(1000, v.count, lo=1, help="...or this long after it started collecting.")
    graceful_shutdown_ms: int = v.option(10000, v.count, lo=0, help="`stop()` drains for at most this long, then reports what is left.")
    pending_threshold: int = v.option(10000, v.count, lo=1, help="The breaker opens when more records than this are pending.")
    failure_threshold: int = v.option(20, v.count, lo=1, help="The breaker opens after this many failed flushes in a row "
                                  "(`BREAKER_RULE=window`: more than this many in the failure window).")
    cooldown_ms: int = v.option(30000, v.count, lo=0, help="An open breaker half-opens after this long; one successful flush closes it.")
    max_retry_attempts: int = v.option(3, v.count, lo=1, help="Failed storage writes per record before it goes to the DLQ.")
    base_delay_ms: int = v.option(100, v.count, lo=1, help="First retry delay; doubles per attempt, with jitter.")
    stream_prefix: str = v.option(DEFAULT_STREAM_PREFIX, v.collection_name, help="Name prefix of the Redis keys / bucketq queues (`<prefix>:<shard>`, `<prefix>:dlq`).")
    redis_url: str = v.option("", v.url, schemes=v.REDIS_SCHEMES, help="Redis for the `redis` transport; when missing, the buffer falls back to `memory` with a warning.", env="REDIS_URL")
    max_delay_ms: int = v.option(30000, v.count, lo=1, help="Cap of the retry delay.", tag=ADDED)
    breaker_rule: str = v.option("consecutive", v.choice, options=RULES,
        help="`consecutive` (LogTide's: failed flushes in a row; a fully stored flush resets the count) "
        "or `window` (failed flushes within `FAILURE_WINDOW_MS`; no reset). A flush is one batch of a shard; "
        "it failed when any of its records did not store.", tag=ADDED)
    failure_window_ms: int = v.option(60000, v.count, lo=1, help="`BREAKER_RULE=window`: the rolling window in which flush failures are counted.", tag=ADDED)
    shard_key: str = v.option("project", v.choice, options=SHARD_KEYS,
        help="`project`: shard by `project_id`; `entity`: by `{project_id}-{trace_id}` for spans and for logs "
        "that carry a `trace_id` (else the project), so one trace's records share a shard, in order.", tag=ADDED)
    retry_preset: str = v.option("seed", v.choice, options=tuple(RETRY_PRESETS),
        help="`seed` (LogTide's): `MAX_RETRY_ATTEMPTS` attempts from `BASE_DELAY_MS`; `langfuse`: 6 attempts, exponential from 5 s "
        "(the cap is raised to 80 s so the series is not cut short).", tag=ADDED)
    retry_by_kind: Any = v.option("", retry_by_kind,
        help="Per-kind attempts and first delay over the preset, e.g. `span=6:5000,metric=2:100` "
        "(`kind=attempts:base_ms`; kinds log, span, metric).", tag=ADDED)
    dlq_max: int = v.option(100000, v.count, lo=1,
        help="The DLQ keeps at most this many records; past it the oldest are dropped and counted "
        "(`reservoir_buffer_dlq_dropped_total`, `bucketq dlq list`).", tag=ADDED)
    dispatch_delay_by_kind: Any = v.option("", ms_by_kind,
        help="How long a freshly accepted record of a kind waits in the transport before it may be flushed, "
        "e.g. `span=5000` (`kind=ms`), so an entity's follow-up records are flushed together; durable at "
        "once, only the flush waits. Records that came through OTLP are never delayed. Not for `passthrough`.",
        tag=ADDED)
    date_boundary_delay_ms: int = v.option(0, v.count, lo=0,
        help="The dispatch delay of every kind (when longer than its own) while the UTC time is in "
        "`DATE_BOUNDARY_WINDOW`; OTLP records are not delayed.", tag=ADDED)
    date_boundary_window: str = v.option("23:45-00:15", window,
        help="UTC `HH:MM-HH:MM` (start inclusive, end exclusive; may wrap past midnight) in which "
        "`DATE_BOUNDARY_DELAY_MS` applies.", tag=ADDED)
    overflow_projects: frozenset[str] = v.option(frozenset(), projects, help="Comma-separated hot project ids pinned to an extra overflow shard (number `SHARDS`).", tag=ADDED)
    auto_overflow_failures: int = v.option(0, v.count, lo=0,
        help="A project whose flushes failed this many times in a row (throttled, rejected) while other projects' "
        "records were stored meanwhile is moved to the overflow shard (number `SHARDS`): its new records and "
        "its retries go there, and its failures there do not count for the breaker. `0`: off.", tag=ADDED)
    auto_overflow_cooldown_ms: int = v.option(60000, v.count, lo=1,
        help="How long a project moved by `AUTO_OVERFLOW_FAILURES` stays on the overflow shard before it comes back "
        "(moved again if it still fails).", tag=ADDED)
    claim_idle_ms: int = v.option(60000, v.count, lo=1, help="`redis`: a delivery unacknowledged this long (its consumer died) is claimed by another.", tag=ADDED)
    bucketq_commit_window_ms: int = v.option(10, v.count, lo=0, hi=1000,
        help="`bucketq` group commit: an ingest that finds its shard queue idle (nothing pending, no slot in the last "
        "half window) is written at once; while it is busy, ingests share slots this far apart, one insert each "
        "(about one insert per window); `0`: every ingest at once, shared only while an insert is in flight.",
        tag=ADDED)
    bucketq_lease_ms: int = v.option(30000, v.count, lo=1500,
        help="`bucketq`: a shard queue's lease on the buckets its consumer holds (renewed while the process runs): "
        "the records a dead process held are delivered to another this long after it died. At least 1500 "
        "(three of the queue's 0.5 s state flushes).",
        tag=ADDED)
    memory_capacity: int = v.option(100000, v.count, lo=1, help="`memory`: records it holds at most; past it, ingests write to storage directly.", tag=ADDED)
    mongodb_uri: str = v.option("", v.url, schemes=v.MONGODB_SCHEMES,
        help="MongoDB for the `bucketq` transport (database from the URI, else `bucketq`).",
        env=v.MONGODB_URI_ENV, tag=ADDED)
    # fmt: on

    def __post_init__(self) -> None:
        # Keyword construction gets the same checks as the environment.
        v.check_options(self, SETTINGS)

    @property
    def total_shards(self) -> int:
        """Shards including the overflow shard (if any project is pinned, or projects
        may be moved there)."""
        return self.shards + (1 if self.overflow_projects or self.auto_overflow_failures else 0)

    def retry_policies(self) -> dict[str, Any]:
        """Each kind's :class:`~bucketq.reservoir._policy.RetryPolicy`."""
        from ._policy import retry_policies

        return retry_policies(self.retry_preset, self.max_retry_attempts, self.base_delay_ms,
                              self.max_delay_ms, self.retry_by_kind)  # fmt: skip

    def delay_policy(self) -> Any:
        """The :class:`~bucketq.reservoir._policy.DelayPolicy` (dispatch delays)."""
        from ._policy import DelayPolicy, parse_window

        return DelayPolicy({k: ms / 1000 for k, ms in self.dispatch_delay_by_kind.items()},
                           self.date_boundary_delay_ms / 1000,
                           parse_window(self.date_boundary_window))  # fmt: skip

    def with_(self, **changes: Any) -> BufferConfig:
        return replace(self, **changes)


#: Every variable, in :class:`BufferConfig`'s field order: the one list of them.
SETTINGS: tuple[Setting, ...] = v.settings(BufferConfig, PREFIX)


def from_env(environ: Mapping[str, str] | None = None) -> BufferConfig:
    """Read the configuration from ``environ`` (default ``os.environ``).

    An invalid value raises :class:`~bucketq.errors.ConfigurationError` naming the
    variable. ``TRANSPORT=redis`` without ``REDIS_URL`` falls back to ``memory`` with a
    warning, as LogTide does.
    """
    cfg = BufferConfig(**v.read_env(SETTINGS, environ))
    if cfg.transport == "redis" and not cfg.redis_url:
        log.warning(
            "%sTRANSPORT=redis but REDIS_URL is not set; using the memory transport", PREFIX
        )
        cfg = cfg.with_(transport="memory")
    return cfg


def config_table() -> str:
    """The configuration as a Markdown table (the one in ``docs/reservoir.md``)."""
    return v.settings_table(SETTINGS)
