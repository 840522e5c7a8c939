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
from urllib.parse import urlsplit, urlunsplit

from .. import _validate as v
from ..errors import ConfigurationError

#: records held in memory per configuration (the writeback buffer holds as many again)
DEFAULT_QUEUE_SIZE = 1000
#: sender threads per configuration, each with its own HTTP connection pool
DEFAULT_WORKERS = 2
#: records per POST (the server's cost is mostly per request: 500 delivered ~3x what
#: 100 did, with a fifth of the senders' requests competing with the application)
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
#: bytes of spill kept on disk per configuration; past it the oldest segment goes
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


def _seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    # A float, so equal settings (1 and 1.0) name one processor and one spill directory.
    return float(v.number(name, value, lo=0.0, hi=None, open_lo=not zero_ok))


@dataclass(frozen=True, slots=True)
class Config:
    """One configuration of the SDK; equal configurations share one processor."""

    url: str
    api_key: str
    fallback_url: str | None
    fallback_api_key: str | None
    spill_dir: str
    queue_size: int = v.option(DEFAULT_QUEUE_SIZE, v.count, lo=1)
    workers: int = v.option(DEFAULT_WORKERS, v.count, lo=1)
    batch_size: int = v.option(DEFAULT_BATCH_SIZE, v.count, lo=1)
    batch_wait: float = v.option(DEFAULT_BATCH_WAIT, _seconds, zero_ok=True)
    health_interval: float = v.option(DEFAULT_HEALTH_INTERVAL, _seconds)
    timeout: float = v.option(DEFAULT_TIMEOUT, _seconds)
    connect_timeout: float = v.option(DEFAULT_CONNECT_TIMEOUT, _seconds)
    shutdown_timeout: float = v.option(DEFAULT_SHUTDOWN_TIMEOUT, _seconds, zero_ok=True)
    spill_max_bytes: int = v.option(DEFAULT_SPILL_MAX_BYTES, v.count, lo=1)
    spill_segment_bytes: int = v.option(DEFAULT_SPILL_SEGMENT_BYTES, v.count, lo=1)
    max_retry_after: float = v.option(DEFAULT_MAX_RETRY_AFTER, _seconds)
    retry_backoff: float = v.option(DEFAULT_RETRY_BACKOFF, _seconds, zero_ok=True)
    service: str = ""

    def __post_init__(self) -> None:
        v.check_options(self)
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

OPTION_NAMES = (
    "fallback_url",
    "fallback_api_key",
    "spill_dir",
    "queue_size",
    "workers",
    "batch_size",
    "batch_wait",
    "health_interval",
    "timeout",
    "connect_timeout",
    "shutdown_timeout",
    "spill_max_bytes",
    "spill_segment_bytes",
    "max_retry_after",
    "retry_backoff",
    "service",
)


_CHECKED_HERE = ("fallback_url", "fallback_api_key", "spill_dir", "service")


def make_config(url: object, api_key: object, **options: object) -> Config:
    """Validate ``url``, ``api_key`` and the keyword options; raise
    :class:`~bucketq.errors.ConfigurationError` naming the bad one."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"unknown SDK option(s) {unknown}; the options are {', '.join(OPTION_NAMES)}."
        )
    ingest, base = split_url(url, "url")
    if not isinstance(api_key, str) or not api_key.strip():
        raise ConfigurationError(
            "api_key must be a non-empty string (create one with `bucketq keys create --project NAME`)."
        )
    fallback = options.get("fallback_url")
    if fallback is not None:
        fb_ingest, fallback = split_url(fallback, "fallback_url")
        if fb_ingest == ingest:
            raise ConfigurationError(
                "fallback_url must name another server than url; leave it out to have none."
            )
    fb_key = options.get("fallback_api_key")
    if fb_key is not None and (not isinstance(fb_key, str) or not fb_key.strip()):
        raise ConfigurationError(
            "fallback_api_key must be a non-empty string, or None to use api_key."
        )
    spill = options.get("spill_dir")
    if spill is None:
        spill_dir = str(default_spill_root())
    elif isinstance(spill, str | os.PathLike):
        spill_dir = os.path.abspath(os.fspath(spill))
    else:
        raise ConfigurationError(f"spill_dir must be a directory path; got {spill!r}.")
    service = options.get("service")
    if service is None:
        service = default_service()
    if not isinstance(service, str) or not 1 <= len(service) <= 100:
        raise ConfigurationError(f"service must be a string of 1-100 characters; got {service!r}.")
    # The numbers are checked by Config itself (its fields' v.option).
    numbers = {k: x for k, x in options.items() if k not in _CHECKED_HERE}
    return Config(
        url=base,
        api_key=api_key,
        fallback_url=None if fallback is None else str(fallback),
        fallback_api_key=fb_key,
        spill_dir=spill_dir,
        service=service,
        **numbers,  # type: ignore[arg-type]
    )
