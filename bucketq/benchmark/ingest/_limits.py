"""``bucketq bench ingest --limits``: the service at and past its limits, each figure
printed beside its target.

- **capacity**, per mode: 100 records per request, the rate doubled from ``start_rate``
  while the run is sustained (no error, p95 under 250 ms, every accepted record stored,
  the generator on schedule), or halved until it is, then once halfway between the last
  sustained rate and the first that was not; the highest sustained records/s and the
  API process's CPU per record at it.
- **overload**, per mode: ``overload_duration`` seconds at twice that capacity: every
  request answered within 2 x ``BUCKETQ_INGEST_TIMEOUT_MS``, the excess as 503/429 with
  ``Retry-After``, stored = accepted, ``/health`` answering within 100 ms throughout;
  beside it, the service's event loop (``bucketq_event_loop_*``): how late its timers
  ran and what the lateness went to (the loop's own work, other threads, or the CPU
  taken by other processes).
- **hostile neighbour** (buffer off): 50 requests/s of 10 records, once alone and once
  beside the hostile clients of :mod:`._hostile`; the good traffic's p99 beside them
  within 2x its p99 alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._hostile import HealthProbe, Hostile

CAPACITY_BATCH = 100
CAPACITY_P95_MS = 250.0
HEALTH_MS = 100.0
GOOD_RATE = 50.0
GOOD_BATCH = 10
#: The service's default BUCKETQ_INGEST_TIMEOUT_MS (the overload bound is twice it).
INGEST_TIMEOUT_MS = 5000
#: The generator's connections in the overload run (below the service's cap of 512, so
#: the health probe's connection is never the one over it).
OVERLOAD_CONNECTIONS = 400


@dataclass
class LimitSettings:
    modes: tuple[str, ...]
    step_duration: float = 10.0
    start_rate: float = 10.0
    min_rate: float = 1.0
    max_rate: float = 1280.0
    overload_duration: float = 30.0
    hostile_duration: float = 30.0

    @classmethod
    def for_run(cls, modes: tuple[str, ...], quick: bool) -> LimitSettings:
        if quick:
            return cls(modes, step_duration=5.0, overload_duration=10.0, hostile_duration=10.0)
        return cls(modes)


#: ``run_one(mode, rate, duration, batch, **run_mode options)``: one run's result.
RunOne = Callable[..., dict[str, Any]]


def answers_sustained(load: dict[str, Any]) -> bool:
    """The part of :func:`sustained` the answers alone decide: a run that fails it is
    not sustained whatever is stored, so it is not waited for storage to catch up
    (measured: that wait was most of a failed step's time in the buffer modes)."""
    p95 = load["latency"]["p95_ms"]
    return (
        load["errors"] == 0 and p95 is not None and p95 < CAPACITY_P95_MS and load["kept_schedule"]
    )


def sustained(r: dict[str, Any]) -> bool:
    return answers_sustained(r["load"]) and r["stored_ok"]


def _step(r: dict[str, Any], wall_s: float) -> dict[str, Any]:
    return {
        "rate": r["rate"],
        "records_per_s": r["rate"] * r["batch"],
        "p95_ms": r["load"]["latency"]["p95_ms"],
        "errors": r["load"]["errors"],
        "errors_by_kind": r["load"]["errors_by_kind"],
        "stored_ok": r["stored_ok"],
        "kept_schedule": r["load"]["kept_schedule"],
        "api_cpu_us_per_record": cpu_per_record(r),
        "sustained": sustained(r),
        # where the time goes: the load itself, then storing what was accepted
        "wall_s": round(wall_s, 1),
        "drain_s": round(r.get("end_to_end", {}).get("drain_wait_s") or 0.0, 1),
    }


def _timed(run_one: RunOne, *args: Any, **kw: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    r = run_one(*args, **kw)
    return _step(r, time.monotonic() - t0)


def cpu_per_record(r: dict[str, Any]) -> float | None:
    n = r["load"]["records_accepted"]
    return None if not n or r["api_cpu_s"] is None else 1e6 * r["api_cpu_s"] / n


def capacity(run_one: RunOne, mode: str, st: LimitSettings) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    good: dict[str, Any] | None = None
    bad_rate: float | None = None
    rate = st.start_rate
    # up (doubling) from the start while sustained, or down (halving) until it is
    while st.min_rate <= rate <= st.max_rate:
        steps.append(_timed(run_one, mode, rate, st.step_duration, CAPACITY_BATCH,
                            settle=answers_sustained))  # fmt: skip
        if steps[-1]["sustained"]:
            good = steps[-1]
            if bad_rate is not None:
                break
            rate *= 2
        else:
            bad_rate = rate
            if good is not None:
                break
            rate /= 2
    if good is not None and bad_rate is not None:
        mid = (good["rate"] + bad_rate) / 2
        steps.append(_timed(run_one, mode, mid, st.step_duration, CAPACITY_BATCH,
                            settle=answers_sustained))  # fmt: skip
        if steps[-1]["sustained"]:
            good = steps[-1]
    return {
        "mode": mode,
        "steps": steps,
        "rate": None if good is None else good["rate"],
        "records_per_s": None if good is None else good["records_per_s"],
        "api_cpu_us_per_record": None if good is None else good["api_cpu_us_per_record"],
        "limited_by": "max_rate" if bad_rate is None else "p95, errors or storage",
        "seconds": round(sum(x["wall_s"] for x in steps), 1),
    }


def overload(run_one: RunOne, mode: str, rate: float, st: LimitSettings) -> dict[str, Any]:
    t0 = time.monotonic()
    r = run_one(mode, rate, st.overload_duration, CAPACITY_BATCH,
                side=HealthProbe, max_connections=OVERLOAD_CONNECTIONS)  # fmt: skip
    wall = time.monotonic() - t0
    load = r["load"]
    kinds = load["errors_by_kind"]
    refused = sum(n for k, n in kinds.items() if k in ("HTTP 503", "HTTP 429"))
    health = r["side"]
    bound = 2 * INGEST_TIMEOUT_MS
    return {
        "mode": mode,
        "rate": rate,
        "requests": load["requests"],
        "accepted": load["ok"],
        "refused": refused,
        "other_errors": {k: n for k, n in kinds.items() if k not in ("HTTP 503", "HTTP 429")},
        "refused_without_retry_after": r["refused_without_retry_after"],
        "max_ms": load["latency"]["max_ms"],
        "p95_ms": load["latency"]["p95_ms"],
        "stored_ok": r["stored_ok"],
        "records_stored": r["records_stored"],
        "records_accepted": load["records_accepted"],
        "health": health,
        "answered_in_time": load["latency"]["max_ms"] is not None
        and load["latency"]["max_ms"] <= bound
        and load["latency"]["n"] == load["requests"],
        "seconds": round(wall, 1),
        "drain_s": round(r.get("end_to_end", {}).get("drain_wait_s") or 0.0, 1),
        "health_in_time": health["max_ms"] is not None
        and health["max_ms"] <= HEALTH_MS
        and not health["failures"],
    }


def hostile(run_one: RunOne, st: LimitSettings) -> dict[str, Any]:
    alone = run_one("off", GOOD_RATE, st.hostile_duration, GOOD_BATCH)
    beside = run_one("off", GOOD_RATE, st.hostile_duration, GOOD_BATCH, side=Hostile)
    p99_alone = alone["load"]["latency"]["p99_ms"]
    p99_beside = beside["load"]["latency"]["p99_ms"]
    return {
        "good_rate": GOOD_RATE,
        "alone": {"p50_ms": alone["load"]["latency"]["p50_ms"], "p99_ms": p99_alone,
                  "errors": alone["load"]["errors"]},
        "beside": {"p50_ms": beside["load"]["latency"]["p50_ms"], "p99_ms": p99_beside,
                   "errors": beside["load"]["errors"],
                   "errors_by_kind": beside["load"]["errors_by_kind"]},
        "hostile_answers": beside["side"],
        "ratio": None if not p99_alone or p99_beside is None else p99_beside / p99_alone,
    }  # fmt: skip


def run_limits(run_one: RunOne, st: LimitSettings, say: Callable[[str], None]) -> dict[str, Any]:
    """Every run, in order; ``say`` prints each figure beside its target as it comes."""
    import os

    t0 = time.monotonic()
    out: dict[str, Any] = {"capacity": {}, "overload": {}, "load_average_start": os.getloadavg()}
    for mode in st.modes:
        c = out["capacity"][mode] = capacity(run_one, mode, st)
        cpu = c["api_cpu_us_per_record"]
        say(f"capacity {mode}: {c['records_per_s'] or 0:,.0f} records/s sustained at 100 per "
            f"request (p95 < {CAPACITY_P95_MS:g} ms); API CPU "
            f"{'-' if cpu is None else f'{cpu:.1f}'} µs/record (target ≤ 30) "
            f"[load {_load()}]")  # fmt: skip
        if c["rate"]:
            o = out["overload"][mode] = overload(run_one, mode, 2 * c["rate"], st)
            h = o["health"]
            say(f"overload {mode} at {o['rate']:g} req/s (2x): answered within "
                f"{(o['max_ms'] or 0) / 1000:.2f} s (target ≤ {2 * INGEST_TIMEOUT_MS / 1000:g} s) "
                f"{_ok(o['answered_in_time'])}; accepted {o['accepted']}, refused {o['refused']} "
                f"(without Retry-After: {o['refused_without_retry_after']}, target 0), other errors "
                f"{o['other_errors'] or 0}; stored = accepted {_ok(o['stored_ok'])}; /health max "
                f"{h['max_ms'] or 0:.1f} ms (target ≤ {HEALTH_MS:g}), failures {h['failures'] or 0} "
                f"{_ok(o['health_in_time'])}; event loop {_loop(h.get('event_loop'))} "
                f"[load {_load()}]")  # fmt: skip
            say(f"time {mode}: capacity search {c['seconds']:g} s ({len(c['steps'])} runs, "
                f"storing after the load {sum(x['drain_s'] for x in c['steps']):g} s of it), "
                f"overload {o['seconds']:g} s (storing {o['drain_s']:g} s)")  # fmt: skip
    hn = out["hostile"] = hostile(run_one, st)
    ratio = hn["ratio"]
    say(f"hostile neighbour: good traffic p99 {hn['alone']['p99_ms'] or 0:.1f} ms alone, "
        f"{hn['beside']['p99_ms'] or 0:.1f} ms beside the hostile clients "
        f"(x{'-' if ratio is None else f'{ratio:.2f}'}; target ≤ 2) "
        f"{_ok(ratio is not None and ratio <= 2)}; good errors beside: {hn['beside']['errors']}; "
        f"hostile answers {hn['hostile_answers']} [load {_load()}]")  # fmt: skip
    out["seconds"] = time.monotonic() - t0
    out["load_average_end"] = os.getloadavg()
    return out


def _loop(e: dict[str, Any] | None) -> str:
    """The overload's event-loop figures in a few words."""
    if not e or not e.get("available"):
        return "not measured"
    late = ", ".join(f"{k} {v:g} s" for k, v in sorted(e["late_s"].items())) or "none"
    worst = "-" if e["max_le_ms"] is None else f"≤ {e['max_le_ms']:g} ms"
    return (f"late over 100 ms {e['over_100ms']} of {e['samples']} looks (latest {worst}); "
            f"lateness by cause: {late}")  # fmt: skip


def _ok(flag: bool) -> str:
    return "✓" if flag else "✗"


def _load() -> str:
    import os

    return " ".join(f"{x:.1f}" for x in os.getloadavg())
