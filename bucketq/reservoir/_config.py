"""The buffer's configuration: one table of environment variables, read in one place.

The fields of :class:`BufferConfig` are the only list of variables: each states its
default, parser and help once, and :data:`SETTINGS` lists them, each a :class:`Setting`.
:func:`from_env` reads them and :func:`config_table` renders them as the Markdown table
in ``docs/reservoir.md`` (a test keeps the two equal). No I/O besides reading the
environment mapping it is given.
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


def _env(default: Any, parse: Callable[[str], Any], help: str, *, env: str = "",
         seed: bool = True) -> Any:  # fmt: skip
    """A :class:`BufferConfig` field read from the variable ``env`` (by default
    ``RESERVOIR_BUFFER_`` and the field's name in capitals) with ``parse``; the rest as
    in :class:`Setting`."""
    return field(default=default, metadata={"env": env, "parse": parse, "help": help, "seed": seed})


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """The buffer's settings (times in milliseconds, as in the environment).

    Build it with :func:`from_env`, or directly with keywords for tests and embedding.
    Each field is also an environment variable (:data:`SETTINGS`), in this order in
    the documentation's table.
    """

    # fmt: off
    enabled: bool = _env(False, _bool, "Put the buffer between the ingest API and storage.")
    transport: str = _env("memory", _choice, "`memory`, `redis`, `bucketq` or `passthrough` (see Transports).")
    shards: int = _env(8, _int(1), "Shards, each with one flush consumer: `mmh3(project_id) % SHARDS`.")
    max_batch_size: int = _env(500, _int(1), "A flush batch is written at this many records...")
    max_batch_age_ms: int = _env(1000, _int(1), "...or this long after it started collecting.")
    graceful_shutdown_ms: int = _env(10000, _int(0), "`stop()` drains for at most this long, then reports what is left.")
    pending_threshold: int = _env(10000, _int(1), "The breaker opens when more records than this are pending.")
    failure_threshold: int = _env(20, _int(1), "The breaker opens after this many failed flushes in a row "
                                  "(`BREAKER_RULE=window`: more than this many in the failure window).")
    cooldown_ms: int = _env(30000, _int(0), "An open breaker half-opens after this long; one successful flush closes it.")
    max_retry_attempts: int = _env(3, _int(1), "Failed storage writes per record before it goes to the DLQ.")
    base_delay_ms: int = _env(100, _int(1), "First retry delay; doubles per attempt, with jitter.")
    stream_prefix: str = _env(DEFAULT_STREAM_PREFIX, _prefix, "Name prefix of the Redis keys / bucketq queues (`<prefix>:<shard>`, `<prefix>:dlq`).")
    redis_url: str = _env("", _url(*v.REDIS_SCHEMES), "Redis for the `redis` transport; when missing, the buffer falls back to `memory` with a warning.", env="REDIS_URL")
    max_delay_ms: int = _env(30000, _int(1), "Cap of the retry delay.", seed=False)
    breaker_rule: str = _env("consecutive", _rule,
        "`consecutive` (LogTide's: failed flushes in a row; a fully stored flush resets the count) "
        "or `window` (failed flushes within `FAILURE_WINDOW_MS`; no reset). A flush is one batch of a shard; "
        "it failed when any of its records did not store.", seed=False)
    failure_window_ms: int = _env(60000, _int(1), "`BREAKER_RULE=window`: the rolling window in which flush failures are counted.", seed=False)
    shard_key: str = _env("project", _shard_key,
        "`project`: shard by `project_id`; `entity`: by `{project_id}-{trace_id}` for spans and for logs "
        "that carry a `trace_id` (else the project), so one trace's records share a shard, in order.", seed=False)
    retry_preset: str = _env("seed", _preset,
        "`seed` (LogTide's): `MAX_RETRY_ATTEMPTS` attempts from `BASE_DELAY_MS`; `langfuse`: 6 attempts, exponential from 5 s "
        "(the cap is raised to 80 s so the series is not cut short).", seed=False)
    retry_by_kind: Any = _env("", _by_kind,
        "Per-kind attempts and first delay over the preset, e.g. `span=6:5000,metric=2:100` "
        "(`kind=attempts:base_ms`; kinds log, span, metric).", seed=False)
    dlq_max: int = _env(100000, _int(1),
        "The DLQ keeps at most this many records; past it the oldest are dropped and counted "
        "(`reservoir_buffer_dlq_dropped_total`, `bucketq dlq inspect`).", seed=False)
    dispatch_delay_by_kind: Any = _env("", _ms_by_kind,
        "How long a freshly accepted record of a kind waits in the transport before it may be flushed, "
        "e.g. `span=5000` (`kind=ms`), so an entity's follow-up records are flushed together; durable at "
        "once, only the flush waits. Records that came through OTLP are never delayed. Not for `passthrough`.",
        seed=False)
    date_boundary_delay_ms: int = _env(0, _int(0),
        "The dispatch delay of every kind (when longer than its own) while the UTC time is in "
        "`DATE_BOUNDARY_WINDOW`; OTLP records are not delayed.", seed=False)
    date_boundary_window: str = _env("23:45-00:15", _window,
        "UTC `HH:MM-HH:MM` (start inclusive, end exclusive; may wrap past midnight) in which "
        "`DATE_BOUNDARY_DELAY_MS` applies.", seed=False)
    overflow_projects: frozenset[str] = _env(frozenset(), _projects, "Comma-separated hot project ids pinned to an extra overflow shard (number `SHARDS`).", seed=False)
    auto_overflow_failures: int = _env(0, _int(0),
        "A project whose flushes failed this many times in a row (throttled, rejected) while other projects' "
        "records were stored meanwhile is moved to the overflow shard (number `SHARDS`): its new records and "
        "its retries go there, and its failures there do not count for the breaker. `0`: off.", seed=False)
    auto_overflow_cooldown_ms: int = _env(60000, _int(1),
        "How long a project moved by `AUTO_OVERFLOW_FAILURES` stays on the overflow shard before it comes back "
        "(moved again if it still fails).", seed=False)
    claim_idle_ms: int = _env(60000, _int(1), "`redis`: a delivery unacknowledged this long (its consumer died) is claimed by another.", seed=False)
    bucketq_commit_window_ms: int = _env(10, _int(0),
        "`bucketq` group commit: an ingest that finds its shard queue idle (nothing pending, no slot in the last "
        "half window) is written at once; while it is busy, ingests share slots this far apart, one insert each "
        "(about one insert per window); `0`: every ingest at once, shared only while an insert is in flight.",
        seed=False)
    bucketq_lease_ms: int = _env(30000, _int(1500),
        "`bucketq`: a shard queue's lease on the buckets its consumer holds (renewed while the process runs): "
        "the records a dead process held are delivered to another this long after it died. At least 1500 "
        "(three of the queue's 0.5 s state flushes).",
        seed=False)
    memory_capacity: int = _env(100000, _int(1), "`memory`: records it holds at most; past it, ingests write to storage directly.", seed=False)
    mongodb_uri: str = _env("", _url(*v.MONGODB_SCHEMES),
        "MongoDB for the `bucketq` transport (database from the URI, else `bucketq`).",
        env="BUCKETQ_MONGODB_URI", seed=False)
    # fmt: on

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


def _as_text(value: Any) -> str:
    """A default as the environment writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    return str(value)


#: Every variable, in :class:`BufferConfig`'s field order: the one list of them.
SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.metadata["env"] or PREFIX + f.name.upper(), f.name, _as_text(f.default),
            f.metadata["help"], f.metadata["parse"], f.metadata["seed"])
    for f in fields(BufferConfig)
)  # fmt: skip


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
