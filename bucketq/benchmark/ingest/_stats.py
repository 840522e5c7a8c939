"""The arithmetic of ``bucketq bench ingest`` (pure: no I/O, no clock): the open-loop
schedule, percentiles, a mode's figures from the raw samples, the sweep's decisions,
and the targets the figures are held against."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The modes, in the order they run and are shown.
MODES = ("off", "memory", "redis", "bucketq", "passthrough")

#: Defaults of a run: the seed's k6 scenario (100 requests/s of 10 logs for 3 minutes).
DEFAULT_RATE = 100.0
DEFAULT_BATCH = 10
DEFAULT_DURATION = 180.0
DEFAULT_QUICK_DURATION = 30.0
#: The sweep: seconds of load per rate, and where it stops at the latest.
DEFAULT_SWEEP_DURATION = 20.0
DEFAULT_QUICK_SWEEP_DURATION = 10.0
DEFAULT_SWEEP_MAX_RATE = 6400.0
#: A rate is sustained while p95 stays at or under this (seconds) with no errors.
SWEEP_P95_LIMIT = 1.0
#: The generator kept its schedule when its p99 lag (send start - scheduled time) stayed
#: under this many seconds; otherwise the report says it fell behind. (Above the
#: scheduler's jitter on a shared machine.)
LAG_LIMIT = 0.050

#: The seed's published p95 (ms) at 100 requests/s x 10 logs for 3 minutes (k6), per
#: storage and mode; None where it published none.
SEED_P95_MS: dict[str, dict[str, float | None]] = {
    "TimescaleDB": {"off": 2471.0, "memory": 24.0, "redis": 623.0},
    "MongoDB": {"off": 675.0, "memory": 844.0, "redis": 756.0},
}


#: Over this share of failed requests (timeouts, 503s), a mode's p95 is not the latency of
#: accepted requests, and the p95 targets say "not comparable" rather than met or missed.
CENSORED_SHARE = 0.05


def schedule(rate: float, duration: float) -> list[float]:
    """Scheduled send times (seconds from the start) of a constant arrival rate: request
    ``i`` at ``i / rate``, every one that falls before ``duration``."""
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number of requests per second, not {rate!r}")
    if duration <= 0 or not math.isfinite(duration):
        raise ValueError(f"duration must be a positive number of seconds, not {duration!r}")
    n = math.ceil(rate * duration - 1e-9)
    return [i / rate for i in range(n)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by nearest rank of the sorted ``values``; None when
    empty. Nearest rank never invents a value that was not measured."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(s)))
    return s[min(rank, len(s)) - 1]


def latency_summary(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99/max and the count, in milliseconds, of latencies in seconds."""
    s = sorted(values)

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000.0

    return {
        "n": len(s),
        "p50_ms": ms(percentile(s, 50)),
        "p95_ms": ms(percentile(s, 95)),
        "p99_ms": ms(percentile(s, 99)),
        "max_ms": ms(s[-1] if s else None),
    }


@dataclass
class Sample:
    """One request as the generator saw it: its number, scheduled time and the time it
    was actually sent (seconds from the run's start), when its answer arrived (seconds
    from the start; None if none did), the HTTP status (0 if none) and the error."""

    seq: int
    scheduled: float
    sent: float
    done: float | None
    status: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def latency(self) -> float | None:
        """From the scheduled send time, so a stalled server cannot hide its queueing."""
        return None if self.done is None else self.done - self.scheduled

    @property
    def lag(self) -> float:
        return self.sent - self.scheduled


def load_summary(samples: Sequence[Sample], batch: int) -> dict[str, Any]:
    """Request latency (every answered request, errors included, from its schedule), the
    errors by kind, the records accepted, and how well the generator kept its schedule."""
    lat = [s.latency for s in samples if s.latency is not None]
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            kind = s.error or f"HTTP {s.status}"
            errors[kind] = errors.get(kind, 0) + 1
    lags = [s.lag for s in samples]
    lag = latency_summary(lags)
    p99_lag = percentile(lags, 99)
    return {
        "requests": len(samples),
        "ok": sum(1 for s in samples if s.ok),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "records_accepted": batch * sum(1 for s in samples if s.ok),
        "latency": latency_summary(lat),
        "lag": lag,
        "late_requests": sum(1 for x in lags if x > LAG_LIMIT),
        "kept_schedule": p99_lag is None or p99_lag <= LAG_LIMIT,
    }


def end_to_end(
    accepted_at: Mapping[int, float], seen: Iterable[tuple[int, int, float]]
) -> list[float]:
    """Per record seen in storage (request number, record index, when it was seen), the
    seconds from its request's acceptance to then; a record visible before its answer
    arrived counts 0. Records of requests that were not accepted, and a record seen
    again (a duplicate), are left out."""
    out = []
    done: set[tuple[int, int]] = set()
    for seq, rec, t in seen:
        a = accepted_at.get(seq)
        if a is not None and (seq, rec) not in done:
            done.add((seq, rec))
            out.append(max(0.0, t - a))
    return out


def reconcile(
    accepted: Iterable[int], batch: int, seen: Iterable[tuple[int, int, float]]
) -> dict[str, int]:
    """What storage holds against what was answered 200: records of accepted requests
    never seen (``lost``), records seen twice or more (``duplicates``), and records of
    requests that were not accepted (a timeout or an error) that were stored anyway
    (``stored_unacknowledged``)."""
    ok = set(accepted)
    pairs: dict[tuple[int, int], int] = {}
    for seq, rec, _ in seen:
        pairs[(seq, rec)] = pairs.get((seq, rec), 0) + 1
    seen_ok = sum(1 for (seq, _) in pairs if seq in ok)
    return {
        "lost": batch * len(ok) - seen_ok,
        "duplicates": sum(n - 1 for n in pairs.values()),
        "stored_unacknowledged": sum(1 for (seq, _) in pairs if seq not in ok),
    }


def per_thousand(count: float, records: int) -> float | None:
    return None if records <= 0 else 1000.0 * count / records


@dataclass
class SweepStep:
    rate: float
    p95_ms: float | None
    errors: int
    stored_ok: bool
    kept_schedule: bool

    @property
    def sustained(self) -> bool:
        return (
            self.p95_ms is not None
            and self.p95_ms <= SWEEP_P95_LIMIT * 1000.0
            and self.errors == 0
            and self.stored_ok
        )


def next_sweep_rate(steps: Sequence[SweepStep], max_rate: float) -> float | None:
    """The rate to try next (double the last), or None when the sweep is over: the last
    rate was not sustained, the generator could not keep its schedule (the figure is
    then a floor), or the next would pass ``max_rate``."""
    if not steps:
        return None
    last = steps[-1]
    if not last.sustained or not last.kept_schedule or last.rate * 2 > max_rate:
        return None
    return last.rate * 2


@dataclass
class SweepResult:
    steps: list[SweepStep] = field(default_factory=list)

    @property
    def highest_sustained(self) -> float | None:
        ok = [s.rate for s in self.steps if s.sustained]
        return max(ok) if ok else None

    @property
    def limited_by(self) -> str:
        """Why the sweep stopped: the server, the generator, or the rate cap."""
        if not self.steps:
            return "no steps"
        last = self.steps[-1]
        if not last.sustained:
            why = []
            if last.p95_ms is None or last.p95_ms > SWEEP_P95_LIMIT * 1000.0:
                why.append("p95 over 1 s")
            if last.errors:
                why.append(f"{last.errors} errors")
            if not last.stored_ok:
                why.append("stored != accepted")
            return ", ".join(why)
        if not last.kept_schedule:
            return "the generator fell behind (the figure is a floor)"
        return "the rate cap"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def targets(modes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The targets of the ingest service's benchmark, each with the figures it was judged
    on and whether it was met (None when a mode it needs did not run)."""

    def p95(m: str) -> float | None:
        """None when the mode did not run, or when over 5% of its requests failed: its
        p95 is then the client's timeout or a quick refusal, not the latency of an
        accepted request."""
        r = modes.get(m)
        if r is None:
            return None
        ld = r["load"]
        if ld["errors"] > CENSORED_SHARE * ld["requests"]:
            return None
        return ld["latency"]["p95_ms"]

    def of_ratio(
        target: str,
        a: tuple[str, float | None],
        b: tuple[str, float | None],
        met: Callable[[float], bool],
    ) -> dict[str, Any]:
        """A target on ``a / b`` (each a figure's name and value)."""
        r = ratio(a[1], b[1])
        return {"target": target, "figures": {a[0]: a[1], b[0]: b[1], "ratio": r},
                "met": None if r is None else met(r)}  # fmt: skip

    bq, mem, off = p95("bucketq"), p95("memory"), p95("off")
    out = [
        of_ratio("bucketq transport p95 <= 1.5x memory p95",
                 ("bucketq_p95_ms", bq), ("memory_p95_ms", mem), lambda r: r <= 1.5),
        of_ratio("bucketq transport p95 <= 1/10 of buffer-off p95",
                 ("bucketq_p95_ms", bq), ("off_p95_ms", off), lambda r: r <= 0.1),
    ]  # fmt: skip
    errs = {m: r["load"]["errors"] for m, r in modes.items()}
    out.append({"target": "zero errors", "figures": errs,
                "met": None if not errs else not any(errs.values())})  # fmt: skip
    stored = {m: r["stored_ok"] for m, r in modes.items()}
    out.append({"target": "stored = accepted in every mode", "figures": stored,
                "met": None if not stored else all(stored.values())})  # fmt: skip
    per_req = (modes.get("bucketq") or {}).get("commands_per_request")
    out.append({
        "target": "MongoDB commands per request on the bucketq transport well under one",
        "figures": {"bucketq_commands_per_request": per_req},
        "met": None if per_req is None else per_req < 0.5,
    })  # fmt: skip
    sweep = {m: (r.get("sweep") or {}).get("highest_sustained_rate") for m, r in modes.items()}
    out.append(of_ratio("highest sustained rate with the bucketq transport >= 5x buffer off",
                        ("bucketq_rate", sweep.get("bucketq")), ("off_rate", sweep.get("off")),
                        lambda r: r >= 5))  # fmt: skip
    return out
