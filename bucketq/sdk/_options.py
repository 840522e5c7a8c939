"""The SDK's options: one table of ``DEFAULT_*`` constants, validated in one place.

Pure: no I/O besides reading ``XDG_STATE_HOME``/``HOME`` for the default spill
directory (:func:`default_spill_root`). :func:`make_config` turns the keyword
arguments of :class:`~bucketq.sdk.Client` / :class:`~bucketq.sdk.IngestHandler` into a
frozen :class:`Config` whose :meth:`Config.key` names one processor.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .. import _validate as v
from ..errors import ConfigurationError

#: records held in memory per configuration (the writeback buffer holds as many again,
#: the spill buffer 4 times as many: see _processor_state.SPILL_BUFFER_QUEUES)
DEFAULT_QUEUE_SIZE = 1000
#: sender threads per configuration, each with its own HTTP connection pool
DEFAULT_WORKERS = 2
#: records per POST (the server's cost is mostly per request, and fewer requests mean
#: less of the senders' work competing with the application)
DEFAULT_BATCH_SIZE = 500
#: seconds a sender waits for a batch to fill before it sends what it has
DEFAULT_BATCH_WAIT = 0.5
#: seconds between probes of an endpoint marked down
DEFAULT_HEALTH_INTERVAL = 5.0
#: seconds an HTTP request may take once connected (read/write)
DEFAULT_TIMEOUT = 5.0
#: seconds to establish a connection
DEFAULT_CONNECT_TIMEOUT = 2.0
#: seconds close() and the exit hook wait for pending records before spilling them
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
#: bytes of spill kept on disk per destination directory; past it the oldest segment goes
DEFAULT_SPILL_MAX_BYTES = 64 * 1024 * 1024
#: bytes per spill segment (file) before the next one starts
DEFAULT_SPILL_SEGMENT_BYTES = 4 * 1024 * 1024
#: the longest Retry-After honoured, in seconds
DEFAULT_MAX_RETRY_AFTER = 60.0
#: seconds to wait after a 502/504 (or 429/503 without Retry-After)
DEFAULT_RETRY_BACKOFF = 1.0

#: fill (percent of queue_size) at which the drain worker starts
DRAIN_START_PERCENT = 90.0
#: fill at which it stops
DRAIN_STOP_PERCENT = 10.0
#: records per POST of the drain worker
DRAIN_BATCH_SIZE = 100
#: the ingest route and the probe routes of ``bucketq serve`` (``/ready``, else ``/health``)
INGEST_PATH = "/api/v1/ingest"
HEALTH_PATH = "/health"
READY_PATH = "/ready"
#: the logger the SDK writes its own warnings to; IngestHandler never sends its records
LOGGER_NAME = "bucketq.sdk"


def default_spill_root() -> Path:
    """``$XDG_STATE_HOME/bucketq/sdk-spill``, else ``~/.local/state/bucketq/sdk-spill``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "bucketq" / "sdk-spill"


def default_service() -> str:
    """The program's name (``sys.argv[0]`` without directory and ``.py``), else ``python``."""
    name = os.path.basename(sys.argv[0] or "") if sys.argv else ""
    if name.endswith(".py"):
        name = name[:-3]
    if name in ("", "-", "-c", "-m"):
        return "python"
    return name[:100]


def split_url(url: object, arg: str) -> tuple[str, str]:
    """``(ingest_url, base_url)`` for a server URL given as its root or its ingest route."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"{arg} must be the server's URL, e.g. 'http://127.0.0.1:8080'; got {url!r}."
        )
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{arg} must be an http:// or https:// URL with a host, e.g. "
            f"'http://127.0.0.1:8080'; got {url!r}."
        )
    path = parts.path.rstrip("/")
    if path.endswith(INGEST_PATH):
        path = path[: -len(INGEST_PATH)]
    base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return base + INGEST_PATH, base


def server_url(name: str, value: object) -> str:
    """A server's URL, given as its root or its ingest route: its root (base URL)."""
    return split_url(value, name)[1]


def check_api_key(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{name} must be a non-empty string (create one with `bucketq keys create --project NAME`)."
        )
    return value


def directory(name: str, value: object) -> str:
    """A directory path (str or path-like), made absolute."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ConfigurationError(f"{name} must be a directory path; got {value!r}.")
    return os.path.abspath(os.fspath(value))


# Each option is declared once: its default (a DEFAULT_* constant), its check and its
# help (bucketq._validate.option); docs/sdk.md's table is rendered from them.
_SECONDS: dict[str, Any] = {"lo": 0.0, "hi": None, "open_lo": True}
_SECONDS_OR_ZERO: dict[str, Any] = {"lo": 0.0, "hi": None}


@dataclass(frozen=True, slots=True)
class Config:
    """One configuration of the SDK; equal configurations share one processor."""

    # fmt: off
    url: str = v.option(check=server_url)
    api_key: str = v.option(check=check_api_key)
    fallback_url: str | None = v.option(None, v.maybe(server_url),
        help="a second server for when the primary is down, and the drain worker's target")
    fallback_api_key: str | None = v.option(None, v.maybe(check_api_key), shown="`api_key`",
        help="the key for the fallback (its project there)")
    spill_dir: str = v.option(factory=lambda: str(default_spill_root()), check=directory,
        shown="`$XDG_STATE_HOME/bucketq/sdk-spill` (`~/.local/state/...`)",
        help="root of the spill; each destination (url and key) has its own directory below it")
    queue_size: int = v.option(DEFAULT_QUEUE_SIZE, v.count, lo=1,
        help="records held in memory; the writeback buffer holds up to as many again, and the spill buffer 4 times as many on their way to the spill")
    workers: int = v.option(DEFAULT_WORKERS, v.count, lo=1,
        help="sender threads, each with its own connection pool")
    batch_size: int = v.option(DEFAULT_BATCH_SIZE, v.count, lo=1,
        help="records per POST (a request batch; at most the server's `MAX_RECORDS`, 1000 by default)")
    batch_wait: float = v.option(DEFAULT_BATCH_WAIT, v.number, **_SECONDS_OR_ZERO,
        help="seconds a sender waits for a batch to fill before sending what it has")
    health_interval: float = v.option(DEFAULT_HEALTH_INTERVAL, v.number, **_SECONDS,
        help="seconds between probes (`GET /ready`, else `/health`) of a server marked down")
    timeout: float = v.option(DEFAULT_TIMEOUT, v.number, **_SECONDS,
        help="seconds per request once connected")
    connect_timeout: float = v.option(DEFAULT_CONNECT_TIMEOUT, v.number, **_SECONDS,
        help="seconds to connect")
    shutdown_timeout: float = v.option(DEFAULT_SHUTDOWN_TIMEOUT, v.number, **_SECONDS_OR_ZERO,
        help="seconds `close()` and the exit hook wait for pending records; the rest is spilled")
    spill_max_bytes: int = v.option(DEFAULT_SPILL_MAX_BYTES, v.count, lo=1,
        help="bytes of spill kept per destination directory; past it the oldest segment goes, counted as lost")
    spill_segment_bytes: int = v.option(DEFAULT_SPILL_SEGMENT_BYTES, v.count, lo=1,
        help="bytes of one spill file before the next starts (at most `spill_max_bytes`)")
    max_retry_after: float = v.option(DEFAULT_MAX_RETRY_AFTER, v.number, **_SECONDS,
        help="the longest `Retry-After` honoured, in seconds")
    retry_backoff: float = v.option(DEFAULT_RETRY_BACKOFF, v.number, **_SECONDS_OR_ZERO,
        help="seconds to wait after a 502/504, or a 429/503 without `Retry-After`")
    service: str = v.option(factory=default_service, check=v.text, hi=100, shown="program name",
        help="the records' `service`")
    # fmt: on

    def __post_init__(self) -> None:
        # Every value is checked (and the URLs made their roots) where it is declared.
        v.check_options(self)
        if self.fallback_url is not None and self.fallback_url == self.url:
            raise ConfigurationError(
                "fallback_url must name another server than url; leave it out to have none."
            )
        if self.spill_segment_bytes > self.spill_max_bytes:
            raise ConfigurationError(
                f"spill_segment_bytes ({self.spill_segment_bytes}) must not exceed spill_max_bytes "
                f"({self.spill_max_bytes}); the bound keeps at least one whole segment."
            )

    @property
    def ingest_url(self) -> str:
        return split_url(self.url, "url")[0]

    @property
    def base_url(self) -> str:
        return split_url(self.url, "url")[1]

    @property
    def fallback_ingest_url(self) -> str | None:
        return (
            None if self.fallback_url is None else split_url(self.fallback_url, "fallback_url")[0]
        )

    @property
    def fallback_base_url(self) -> str | None:
        return (
            None if self.fallback_url is None else split_url(self.fallback_url, "fallback_url")[1]
        )

    def key(self) -> tuple:
        """The registry key: every field."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def spill_path(self) -> Path:
        """This destination's spill directory: ``spill_dir/<hash of url, api_key,
        fallback_url, fallback_api_key>`` (the API keys enter the hash only through their
        SHA-256). Only where records go decides it: each spilled line is a whole record (its
        own ``service``), so any later process sending to the same server with the same key
        replays what an exited one left, whatever its program or its other options. Two
        configurations sharing a directory is safe: each writer appends to its own locked
        segment."""
        parts = []
        for name in SPILL_KEY_FIELDS:
            value = getattr(self, name)
            if name in ("api_key", "fallback_api_key") and value is not None:
                value = hashlib.sha256(value.encode()).hexdigest()
            parts.append(f"{name}={value!r}")
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
        return Path(self.spill_dir) / digest


#: The fields that name a spill directory: where its records go (see ``Config.spill_path``).
SPILL_KEY_FIELDS = ("url", "api_key", "fallback_url", "fallback_api_key")

#: The keyword options (besides ``url`` and ``api_key``), in their order.
OPTIONS: tuple[v.Setting, ...] = v.settings(Config, keywords=True)
OPTION_NAMES = tuple(s.field for s in OPTIONS)


def options_table() -> str:
    """The options as the Markdown table in ``docs/sdk.md``."""
    return v.settings_table(OPTIONS, first="Option")


def make_config(url: object, api_key: object, **options: object) -> Config:
    """Validate ``url``, ``api_key`` and the keyword options; raise
    :class:`~bucketq.errors.ConfigurationError` naming the bad one. ``spill_dir`` and
    ``service`` given as None are their defaults."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"unknown SDK option(s) {unknown}; the options are {', '.join(OPTION_NAMES)}."
        )
    given = {k: x for k, x in options.items() if x is not None or k not in ("spill_dir", "service")}
    return Config(url=url, api_key=api_key, **given)  # type: ignore[arg-type]
