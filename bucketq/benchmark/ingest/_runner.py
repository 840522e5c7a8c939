"""Runs ``bucketq bench ingest``: every mode, one after the other, against one MongoDB
server (the embedded one the benchmark starts, or the URI given), then the sweep.

One mode = a fresh database (storage, keys and the ``bucketq`` transport's queues) and,
for ``redis``, a fresh stream prefix; a ``bucketq serve`` process with the mode's
environment on a free loopback port; a key from ``bucketq keys create``; a change
stream on the storage; the open-loop load from its own process; then a wait until
every accepted record is visible in storage (or ``drain_timeout``), SIGTERM (the
graceful drain), and the count of what storage holds. The figures of a mode are
assembled by the pure functions of ``_stats``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ... import _validate as v
from ...errors import ConfigurationError
from ._load import DEFAULT_MAX_CONNECTIONS, LoadProcess, LoadSpec
from ._observe import LOGS_COLLECTION, Observer, StorageWatcher, counters_delta
from ._serve import ServeProcess, cpu_seconds
from ._stats import (
    DEFAULT_BATCH,
    DEFAULT_DURATION,
    DEFAULT_QUICK_DURATION,
    DEFAULT_QUICK_SWEEP_DURATION,
    DEFAULT_RATE,
    DEFAULT_SWEEP_DURATION,
    DEFAULT_SWEEP_MAX_RATE,
    MODES,
    SweepResult,
    SweepStep,
    end_to_end,
    latency_summary,
    load_summary,
    next_sweep_rate,
    per_thousand,
    reconcile,
    schedule,
    targets,
)

log = logging.getLogger("bucketq.benchmark")

#: Seconds to wait after the load for every accepted record to be visible in storage.
DEFAULT_DRAIN_TIMEOUT = 60.0
#: The project the benchmark's key belongs to.
PROJECT = "bench"
#: Where the PNG goes unless ``plots_dir`` says otherwise.
DEFAULT_PLOTS_DIR = "bench-results"
SCHEMA = "bucketq-bench-ingest/1"

_BUFFER = "RESERVOIR_BUFFER_"
#: The modes ``--limits`` measures unless ``--mode`` says otherwise.
LIMIT_MODES = ("off", "memory", "redis", "bucketq")


#: ``--layout``: how the service stores log records; a mode run with the earlier layout
#: is named ``<mode>@documents``.
LAYOUTS = ("buckets", "documents")


def split_mode(mode: str) -> tuple[str, str]:
    """``"memory@documents"`` -> ``("memory", "documents")``; no ``@``: the buckets layout."""
    base, _, layout = mode.partition("@")
    return base, layout or "buckets"


def mode_env(mode: str, *, uri: str, database: str, prefix: str, redis_url: str) -> dict[str, str]:
    """The environment of ``bucketq serve`` for ``mode``."""
    mode, layout = split_mode(mode)
    if mode not in MODES or layout not in LAYOUTS:
        raise ConfigurationError(f"mode must be one of {', '.join(MODES)}; got {mode!r}.")
    env = {
        "BUCKETQ_LOG_LAYOUT": layout,
        v.MONGODB_URI_ENV: uri,
        "BUCKETQ_DATABASE": database,
        _BUFFER + "ENABLED": "false" if mode == "off" else "true",
        _BUFFER + "STREAM_PREFIX": prefix,
    }
    if mode != "off":
        env[_BUFFER + "TRANSPORT"] = mode
    if mode == "redis":
        env["REDIS_URL"] = redis_url
    return env


@dataclass
class Settings:
    quick: bool
    rate: float
    duration: float
    batch: int
    modes: tuple[str, ...]
    sweep: bool
    sweep_duration: float
    sweep_max_rate: float
    drain_timeout: float
    redis_url: str
    limits: bool = False
    #: ``--only``: the parts of ``--limits`` to run (empty: all of them).
    only: tuple[str, ...] = ()
    #: ``--hostile-duration``: seconds of the hostile neighbour (None: its default).
    hostile_duration: float | None = None
    #: Below 1: smaller hostile cases (tests only).
    hostile_scale: float = 1.0


def _redis_problem(url: str) -> str | None:
    if not url:
        return "no REDIS_URL (or --redis-url) given"
    try:
        import redis
    except ImportError:
        return "the redis package is not installed (pip install 'bucketq[reservoir]')"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001 - any failure: the mode cannot run
        return f"Redis at {url} does not answer ({type(exc).__name__}: {exc})"
    return None


def _drop_redis_prefix(url: str, prefix: str) -> None:
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    except Exception as exc:  # noqa: BLE001 - cleaning up: say so, go on
        log.warning("could not delete the benchmark's Redis keys %s*: %s", prefix, exc)


_SHUTDOWN = re.compile(r"buffer stopped: .*")

#: ``progress(requests done, requests scheduled, records seen in storage)``.
Progress = Callable[[int, int, int], None]
#: ``side(server url, key)``: a context manager run beside the load (see :func:`run_mode`).
Side = Callable[[str, str], Any]


def stored_records(db: Any, layout: str, run_id: str) -> int:
    """The run's records storage holds (a run has a database of its own)."""
    if layout == "documents":
        return int(db["logs"].count_documents({"metadata.bench_run": run_id}))
    return sum(int(d.get("n") or 0) for d in db[LOGS_COLLECTION].find({"p": PROJECT}, {"n": 1}))


def run_mode(
    uri: str,
    observer: Observer,
    mode: str,
    *,
    rate: float,
    duration: float,
    batch: int,
    redis_url: str = "",
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    mongo_pid: int | None = None,
    progress: Progress | None = None,
    extra_env: dict[str, str] | None = None,
    side: Side | None = None,
    max_connections: int | None = None,
    settle: Callable[[dict[str, Any]], bool] | None = None,
    keep_samples: bool = False,
) -> dict[str, Any]:
    """One mode at one rate, from a fresh database to the count of what storage holds.
    ``extra_env``: more of the server's environment; ``side(url, key)``: a context
    manager that runs beside the load (its value, once it ended, is the result's
    ``"side"``); ``max_connections``: the generator's; ``settle(load summary)``: False
    when what was accepted need not be stored (a run already judged on its answers):
    the server is then killed at once, not drained (``"settled": False``);
    ``keep_samples``: the result also has every request's ``Sample`` (``"samples"``) and
    the load's start (``"t0"``, a ``time.monotonic()`` value)."""
    run_id = uuid.uuid4().hex[:10]
    database = f"bqbench_{mode}_{run_id}"
    prefix = f"bqbench:{run_id}"
    env = mode_env(mode, uri=uri, database=database, prefix=prefix, redis_url=redis_url)
    env.update(extra_env or {})
    serve = ServeProcess(env)
    watcher = StorageWatcher(observer.client, database, run_id)
    load: LoadProcess | None = None
    beside: Any = None
    try:
        watcher.start()
        serve.start()
        key = serve.create_key(PROJECT)
        spec = LoadSpec(
            url=f"{serve.url}/api/v1/ingest",
            rate=rate,
            duration=duration,
            batch=batch,
            run_id=run_id,
            headers={"X-API-Key": key},
            max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
        )
        load = LoadProcess(spec).start()
        beside = side(serve.url, key) if side is not None else contextlib.nullcontext(None)
        side_value = beside.__enter__()
        n_requests = len(schedule(rate, duration))
        before = observer.server_counters()
        cpu0, mcpu0 = serve.cpu(), cpu_seconds(mongo_pid) if mongo_pid else None
        t0 = load.go()
        while not load.done():
            if progress:
                progress(load.progress.value, n_requests, len(watcher.seen))
            time.sleep(0.1)
        result = load.result(timeout=60)
        beside, ending = None, beside
        ending.__exit__(None, None, None)
        t_load_end = time.monotonic()
        samples = result["samples"]
        summary = load_summary(samples, batch)
        accepted = summary["records_accepted"]
        accepted_at = {s.seq: t0 + s.done for s in samples if s.ok and s.done is not None}
        settled = settle is None or settle(summary)
        drained = (
            watcher.wait_for(accepted, drain_timeout) if watcher.available and settled else None
        )
        drain_s = time.monotonic() - t_load_end
        if progress:
            progress(len(samples), n_requests, len(watcher.seen))
        cpu1, mcpu1 = serve.cpu(), cpu_seconds(mongo_pid) if mongo_pid else None
        window = time.monotonic() - t0
        if settled:
            exit_code = serve.stop()
        else:
            serve.kill()
            exit_code = None
        after = observer.server_counters()
        if settled and watcher.available and len(watcher.seen) < accepted:
            watcher.wait_for(accepted, 5.0)  # what the graceful stop flushed
        watcher.stop()
        stored = stored_records(observer.client[database], split_mode(mode)[1], run_id)
        delta = counters_delta(before, after)
        e2e = end_to_end(accepted_at, watcher.seen) if watcher.available else []
        seen_check = reconcile(accepted_at, batch, watcher.seen) if watcher.available else None
        shutdown = _SHUTDOWN.findall(serve.log_tail(20_000))
        api_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        mongo_cpu = None if mcpu0 is None or mcpu1 is None else mcpu1 - mcpu0
        kept = {"samples": samples, "t0": t0} if keep_samples else {}
        return {
            **kept,
            "mode": mode,
            "rate": rate,
            "duration_s": duration,
            "batch": batch,
            "database": database,
            "load": summary,
            "side": side_value() if callable(side_value) else side_value,
            "refused_without_retry_after": result.get("refused_without_retry_after", 0),
            "generator": {
                "connections_opened": result["connections"],
                "cpu_s": result["cpu_s"],
                "wall_s": result["wall_s"],
            },
            "records_stored": stored,
            "stored_ok": stored == accepted,
            "settled": settled,
            # from the change stream: which records those were (None without one)
            "stored_check": seen_check,
            "end_to_end": {
                **latency_summary(e2e),
                "available": watcher.available,
                "why_not": watcher.error,
                "all_seen_before_stop": drained,
                "drain_wait_s": drain_s,
            },
            "api_cpu_s": api_cpu,
            "api_cpu_share": None if api_cpu is None else api_cpu / window,
            "api_cpu_ms_per_request": None
            if api_cpu is None or not summary["requests"]
            else 1000 * api_cpu / summary["requests"],
            "mongodb_cpu_s": mongo_cpu,
            "store_cpu_us_per_record": None
            if mongo_cpu is None or not accepted
            else 1e6 * mongo_cpu / accepted,
            "mongodb_cpu_share": None if mongo_cpu is None else mongo_cpu / window,
            "window_s": window,
            "mongodb_requests": delta["requests"],
            "mongodb_opcounters": delta["opcounters"],
            # per record stored: what the server did write (= accepted when all went well;
            # a failed request's records may be stored too)
            "commands_per_1000_records": per_thousand(delta["requests"], stored),
            "commands_per_request": None
            if not summary["requests"]
            else delta["requests"] / summary["requests"],
            "server_exit_code": exit_code,
            # uvicorn re-raises the SIGTERM it handled once it has shut down
            "server_stopped_cleanly": exit_code in (0, -signal.SIGTERM) if settled else None,
            "server_stop_s": serve.stop_seconds,
            "shutdown_report": shutdown[-1] if shutdown else None,
        }
    except BaseException:
        tail = serve.log_tail()
        if tail:
            log.warning("bucketq serve (%s) log ends with:\n%s", mode, tail)
        raise
    finally:
        if beside is not None:
            beside.__exit__(None, None, None)
        if load is not None:
            load.stop()
        watcher.stop()
        serve.close()
        try:
            observer.client.drop_database(database)
        except Exception as exc:  # noqa: BLE001 - cleaning up: say so, go on
            log.warning("could not drop the benchmark database %s: %s", database, exc)
        if mode == "redis":
            _drop_redis_prefix(redis_url, prefix)


def _require(plots: bool) -> None:
    from ..._deps import require_all

    needed = ["rich", "fastapi", "uvicorn", *(["matplotlib"] if plots else [])]
    require_all(needed, "bench,server")


def settings_for(
    *,
    quick: bool = False,
    rate: float | None = None,
    duration: float | None = None,
    batch: int | None = None,
    modes: Sequence[str] | None = None,
    sweep: bool = False,
    sweep_duration: float | None = None,
    sweep_max_rate: float = DEFAULT_SWEEP_MAX_RATE,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    redis_url: str | None = None,
    limits: bool = False,
    only: Sequence[str] | None = None,
    hostile_duration: float | None = None,
    hostile_scale: float = 1.0,
    layouts: Sequence[str] | None = None,
) -> Settings:
    """The run's settings from the options, checked (a bad one names itself)."""
    rate = DEFAULT_RATE if rate is None else rate
    duration = (
        (DEFAULT_QUICK_DURATION if quick else DEFAULT_DURATION) if duration is None else duration
    )
    batch = DEFAULT_BATCH if batch is None else batch
    sweep_duration = sweep_duration or (
        DEFAULT_QUICK_SWEEP_DURATION if quick else DEFAULT_SWEEP_DURATION
    )
    for name, value, unit in (("rate", rate, "requests/s"), ("duration", duration, "seconds"),
                              ("sweep_duration", sweep_duration, "seconds"),
                              ("sweep_max_rate", sweep_max_rate, "requests/s"),
                              ("drain_timeout", drain_timeout, "seconds")):  # fmt: skip
        v.number(name, value, lo=0, hi=None, open_lo=True, unit=unit)
    v.count("batch", batch, lo=1, hi=1000, unit="records per request")
    if hostile_duration is not None:
        v.number("hostile_duration", hostile_duration, lo=0, hi=None, open_lo=True, unit="seconds")
    from ._limits import PARTS

    only = tuple(dict.fromkeys(only or ()))
    if only and not limits:
        raise ConfigurationError("--only chooses parts of --limits; give --limits too.")
    if [p for p in only if p not in PARTS]:
        raise ConfigurationError(f"--only takes {' or '.join(PARTS)}; got {list(only)}.")
    chosen = tuple(dict.fromkeys(modes or (LIMIT_MODES if limits else MODES)))
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise ConfigurationError(f"Unknown mode(s) {unknown}; choose from {list(MODES)}.")
    layouts = tuple(dict.fromkeys(layouts or ("buckets",)))
    if [x for x in layouts if x not in LAYOUTS]:
        raise ConfigurationError(f"--layout takes {' or '.join(LAYOUTS)}; got {list(layouts)}.")
    return Settings(
        quick=quick,
        rate=rate,
        duration=duration,
        batch=batch,
        modes=tuple(
            m if x == "buckets" else f"{m}@{x}"
            for m in MODES
            if m in chosen
            for x in sorted(layouts, reverse=True)
        ),  # fmt: skip
        sweep=sweep,
        sweep_duration=sweep_duration,
        sweep_max_rate=sweep_max_rate,
        drain_timeout=drain_timeout,
        redis_url=os.environ.get("REDIS_URL", "") if redis_url is None else redis_url,
        limits=limits,
        only=only,
        hostile_duration=hostile_duration,
        hostile_scale=hostile_scale,
    )


def run(
    uri: str | None = None,
    st: Settings | None = None,
    *,
    json_path: str | None = None,
    plots_dir: str | None = DEFAULT_PLOTS_DIR,
    console: Any = None,
) -> dict[str, Any]:
    """Run the benchmark with ``st`` (:func:`settings_for`; None: the defaults), print
    its tables, write the JSON (``json_path``) and the PNG (``plots_dir``; None for
    none). Returns the JSON document."""
    import json
    import sys

    from ...embedded import URI_ENV, EmbeddedServer
    from .._runner import environment

    st = st or settings_for()
    _require(bool(plots_dir))
    from ._report import document, print_report
    from ._terminal import IngestTerminal

    ui = IngestTerminal(console)
    console = ui.console
    skipped: dict[str, str] = {}
    if "redis" in st.modes:
        problem = _redis_problem(st.redis_url)
        if problem:
            skipped["redis"] = problem
    modes_run = [m for m in st.modes if split_mode(m)[0] not in skipped]
    t_start = time.monotonic()
    uri = uri or os.environ.get(URI_ENV) or None
    embedded = None if uri else EmbeddedServer().start()
    server_uri = uri or str(embedded.uri)  # type: ignore[union-attr]
    observer = Observer(server_uri)
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    sweeps: dict[str, SweepResult] = {}
    try:
        env = environment(server_uri, embedded is not None, [])
        env["versions"].update(
            {d: _version(d) for d in ("fastapi", "uvicorn", "pydantic", "redis", "starlette")}
        )
        mongo_pid = embedded.pid if embedded is not None else None
        if st.limits:
            return _run_limits(ui, st, tuple(modes_run), env, json_path, t_start,
                               lambda mode, rate, duration, batch, **kw: run_mode(
                                   server_uri, observer, mode, rate=rate, duration=duration,
                                   batch=batch, redis_url=st.redis_url,
                                   drain_timeout=st.drain_timeout, mongo_pid=mongo_pid, **kw))  # fmt: skip
        ui.headline(
            f"[bold]bucketq bench ingest[/]: {', '.join(modes_run)} at {st.rate:g} requests/s × "
            f"{st.batch} logs for {st.duration:g} s each, one `bucketq serve` per mode, on "
            f"{env['server']['description']}"
            + (f"; sweep from {st.rate:g} requests/s" if st.sweep else "")
        )
        for m, why in skipped.items():
            ui.skipped(m, why)

        def one(mode: str, rate: float, duration: float) -> dict[str, Any]:
            with ui.mode_running(mode, rate) as progress:
                return run_mode(server_uri, observer, mode, rate=rate, duration=duration,
                                batch=st.batch, redis_url=st.redis_url,
                                drain_timeout=st.drain_timeout, mongo_pid=mongo_pid,
                                progress=progress)  # fmt: skip

        with ui.runs():
            for mode in modes_run:
                try:
                    r = one(mode, st.rate, st.duration)
                except (RuntimeError, OSError, ConfigurationError) as exc:
                    failed[mode] = str(exc)
                    ui.failed(mode, exc)
                    continue
                results[mode] = r
                ui.result(r)
            if st.sweep:
                live = [m for m in modes_run if m not in failed]
                sweeps = {m: SweepResult() for m in live}
                rate_now: float | None = st.rate
                while live and rate_now is not None:
                    for mode in list(live):
                        step_r: dict[str, Any] | None
                        try:
                            step_r = (
                                results[mode]
                                if rate_now == st.rate and st.duration >= st.sweep_duration
                                else one(mode, rate_now, st.sweep_duration)
                            )
                        except (RuntimeError, OSError) as exc:
                            ui.failed(f"sweep {mode} at {rate_now:g}", exc)
                            step_r = None
                        step = SweepStep(
                            rate_now,
                            None if step_r is None else step_r["load"]["latency"]["p95_ms"],
                            1 if step_r is None else step_r["load"]["errors"],
                            step_r is not None and step_r["stored_ok"],
                            step_r is not None and step_r["load"]["kept_schedule"],
                        )
                        sweeps[mode].steps.append(step)
                        if step_r is not None and step_r is not results.get(mode):
                            ui.result(step_r, "sweep ")
                        if next_sweep_rate(sweeps[mode].steps, st.sweep_max_rate) is None:
                            live.remove(mode)
                    rate_now = rate_now * 2 if rate_now * 2 <= st.sweep_max_rate else None
    finally:
        observer.close()
        if embedded is not None:
            embedded.stop()
    for mode, sw in sweeps.items():
        if mode in results:
            results[mode]["sweep"] = {
                "steps": [s.__dict__ | {"sustained": s.sustained} for s in sw.steps],
                "highest_sustained_rate": sw.highest_sustained,
                "stopped_by": sw.limited_by,
            }
    settings = {
        **st.__dict__,
        "skipped": skipped,
        "failed": failed,
        "argv": sys.argv,
    }
    doc = document(results, env, settings, time.monotonic() - t_start)
    doc["targets"] = targets(results)
    if plots_dir and results:
        from ._plots import write_plot

        doc["plots"] = [write_plot(doc, plots_dir)]
    print_report(console, doc)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        console.print(f"every figure: {json_path}")
    if failed:
        raise RuntimeError(
            f"{len(failed)} mode(s) failed: "
            + "; ".join(f"{m}: {e.splitlines()[0]}" for m, e in failed.items())
        )
    return doc


def _run_limits(
    ui: Any, st: Settings, modes: tuple[str, ...], env: dict[str, Any], json_path: str | None,
    t_start: float, run_one: Callable[..., dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """``--limits``: capacity, overload and hostile neighbour (``_limits``), printed as
    they come; the JSON has them under ``"limits"``."""
    import json
    import sys

    from ._limits import LimitSettings, run_limits

    def one(mode: str, rate: float, duration: float, batch: int, **kw: Any) -> dict[str, Any]:
        with ui.mode_running(mode, rate) as progress:
            r = run_one(mode, rate, duration, batch, progress=progress, **kw)
        ui.result(r)
        return r

    lst = LimitSettings.for_run(modes, st.quick, parts=st.only,
                                hostile_duration=st.hostile_duration,
                                hostile_scale=st.hostile_scale)  # fmt: skip
    what = {"capacity": "capacity, overload", "hostile": "hostile neighbour"}
    ui.headline(f"[bold]bucketq bench ingest --limits[/]: "
                f"{' and '.join(what[p] for p in lst.parts)}; modes {', '.join(modes)}; on "
                f"{env['server']['description']}")  # fmt: skip
    with ui.runs():
        limits = run_limits(one, lst, ui.say)
    doc = {
        "schema": SCHEMA + "+limits",
        "environment": env,
        "settings": {**st.__dict__, **lst.__dict__, "argv": sys.argv},
        "seconds": time.monotonic() - t_start,
        "limits": limits,
    }
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        ui.console.print(f"every figure: {json_path}")
    return doc


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
