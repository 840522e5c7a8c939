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
- **hostile neighbour**, per mode: one steady open-loop load of 50 requests/s of 10
  records for ``hostile_duration`` seconds while the hostile clients of :mod:`._hostile`
  are switched on and off in alternate windows (quiet, hostile, quiet, ...); the good
  traffic's p99 over the pooled hostile windows within 2x its p99 over the pooled quiet
  ones. Both kinds of window share the machine's drift (a busy minute falls on both), and
  each quiet/hostile pair's ratio says how much the figure moves within the run.

``parts`` runs only some of them (``--only``): ``capacity`` (the capacity search and the
overload at twice it) and ``hostile``.
"""

from __future__ import annotations

import bisect
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._hostile import Alternating, HealthProbe
from ._stats import Sample, load_summary

CAPACITY_BATCH = 100
#: Targets: the API process's and the store's CPU per record at capacity (µs), and the
#: hostile neighbour's bound on the good traffic's p99 (hostile windows over quiet ones).
API_CPU_TARGET_US = 30.0
STORE_CPU_TARGET_US = 25.0
HOSTILE_RATIO_TARGET = 2.0
CAPACITY_P95_MS = 250.0
HEALTH_MS = 100.0
GOOD_RATE = 50.0
GOOD_BATCH = 10
#: The service's default BUCKETQ_INGEST_TIMEOUT_MS (the overload bound is twice it).
INGEST_TIMEOUT_MS = 5000
#: The generator's connections in the overload run (below the service's cap of 512, so
#: the health probe's connection is never the one over it).
OVERLOAD_CONNECTIONS = 400
#: The parts of ``--limits`` (``--only``): the capacity search with the overload at
#: twice it, and the hostile neighbour.
PARTS = ("capacity", "hostile")
#: Seconds of one quiet or hostile window of the hostile neighbour (shorter when the run
#: is too short for two pairs of them).
HOSTILE_WINDOW = 5.0
#: The hostile clients' cases, and what each counts when it goes (a request sent, a
#: connection opened).
HOSTILE_CASES = {"huge": "sent", "deep": "sent", "otlp": "sent", "silent": "opened",
                 "slow": "opened"}  # fmt: skip


@dataclass
class LimitSettings:
    modes: tuple[str, ...]
    step_duration: float = 10.0
    start_rate: float = 10.0
    min_rate: float = 1.0
    max_rate: float = 1280.0
    overload_duration: float = 30.0
    #: Seconds of good traffic, half of it beside the hostile clients.
    hostile_duration: float = 60.0
    parts: tuple[str, ...] = PARTS
    #: Below 1: smaller hostile cases (tests only; see :class:`._hostile.Hostile`).
    hostile_scale: float = 1.0

    @classmethod
    def for_run(
        cls,
        modes: tuple[str, ...],
        quick: bool,
        *,
        parts: Sequence[str] | None = None,
        hostile_duration: float | None = None,
        hostile_scale: float = 1.0,
    ) -> LimitSettings:
        st = (
            cls(modes, step_duration=5.0, overload_duration=10.0, hostile_duration=20.0)
            if quick
            else cls(modes)
        )
        st.parts = tuple(p for p in PARTS if p in (parts or PARTS))
        st.hostile_duration = hostile_duration or st.hostile_duration
        st.hostile_scale = hostile_scale
        return st

    @property
    def hostile_window(self) -> float:
        """At most :data:`HOSTILE_WINDOW`, at least two quiet/hostile pairs."""
        return min(HOSTILE_WINDOW, self.hostile_duration / 4)


#: ``run_one(mode, rate, duration, batch, **run_mode options)``: one run's result.
RunOne = Callable[..., dict[str, Any]]


def answers_sustained(load: dict[str, Any]) -> bool:
    """The part of :func:`sustained` the answers alone decide: a run that fails it is
    not sustained whatever is stored, so it is not waited for storage to catch up
    (that wait would be most of a failed step's time in the buffer modes)."""
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
        "store_cpu_us_per_record": r.get("store_cpu_us_per_record"),
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
        "store_cpu_us_per_record": None if good is None else good["store_cpu_us_per_record"],
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


def hostile(run_one: RunOne, mode: str, st: LimitSettings) -> dict[str, Any]:
    """The hostile neighbour in ``mode``: one good load throughout, the hostile clients
    in alternate windows; the figures of :func:`hostile_figures`."""
    side = functools.partial(Alternating, window=st.hostile_window, scale=st.hostile_scale)
    t0 = time.monotonic()
    r = run_one(mode, GOOD_RATE, st.hostile_duration, GOOD_BATCH, side=side, keep_samples=True)
    out = {"mode": mode, "good_rate": GOOD_RATE, "duration_s": st.hostile_duration,
           **hostile_figures(r["samples"], r["t0"], r["side"], GOOD_BATCH),
           "stored_ok": r["stored_ok"], "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    return out


def _kind(summary: dict[str, Any]) -> dict[str, Any]:
    lat = summary["latency"]
    return {"requests": summary["requests"], "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"],
            "max_ms": lat["max_ms"], "errors": summary["errors"],
            "errors_by_kind": summary["errors_by_kind"], "lag_p99_ms": summary["lag"]["p99_ms"],
            "late_requests": summary["late_requests"],
            "kept_schedule": summary["kept_schedule"]}  # fmt: skip


def hostile_figures(
    samples: Sequence[Sample], t0: float, side: dict[str, Any], batch: int
) -> dict[str, Any]:
    """The good traffic's figures per kind of window (pure). Each request belongs to the
    window its *scheduled* send time fell in (``t0`` + its offset, against the windows'
    ``time.monotonic()`` bounds), so a request delayed by a hostile window counts there
    however late it was answered. Only whole pairs count (a quiet window and the hostile
    one after it, both with requests), so the two kinds have as many windows. ``ratio``:
    the pooled hostile windows' p99 over the pooled quiet ones'; ``pairs``: each pair's
    two p99s and their ratio, the spread within the run."""
    windows = [w for w in side["windows"] if w["end"] > w["start"]]
    starts = [w["start"] for w in windows]
    per: list[list[Sample]] = [[] for _ in windows]
    for s in samples:
        at = t0 + s.scheduled
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < windows[i]["end"]:
            per[i].append(s)
    # whole quiet/hostile pairs only: a window cut short by the load's end is left out
    used: list[tuple[dict[str, Any], list[Sample]]] = []
    pairs = []
    both = list(zip(windows, per, strict=True))
    for (wa, sa), (wh, sh) in zip(both, both[1:], strict=False):
        if wa["kind"] == "alone" and wh["index"] == wa["index"] + 1 and sa and sh:
            used += [(wa, sa), (wh, sh)]
            a = load_summary(sa, batch)["latency"]["p99_ms"]
            h = load_summary(sh, batch)["latency"]["p99_ms"]
            pairs.append({"alone_p99_ms": a, "hostile_p99_ms": h,
                          "ratio": h / a if a and h is not None else None,
                          "requests": [len(sa), len(sh)], "load1": wa["load1"]})  # fmt: skip
    pooled = {k: [s for w, ss in used if w["kind"] == k for s in ss] for k in ("alone", "hostile")}
    kinds = {k: _kind(load_summary(v, batch)) for k, v in pooled.items()}
    p99 = {k: v["p99_ms"] for k, v in kinds.items()}
    ratios = [p["ratio"] for p in pairs if p["ratio"] is not None]
    hostile_windows = [w for w, _ in used if w["kind"] == "hostile"]
    sent_quiet = sum(sum(w["hostile_sent"].values()) for w, _ in used if w["kind"] == "alone")
    every_case = [w for w in hostile_windows
                  if all(w["hostile_sent"].get(f"{c} {what}") for c, what in HOSTILE_CASES.items())]  # fmt: skip
    loads = [w["load1"] for w, _ in used]
    return {
        "window_s": side["window_s"],
        "windows": {k: sum(1 for w, _ in used if w["kind"] == k) for k in ("alone", "hostile")},
        "alone": kinds["alone"],
        "beside": kinds["hostile"],
        "ratio": None if not p99["alone"] or p99["hostile"] is None
        else p99["hostile"] / p99["alone"],
        "pairs": pairs,
        "pair_ratio": None if not ratios else {"min": min(ratios), "median": statistics.median(ratios),
                                               "max": max(ratios)},
        "hostile_windows_with_every_case": len(every_case),
        "hostile_sent_in_quiet_windows": sent_quiet,
        "hostile_quiet_after_each_window": all(w["quiesced"] for w in hostile_windows),
        "hostile_sent": {c: sum(w["hostile_sent"].get(f"{c} {what}", 0) for w in hostile_windows)
                         for c, what in HOSTILE_CASES.items()},
        "hostile_answers": side["answers"],
        "load1": None if not loads else [min(loads), max(loads)],
    }  # fmt: skip


def run_limits(run_one: RunOne, st: LimitSettings, say: Callable[[str], None]) -> dict[str, Any]:
    """Every run, in order; ``say`` prints each figure beside its target as it comes."""
    import os

    t0 = time.monotonic()
    out: dict[str, Any] = {"capacity": {}, "overload": {}, "hostile": {},
                           "load_average_start": os.getloadavg()}  # fmt: skip
    for mode in st.modes if "capacity" in st.parts else ():
        c = out["capacity"][mode] = capacity(run_one, mode, st)
        cpu, store = c["api_cpu_us_per_record"], c["store_cpu_us_per_record"]
        say(f"capacity {mode}: {c['records_per_s'] or 0:,.0f} records/s sustained at 100 per "
            f"request (p95 < {CAPACITY_P95_MS:g} ms); API CPU "
            f"{'-' if cpu is None else f'{cpu:.1f}'} µs/record (target ≤ {API_CPU_TARGET_US:g}), "
            f"store CPU {'-' if store is None else f'{store:.1f}'} µs/record (target ≤ "
            f"{STORE_CPU_TARGET_US:g}) "
            f"[load {_load()}]")  # fmt: skip
        base, layout = mode.partition("@")[0], mode.partition("@")[2]
        old = out["capacity"].get(f"{base}@documents") if not layout else None
        new = out["capacity"].get(base) if layout == "documents" else None
        pair = (c, old) if old else (new, c) if new else None
        if pair and pair[0]["records_per_s"] and pair[1]["records_per_s"]:
            n, o = pair
            say(f"layouts {base}: buckets {n['records_per_s']:,.0f} records/s against documents "
                f"{o['records_per_s']:,.0f} ({n['records_per_s'] / o['records_per_s']:.1f}x); store CPU "
                f"{n['store_cpu_us_per_record'] or 0:.1f} against {o['store_cpu_us_per_record'] or 0:.1f} "
                f"µs/record; API CPU {n['api_cpu_us_per_record'] or 0:.1f} against "
                f"{o['api_cpu_us_per_record'] or 0:.1f}")  # fmt: skip
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
    for mode in st.modes if "hostile" in st.parts else ():
        say(hostile_line(out["hostile"].setdefault(mode, hostile(run_one, mode, st))))
    out["seconds"] = time.monotonic() - t0
    out["load_average_end"] = os.getloadavg()
    return out


def hostile_ok(ratio: float | None) -> bool:
    """Is the hostile neighbour's ``ratio`` within its target?"""
    return ratio is not None and ratio <= HOSTILE_RATIO_TARGET


def hostile_line(hn: dict[str, Any]) -> str:
    """The hostile neighbour's figures beside its target, in one line."""

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    def x(r: float | None) -> str:
        return "-" if r is None else f"x{r:.2f}"

    a, b, ratio, pr = hn["alone"], hn["beside"], hn["ratio"], hn["pair_ratio"]
    n = hn["windows"]
    spread = "-" if pr is None else f"{x(pr['min'])}-{x(pr['max'])}, median {x(pr['median'])}"
    load = "-" if hn["load1"] is None else "-".join(f"{v:.1f}" for v in hn["load1"])
    return (f"hostile neighbour {hn['mode']}: good traffic ({hn['good_rate']:g} req/s throughout) "
            f"p99 {ms(a['p99_ms'])} ms over {n['alone']} quiet windows, {ms(b['p99_ms'])} ms over "
            f"{n['hostile']} hostile ones ({hn['window_s']:g} s each, alternating; {x(ratio)}, "
            f"target ≤ {HOSTILE_RATIO_TARGET:g}) {_ok(hostile_ok(ratio))}; per quiet/hostile pair "
            f"{spread}; good errors {a['errors']} quiet, {b['errors']} hostile; generator lag "
            f"p99 {ms(a['lag_p99_ms'])} / {ms(b['lag_p99_ms'])} ms "
            f"{_ok(a['kept_schedule'] and b['kept_schedule'])}; every hostile case ran in "
            f"{hn['hostile_windows_with_every_case']} of {n['hostile']} hostile windows, sent "
            f"{hn['hostile_sent_in_quiet_windows']} in quiet ones; hostile sent "
            f"{hn['hostile_sent']}, answered {hn['hostile_answers']}; 1-min load over the "
            f"windows {load} [load {_load()}]")  # fmt: skip


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
