"""The buffer's configuration: one table of environment variables, read in one place.

:data:`SETTINGS` is the only list of variables; :func:`from_env` reads it and
:func:`config_table` renders it as the Markdown table in ``docs/reservoir.md`` (a test
keeps the two equal). No I/O besides reading the environment mapping it is given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError
from ._breaker import RULES
from ._policy import RETRY_PRESETS, SHARD_KEYS

#: Names the Redis keys and bucketq queues of the buffer: ``<prefix>:<shard>``, ``<prefix>:dlq``.
DEFAULT_STREAM_PREFIX = "logtide:buffer"

log = logging.getLogger("bucketq.reservoir.config")

PREFIX = "RESERVOIR_BUFFER_"
TRANSPORTS = ("memory", "redis", "bucketq", "passthrough")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false (1/0, yes/no, on/off)")


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"must be a whole number >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"must be a whole number >= {minimum}")
        return value

    return parse


def _one_of(options: tuple[str, ...]) -> Callable[[str], str]:
    """A parser for one of ``options`` (any case, spaces around ignored)."""
    need = " or ".join(options) if len(options) == 2 else "one of " + ", ".join(options)

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"must be {need}")
        return value

    return parse


_choice = _one_of(TRANSPORTS)
_rule = _one_of(RULES)
_shard_key = _one_of(SHARD_KEYS)
_preset = _one_of(tuple(RETRY_PRESETS))


def _by_kind(text: str) -> dict[str, tuple[int, int]]:
    from ._policy import parse_retry_by_kind

    return parse_retry_by_kind(text)


def _ms_by_kind(text: str) -> dict[str, int]:
    from ._policy import parse_ms_by_kind

    return parse_ms_by_kind(text)


def _window(text: str) -> str:
    from ._policy import parse_window

    parse_window(text)
    return text.strip()


def _text(text: str) -> str:
    return text.strip()


def _url(*schemes: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return v.url("it", text, schemes)
        except ConfigurationError as exc:
            raise ValueError(str(exc).removeprefix("it ").split("; got")[0]) from None

    return parse


def _prefix(text: str) -> str:
    value = text.strip()
    if not value or "$" in value or " " in value:
        raise ValueError("must be a non-empty name without spaces or '$'")
    return value


def _projects(text: str) -> frozenset[str]:
    return frozenset(p.strip() for p in text.split(",") if p.strip())


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: its name, the :class:`BufferConfig` field it sets, its
    default as written in the environment, what it does, and whether it is one of the
    seed's (LogTide's) variables or a bucketq addition."""

    env: str
    field: str
    default: str
    help: str
    parse: Callable[[str], Any]
    seed: bool = True


SETTINGS: tuple[Setting, ...] = (
    Setting(PREFIX + "ENABLED", "enabled", "false", "Put the buffer between the ingest API and storage.", _bool),
    Setting(PREFIX + "TRANSPORT", "transport", "memory",
            "`memory`, `redis`, `bucketq` or `passthrough` (see Transports).", _choice),
    Setting(PREFIX + "SHARDS", "shards", "8",
            "Shards, each with one flush consumer: `mmh3(project_id) % SHARDS`.", _int(1)),
    Setting(PREFIX + "MAX_BATCH_SIZE", "max_batch_size", "500", "A flush batch is written at this many records...", _int(1)),
    Setting(PREFIX + "MAX_BATCH_AGE_MS", "max_batch_age_ms", "1000", "...or this long after it started collecting.", _int(1)),
    Setting(PREFIX + "GRACEFUL_SHUTDOWN_MS", "graceful_shutdown_ms", "10000",
            "`stop()` drains for at most this long, then reports what is left.", _int(0)),
    Setting(PREFIX + "PENDING_THRESHOLD", "pending_threshold", "10000",
            "The breaker opens when more records than this are pending.", _int(1)),
    Setting(PREFIX + "FAILURE_THRESHOLD", "failure_threshold", "20",
            "The breaker opens after this many failed flushes in a row (`BREAKER_RULE=window`: more than this many in the failure window).", _int(1)),
    Setting(PREFIX + "COOLDOWN_MS", "cooldown_ms", "30000",
            "An open breaker half-opens after this long; one successful flush closes it.", _int(0)),
    Setting(PREFIX + "MAX_RETRY_ATTEMPTS", "max_retry_attempts", "3",
            "Failed storage writes per record before it goes to the DLQ.", _int(1)),
    Setting(PREFIX + "BASE_DELAY_MS", "base_delay_ms", "100",
            "First retry delay; doubles per attempt, with jitter.", _int(1)),
    Setting(PREFIX + "STREAM_PREFIX", "stream_prefix", DEFAULT_STREAM_PREFIX,
            "Name prefix of the Redis keys / bucketq queues (`<prefix>:<shard>`, `<prefix>:dlq`).", _prefix),
    Setting("REDIS_URL", "redis_url", "",
            "Redis for the `redis` transport; when missing, the buffer falls back to `memory` with a warning.",
            _url(*v.REDIS_SCHEMES)),
    Setting(PREFIX + "MAX_DELAY_MS", "max_delay_ms", "30000", "Cap of the retry delay.", _int(1), seed=False),
    Setting(PREFIX + "BREAKER_RULE", "breaker_rule", "consecutive",
            "`consecutive` (the seed's: failed flushes in a row; a fully stored flush resets the count) "
            "or `window` (failed flushes within `FAILURE_WINDOW_MS`; no reset). A flush is one batch of a shard; "
            "it failed when any of its records did not store.", _rule, seed=False),
    Setting(PREFIX + "FAILURE_WINDOW_MS", "failure_window_ms", "60000",
            "`BREAKER_RULE=window`: the rolling window in which flush failures are counted.", _int(1), seed=False),
    Setting(PREFIX + "SHARD_KEY", "shard_key", "project",
            "`project`: shard by `project_id`; `entity`: by `{project_id}-{trace_id}` for spans and for logs "
            "that carry a `trace_id` (else the project), so one trace's records share a shard, in order.",
            _shard_key, seed=False),
    Setting(PREFIX + "RETRY_PRESET", "retry_preset", "seed",
            "`seed`: `MAX_RETRY_ATTEMPTS` attempts from `BASE_DELAY_MS`; `langfuse`: 6 attempts, exponential from 5 s "
            "(the cap is raised to 80 s so the series is not cut short).", _preset, seed=False),
    Setting(PREFIX + "RETRY_BY_KIND", "retry_by_kind", "",
            "Per-kind attempts and first delay over the preset, e.g. `span=6:5000,metric=2:100` "
            "(`kind=attempts:base_ms`; kinds log, span, metric).", _by_kind, seed=False),
    Setting(PREFIX + "DLQ_MAX", "dlq_max", "100000",
            "The DLQ keeps at most this many records; past it the oldest are dropped and counted "
            "(`reservoir_buffer_dlq_dropped_total`, `bucketq dlq inspect`).", _int(1), seed=False),
    Setting(PREFIX + "DISPATCH_DELAY_BY_KIND", "dispatch_delay_by_kind", "",
            "How long a freshly accepted record of a kind waits in the transport before it may be flushed, "
            "e.g. `span=5000` (`kind=ms`), so an entity's follow-up records are flushed together; durable at "
            "once, only the flush waits. Records that came through OTLP are never delayed. Not for `passthrough`.",
            _ms_by_kind, seed=False),
    Setting(PREFIX + "DATE_BOUNDARY_DELAY_MS", "date_boundary_delay_ms", "0",
            "The dispatch delay of every kind (when longer than its own) while the UTC time is in "
            "`DATE_BOUNDARY_WINDOW`; OTLP records are not delayed.", _int(0), seed=False),
    Setting(PREFIX + "DATE_BOUNDARY_WINDOW", "date_boundary_window", "23:45-00:15",
            "UTC `HH:MM-HH:MM` (start inclusive, end exclusive; may wrap past midnight) in which "
            "`DATE_BOUNDARY_DELAY_MS` applies.", _window, seed=False),
    Setting(PREFIX + "OVERFLOW_PROJECTS", "overflow_projects", "",
            "Comma-separated hot project ids pinned to an extra overflow shard (number `SHARDS`).",
            _projects, seed=False),
    Setting(PREFIX + "AUTO_OVERFLOW_FAILURES", "auto_overflow_failures", "0",
            "A project whose flushes failed this many times in a row (throttled, rejected) while other projects' "
            "records were stored meanwhile is moved to the overflow shard (number `SHARDS`): its new records and "
            "its retries go there, and its failures there do not count for the breaker. `0`: off.",
            _int(0), seed=False),
    Setting(PREFIX + "AUTO_OVERFLOW_COOLDOWN_MS", "auto_overflow_cooldown_ms", "60000",
            "How long a project moved by `AUTO_OVERFLOW_FAILURES` stays on the overflow shard before it comes back "
            "(moved again if it still fails).", _int(1), seed=False),
    Setting(PREFIX + "CLAIM_IDLE_MS", "claim_idle_ms", "60000",
            "`redis`: a delivery unacknowledged this long (its consumer died) is claimed by another.",
            _int(1), seed=False),
    Setting(PREFIX + "BUCKETQ_COMMIT_WINDOW_MS", "bucketq_commit_window_ms", "10",
            "`bucketq`: an ingest's bucket is written this long after it opened (at the earliest once the shard "
            "queue's insert in flight returned), so the ingests arriving meanwhile share one insert; `0`: at once "
            "when no insert is in flight (one insert per request at low rates, the lowest latency).",
            _int(0), seed=False),
    Setting(PREFIX + "MEMORY_CAPACITY", "memory_capacity", "100000",
            "`memory`: records it holds at most; past it, ingests write to storage directly.", _int(1), seed=False),
    Setting("BUCKETQ_MONGODB_URI", "mongodb_uri", "",
            "MongoDB for the `bucketq` transport (database from the URI, else `bucketq`).",
            _url(*v.MONGODB_SCHEMES), seed=False),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """The buffer's settings (times in milliseconds, as in the environment).

    Build it with :func:`from_env`, or directly with keywords for tests and embedding.
    """

    enabled: bool = False
    transport: str = "memory"
    shards: int = 8
    max_batch_size: int = 500
    max_batch_age_ms: int = 1000
    graceful_shutdown_ms: int = 10000
    pending_threshold: int = 10000
    failure_threshold: int = 20
    cooldown_ms: int = 30000
    max_retry_attempts: int = 3
    base_delay_ms: int = 100
    stream_prefix: str = DEFAULT_STREAM_PREFIX
    redis_url: str = ""
    max_delay_ms: int = 30000
    breaker_rule: str = "consecutive"
    failure_window_ms: int = 60000
    shard_key: str = "project"
    dlq_max: int = 100000
    retry_preset: str = "seed"
    retry_by_kind: Any = ""
    dispatch_delay_by_kind: Any = ""
    date_boundary_delay_ms: int = 0
    date_boundary_window: str = "23:45-00:15"
    overflow_projects: frozenset[str] = field(default_factory=frozenset)
    auto_overflow_failures: int = 0
    auto_overflow_cooldown_ms: int = 60000
    claim_idle_ms: int = 60000
    bucketq_commit_window_ms: int = 10
    memory_capacity: int = 100000
    mongodb_uri: str = ""

    def __post_init__(self) -> None:
        # Keyword construction gets the same checks as the environment.
        for s in SETTINGS:
            value = getattr(self, s.field)
            if s.field in ("retry_by_kind", "dispatch_delay_by_kind"):
                if isinstance(value, str):
                    try:
                        value = s.parse(value)
                    except ValueError as exc:
                        raise ConfigurationError(f"{s.field} ({s.env}) {exc}.") from None
                object.__setattr__(self, s.field, dict(value))
                continue
            if s.field == "overflow_projects":
                if isinstance(value, str):
                    object.__setattr__(self, s.field, _projects(value))
                elif not isinstance(value, frozenset):
                    object.__setattr__(self, s.field, frozenset(value))
                continue
            # The type first (a count is an int, never a bool or a string), then the range.
            want = _FIELD_TYPES[s.field]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigurationError(
                    f"{s.field} ({s.env}) must be {_TYPE_WORDS[want]}; got {value!r}."
                )
            try:
                s.parse(str(value).lower() if isinstance(value, bool) else str(value))
            except ValueError as exc:
                raise ConfigurationError(f"{s.field} ({s.env}) {exc}; got {value!r}.") from None

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


def from_env(environ: Mapping[str, str] | None = None) -> BufferConfig:
    """Read the configuration from ``environ`` (default ``os.environ``).

    An invalid value raises :class:`~bucketq.errors.ConfigurationError` naming the
    variable. ``TRANSPORT=redis`` without ``REDIS_URL`` falls back to ``memory`` with a
    warning, as in the seed.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw = env.get(s.env)
        text = s.default if raw is None else raw
        try:
            values[s.field] = s.parse(text)
        except ValueError as exc:
            raise ConfigurationError(f"{s.env} {exc}; got {raw!r}. Fix or unset it.") from None
    if values["transport"] == "redis" and not values["redis_url"]:
        log.warning(
            "%sTRANSPORT=redis but REDIS_URL is not set; using the memory transport", PREFIX
        )
        values["transport"] = "memory"
    return BufferConfig(**values)


def config_table() -> str:
    """The configuration as a Markdown table (the one in ``docs/reservoir.md``)."""
    lines = [
        "| Variable | Default | Meaning |",
        "|---|---|---|",
    ]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "(unset)"
        note = "" if s.seed else " *(bucketq addition)*"
        lines.append(f"| `{s.env}` | {default} | {s.help}{note} |")
    return "\n".join(lines) + "\n"


#: Each field's Python type, checked on keyword construction (the environment gives text).
_FIELD_TYPES: dict[str, type] = {
    f.name: {"bool": bool, "int": int, "str": str}.get(str(f.type), object)
    for f in fields(BufferConfig)
}
_TYPE_WORDS = {
    bool: "True or False",
    int: "a whole number (an int)",
    str: "a string",
    object: "set",
}
