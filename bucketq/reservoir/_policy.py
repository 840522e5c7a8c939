"""The buffer's small decisions, with no I/O: shards, dispatch and retry delays, batching,
outcomes.

Nothing here imports redis, pymongo or asyncio; ``mmh3`` is imported when a shard is
first computed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._deps import require
from .._guard import backoff
from ._logbuckets import IDS

#: The record kinds the buffer carries (each goes to its ``STORAGE_METHOD``).
KINDS = ("log", "span", "metric")

_mmh3_hash: Callable[..., int] | None = None


def shard_for(
    project_id: str, shards: int, overflow_projects: frozenset[str] | set[str] = frozenset()
) -> int:
    """``mmh3.hash(project_id.encode(), 0, signed=False) % shards``; a pinned hot project
    goes to the overflow shard, numbered ``shards``."""
    global _mmh3_hash
    if project_id in overflow_projects:
        return shards
    if _mmh3_hash is None:
        _mmh3_hash = require("mmh3", "reservoir").hash
    return _mmh3_hash(project_id.encode(), 0, signed=False) % shards


SHARD_KEYS = ("project", "entity")


def shard_key(kind: str, project_id: str, record: Mapping[str, Any], mode: str = "project") -> str:
    """What a record is sharded by: its ``project_id`` (``mode="project"``), or with
    ``mode="entity"`` ``{project_id}-{entity}``, the entity being a span's ``trace_id``,
    a log's ``trace_id`` when it has one, else the project (metrics: the project). All
    records of one entity land on one shard, in the order they were accepted."""
    if not sharded_by_project(kind, mode):
        trace = record.get("trace_id")
        if isinstance(trace, str) and trace:
            return f"{project_id}-{trace}"
    return project_id


def sharded_by_project(kind: str, mode: str = "project") -> bool:
    """Whether every record of ``kind`` goes to its project's shard under ``mode`` (so
    one lookup per project serves a whole call): all but spans and logs by entity."""
    return mode != "entity" or kind == "metric"


def record_shard(
    kind: str,
    project_id: str,
    record: Mapping[str, Any],
    shards: int,
    overflow_projects: frozenset[str] | set[str] = frozenset(),
    mode: str = "project",
) -> int:
    """The shard of one record: a pinned hot project's overflow shard, else
    ``mmh3(shard_key(...)) % shards``."""
    if project_id in overflow_projects:
        return shards
    return shard_for(shard_key(kind, project_id, record, mode), shards)


def retry_delay(
    attempts: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before delivering a record again after its ``attempts``-th failure:
    the one back-off (:func:`bucketq._guard.backoff`: exponential from ``base``, capped at
    ``cap``, "equal jitter"), so retries spread out but never come back at once."""
    return backoff(attempts, base, cap, rng)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a record of one kind is written before it goes to the DLQ, and how
    long it waits between attempts (seconds): ``base`` doubled per attempt, capped."""

    attempts: int
    base: float
    cap: float

    def delay(self, attempts: int, rng: Callable[[], float] = random.random) -> float:
        return retry_delay(attempts, self.base, self.cap, rng)


#: Named retry presets: ``seed`` is LogTide's (3 attempts from 100 ms, or whatever
#: MAX_RETRY_ATTEMPTS / BASE_DELAY_MS say); ``langfuse`` is Langfuse's ingestion queue
#: (6 attempts, exponential from 5 s).
RETRY_PRESETS: dict[str, tuple[int, int] | None] = {"seed": None, "langfuse": (6, 5000)}


def retry_policies(
    preset: str,
    attempts: int,
    base_ms: int,
    cap_ms: int,
    by_kind: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, RetryPolicy]:
    """The retry policy of each kind: the preset's (``seed``: ``attempts``/``base_ms``),
    then per-kind overrides. The cap is ``cap_ms``, raised when needed so that the last
    retry of a kind's exponential series is not cut short."""
    fixed = RETRY_PRESETS[preset]
    default = fixed or (attempts, base_ms)
    out = {}
    for kind in KINDS:
        a, b = (by_kind or {}).get(kind, default)
        cap = max(cap_ms, b * 2 ** max(a - 2, 0)) if (fixed or kind in (by_kind or {})) else cap_ms
        out[kind] = RetryPolicy(a, b / 1000, cap / 1000)
    return out


#: Where records came from: ``api`` (the LogTide-shaped routes, the SDK, a direct call)
#: or ``otlp`` (OTLP/HTTP: a collector batched them already).
ORIGINS = ("api", "otlp")
#: Seconds in a UTC day (POSIX time counts every day as exactly this long).
DAY = 86400


def parse_window(text: str) -> tuple[int, int]:
    """``"23:45-00:15"`` -> seconds of the UTC day where the window starts and ends
    (``(85500, 900)``: it wraps past midnight); ``ValueError`` naming what is wrong."""
    start, sep, end = text.strip().partition("-")
    try:
        if not sep:
            raise ValueError
        bounds = []
        for hhmm in (start, end):
            h, colon, m = hhmm.strip().partition(":")
            if not colon or len(m) != 2 or not 0 <= int(h) < 24 or not 0 <= int(m) < 60:
                raise ValueError
            bounds.append(int(h) * 3600 + int(m) * 60)
    except ValueError:
        raise ValueError(f"must look like 23:45-00:15 (HH:MM-HH:MM, UTC); got {text!r}") from None
    if bounds[0] == bounds[1]:
        raise ValueError(f"must start and end at different times; got {text!r}")
    return bounds[0], bounds[1]


def in_window(now: float, window: tuple[int, int]) -> bool:
    """Whether the POSIX time ``now`` falls in ``window`` (seconds of the UTC day,
    start inclusive, end exclusive; a start after the end wraps past midnight)."""
    start, end = window
    t = now % DAY
    if start < end:
        return start <= t < end
    return t >= start or t < end


@dataclass(frozen=True, slots=True)
class DelayPolicy:
    """How long a freshly accepted record waits in the transport before it may be
    flushed (seconds): ``by_kind``, or ``boundary`` when longer and the UTC time is in
    ``window`` (around the date boundary); nothing for records that came through OTLP,
    which a collector batched already. All zero (the default): no delay."""

    by_kind: Mapping[str, float]
    boundary: float = 0.0
    window: tuple[int, int] = (23 * 3600 + 45 * 60, 15 * 60)

    @property
    def active(self) -> bool:
        return self.boundary > 0 or any(v > 0 for v in self.by_kind.values())

    def delay(self, kind: str, origin: str, now: float) -> float:
        """The delay of a ``kind`` record from ``origin`` accepted at POSIX time ``now``."""
        if origin == "otlp":
            return 0.0
        base = self.by_kind.get(kind, 0.0)
        if self.boundary > base and in_window(now, self.window):
            return self.boundary
        return base


class ProjectOverflow:
    """Which projects are moved to the overflow shard for now (``AUTO_OVERFLOW_*``).

    A project is moved when ``failures`` flushes in a row failed for it (a flush fails
    for a project when any of its records did not store) while another project's
    records were stored since the first of those failures: its trouble is its own
    (throttled, rejected), not an outage. It stays ``cooldown`` seconds, then comes back;
    if it still fails it is moved again, after as many failures counted from its return.
    ``clock`` returns seconds (monotonic).
    """

    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float]) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        self.failures = failures
        self.cooldown = cooldown
        self.clock = clock
        self.moved: dict[str, float] = {}  # project -> until
        self._streaks: dict[str, tuple[int, float]] = {}  # project -> (failed flushes, since)
        # The latest store of any project, and the latest of a project other than that one.
        self._latest: tuple[str | None, float] = (None, float("-inf"))
        self._other: tuple[str | None, float] = (None, float("-inf"))
        self._next_expiry = float("inf")

    def _stored_by_other_since(self, project: str) -> float:
        return self._latest[1] if self._latest[0] != project else self._other[1]

    def observe(self, stored: Iterable[str], failed: Iterable[str]) -> list[str]:
        """One flush: the projects all of whose records stored, and those with a record
        that failed. Returns the projects moved now."""
        now = self.clock()
        failed = set(failed)
        for p in set(stored) - failed:
            self._streaks.pop(p, None)
            if self._latest[0] != p:
                self._other = self._latest
            self._latest = (p, now)
        out = []
        for p in sorted(failed):
            if p in self.moved:  # counted again from when it is back
                continue
            n, since = self._streaks.get(p, (0, now))
            n += 1
            if n < self.failures or self._stored_by_other_since(p) < since:
                self._streaks[p] = (n, since)
                continue
            self._streaks.pop(p, None)
            self.moved[p] = until = now + self.cooldown
            self._next_expiry = min(self._next_expiry, until)
            out.append(p)
        return out

    def expire(self) -> list[str]:
        """The projects whose cool-down ran out, taken back (cheap when none is due)."""
        now = self.clock()
        if now < self._next_expiry:
            return []
        back = [p for p, until in self.moved.items() if until <= now]
        for p in back:
            del self.moved[p]
        self._next_expiry = min(self.moved.values(), default=float("inf"))
        return back


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """A flush batch is complete at ``max_size`` records or ``max_age`` seconds after
    the consumer started collecting it, whichever comes first."""

    max_size: int
    max_age: float

    def full(self, count: int) -> bool:
        return count >= self.max_size

    def remaining(self, started: float, now: float) -> float:
        """Seconds left to collect the batch begun at ``started`` (0 when it is due)."""
        return max(0.0, started + self.max_age - now)

    def due(self, count: int, started: float, now: float) -> bool:
        return self.full(count) or self.remaining(started, now) <= 0


def record_id(record: Any) -> str | None:
    """The stable id a record brings (its ``_id``), None when it brings none; raises
    ``ValueError`` when it brings one that is not a non-empty string."""
    rid = record.get("_id") if isinstance(record, Mapping) else None
    if rid is None:
        return None
    if not isinstance(rid, str) or not rid:
        raise ValueError("_id must be a non-empty string (the record's stable id)")
    return rid


def new_entry(
    kind: str, project_id: str, record: Mapping[str, Any], *, now: float | None = None
) -> dict[str, Any]:
    """The envelope the transports carry for one record. Its ``id`` is the record's
    stable id: the record's own ``_id`` when it has one, else a fresh one; it stays the
    same through every retry, requeue, redelivery, DLQ entry and replay."""
    return {
        "id": record_id(record) or IDS.mint(1)[0],
        "kind": kind,
        "project_id": project_id,
        "record": dict(record),
        "attempts": 0,
        "error": None,
        "enqueued_at": time.time() if now is None else now,
    }


def storage_record(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The record of an envelope as an idempotent storage engine gets it: with the
    envelope's id as its ``_id``."""
    rec = entry["record"]
    if rec.get("_id") == entry["id"]:
        return rec
    return {**rec, "_id": entry["id"]}


def dead_entry(
    entry: Mapping[str, Any], shard: int, reason: str, now: float | None = None
) -> dict[str, Any]:
    """The DLQ form of an envelope: the envelope plus where and why it died."""
    out = dict(entry)
    out["shard"] = shard
    out["reason"] = reason
    out["dead_at"] = time.time() if now is None else now
    return out


def replayed_entry(dead: Mapping[str, Any]) -> dict[str, Any]:
    """A dead-lettered envelope made fresh for another round of attempts."""
    out = {k: v for k, v in dead.items() if k not in ("shard", "reason", "dead_at")}
    out["attempts"] = 0
    out["error"] = None
    return out


def result(ingested: int = 0, failed: int = 0, errors: list[Any] | None = None) -> dict[str, Any]:
    """An ingest result: ``{"ingested", "failed", "errors"}``."""
    return {"ingested": ingested, "failed": failed, "errors": list(errors or [])}


@dataclass(slots=True)
class WriteOutcome:
    """How one storage write of ``n`` records went.

    ``failed_indices`` is set when the storage said which records failed (errors carrying
    an ``index``); otherwise only the count is known. ``exception`` is set when the write
    raised, which fails every record.
    """

    n: int
    failed: int
    reason: str | None
    failed_indices: dict[int, str] | None = None
    exception: bool = False

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def total_failure(self) -> bool:
        return self.failed >= self.n


def interpret(n: int, res: Any) -> WriteOutcome:
    """Read a storage result. A result with ``failed > 0`` IS a failure for those
    records; one that is not a mapping, or says nothing, counts every record failed."""
    if not isinstance(res, Mapping) or "failed" not in res and "ingested" not in res:
        return WriteOutcome(n, n, f"storage returned {res!r}, not an ingest result")
    failed = int(res.get("failed") or 0)
    ingested = int(res.get("ingested") or 0)
    if failed == 0 and ingested < n:
        failed = n - ingested  # records unaccounted for are not stored
    errors = list(res.get("errors") or [])
    reason = _first_reason(errors) or (
        f"storage reported {failed} of {n} records failed" if failed else None
    )
    indices: dict[int, str] | None = None
    keyed = [e for e in errors if isinstance(e, Mapping) and isinstance(e.get("index"), int)]
    if failed and keyed and len({e["index"] for e in keyed}) == failed:
        indices = {
            int(e["index"]): str(e.get("error") or e.get("message") or reason) for e in keyed
        }
        if any(not 0 <= i < n for i in indices):
            indices = None
    return WriteOutcome(n, min(failed, n), reason, indices)


def _first_reason(errors: list[Any]) -> str | None:
    for e in errors:
        if isinstance(e, Mapping):
            text = e.get("error") or e.get("message")
            if text:
                return str(text)
        elif e:
            return str(e)
    return None


def exception_outcome(n: int, exc: BaseException) -> WriteOutcome:
    return WriteOutcome(n, n, f"{type(exc).__name__}: {exc}", None, exception=True)


def split(items: list[Any]) -> tuple[list[Any], list[Any]]:
    mid = len(items) // 2
    return items[:mid], items[mid:]
