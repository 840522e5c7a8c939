"""`bucketq bench ingest`: the command line, and the open-loop generator against real
servers on loopback. No timing thresholds."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pymongo import MongoClient
from rich.console import Console

from bucketq.benchmark.ingest import _hostile, _limits
from bucketq.benchmark.ingest._load import LoadProcess, LoadSpec, run_load
from bucketq.benchmark.ingest._runner import run, settings_for
from bucketq.benchmark.ingest._serve import free_port
from bucketq.benchmark.ingest._stats import (
    SweepResult,
    SweepStep,
    end_to_end,
    load_summary,
    next_sweep_rate,
    percentile,
    reconcile,
    schedule,
    targets,
)
from bucketq.cli import build_parser
from bucketq.errors import ConfigurationError
from waiting import eventually

pytestmark = pytest.mark.bench


def test_bench_alone_is_still_the_queue_benchmark_and_ingest_is_a_subcommand():
    args = build_parser().parse_args(["bench", "--quick", "--n", "5"])
    assert args.func.__name__ == "_bench" and args.quick and args.n == 5
    assert args.bench_command is None
    args = build_parser().parse_args(["bench", "ingest", "--rate", "5", "--mode", "memory"])
    assert args.bench_command == "ingest" and args.rate == 5 and args.mode == ["memory"]
    assert args.func.__name__ == "run_from_args"


# -- the arithmetic ------------------------------------------------------------------------


def test_schedule_is_a_constant_arrival_rate():
    assert schedule(4, 1) == [0.0, 0.25, 0.5, 0.75]
    assert len(schedule(100, 180)) == 18_000
    with pytest.raises(ValueError, match="rate"):
        schedule(0, 1)


def test_percentiles_are_nearest_rank_of_what_was_measured():
    values = [float(x) for x in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) is None


def test_a_sweep_doubles_while_sustained_and_stops_at_the_first_failure():
    ok = SweepStep(100, 20.0, 0, True, True)
    assert next_sweep_rate([ok], 6400) == 200
    slow = SweepStep(200, 1500.0, 0, True, True)
    assert next_sweep_rate([ok, slow], 6400) is None
    lost = SweepStep(200, 20.0, 0, False, True)
    assert next_sweep_rate([ok, lost], 6400) is None
    sw = SweepResult([ok, slow])
    assert sw.highest_sustained == 100 and "p95" in sw.limited_by
    behind = SweepResult([ok, SweepStep(200, 20.0, 0, True, False)])
    assert behind.highest_sustained == 200 and "generator" in behind.limited_by


def test_end_to_end_and_reconcile_match_storage_to_requests():
    accepted_at = {0: 10.0, 1: 10.5}  # request 2 timed out
    seen = [(0, 0, 10.2), (0, 1, 9.9), (1, 0, 11.0), (1, 0, 11.5), (2, 0, 12.0)]
    assert end_to_end(accepted_at, seen) == pytest.approx([0.2, 0.0, 0.5])
    # request 1's record 1 never arrived, its record 0 twice; request 2's was stored anyway
    assert reconcile(accepted_at, 2, seen) == {
        "lost": 1,
        "duplicates": 1,
        "stored_unacknowledged": 1,
    }


def _mode(p95, errors=0, timeouts=0, stored_ok=True, per_request=0.1, requests=100):
    kinds = {"timeout": timeouts} if timeouts else {}
    load = {"requests": requests, "errors": errors + timeouts, "errors_by_kind": kinds,
            "latency": {"p95_ms": p95}}  # fmt: skip
    return {"load": load, "stored_ok": stored_ok, "commands_per_request": per_request}


def test_targets_judge_the_figures_and_leave_a_timed_out_p95_out():
    met = {t["target"]: t["met"] for t in targets(
        {"off": _mode(1000.0), "memory": _mode(20.0), "bucketq": _mode(25.0)})}  # fmt: skip
    assert met["bucketq transport p95 <= 1.5x memory p95"] is True
    assert met["bucketq transport p95 <= 1/10 of buffer-off p95"] is True
    assert met["zero errors"] is True and met["stored = accepted in every mode"] is True
    assert met["highest sustained rate with the bucketq transport >= 5x buffer off"] is None
    met = {t["target"]: t["met"] for t in targets(
        {"off": _mode(30000.0, timeouts=50), "memory": _mode(20.0), "bucketq": _mode(40.0, stored_ok=False)})}  # fmt: skip
    assert met["bucketq transport p95 <= 1.5x memory p95"] is False
    assert met["bucketq transport p95 <= 1/10 of buffer-off p95"] is None  # timed out
    assert met["zero errors"] is False and met["stored = accepted in every mode"] is False
    met = {
        t["target"]: t["met"]
        for t in targets({"memory": _mode(20.0), "bucketq": _mode(25.0, errors=30)})
    }
    assert met["bucketq transport p95 <= 1.5x memory p95"] is None  # 503s are not latencies


def test_bad_options_name_themselves():
    with pytest.raises(ConfigurationError, match="rate"):
        settings_for(rate=0)
    with pytest.raises(ConfigurationError, match="batch"):
        settings_for(batch=0)
    with pytest.raises(ConfigurationError, match="mode"):
        settings_for(modes=["nope"])
    with pytest.raises(ConfigurationError, match="rate must be a finite number greater than 0"):
        settings_for(rate=float("inf"))
    with pytest.raises(ConfigurationError, match="sweep_duration"):
        settings_for(sweep=True, sweep_duration=-1)
    with pytest.raises(ConfigurationError, match="batch must be a whole number"):
        settings_for(batch=2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="--only chooses parts of --limits"):
        settings_for(only=["hostile"])
    with pytest.raises(ConfigurationError, match="hostile_duration"):
        settings_for(limits=True, only=["hostile"], hostile_duration=0)


def test_a_bad_option_is_one_line_and_exit_1_before_anything_starts(capsys):
    from bucketq.cli import main

    assert main(["bench", "ingest", "--rate", "0", "--no-plots"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bucketq bench ingest: rate must be") and "\n" not in err
    assert settings_for(quick=True).duration == 30
    assert settings_for().duration == 180 and settings_for().rate == 100


# -- the generator against a stand-in endpoint that stalls once -----------------------------


@pytest.fixture
def standin(tmp_path):
    """Start tests/ingest_standin.py; yields (base url, path of its JSON lines)."""

    def start(**opts: object) -> tuple[str, Path]:
        out = tmp_path / "standin.jsonl"
        args = [
            sys.executable,
            str(Path(__file__).with_name("ingest_standin.py")),
            "--out",
            str(out),
        ]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        procs.append(subprocess.Popen(args))

        def port() -> int | None:
            lines = out.read_text().splitlines() if out.exists() else []
            return json.loads(lines[0])["port"] if lines else None

        p = eventually(port)
        return f"http://127.0.0.1:{p}", out

    procs: list[subprocess.Popen] = []
    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_latency_counts_from_the_schedule_so_a_stall_shows_in_every_request_it_delayed(standin):
    rate, stall_at = 40.0, 40  # the stall starts with request 40, scheduled at 1 s
    url, out = standin(stall_at=stall_at, stall_seconds=0.8)
    spec = LoadSpec(url=f"{url}/api/v1/ingest", rate=rate, duration=3.0, batch=5, run_id="t")
    load = LoadProcess(spec).start()
    load.go()
    result = load.result(timeout=120)
    samples, t0 = result["samples"], result["t0"]
    summary = load_summary(samples, spec.batch)
    assert summary["requests"] == len(schedule(rate, 3.0)) == 120
    assert summary["errors"] == 0 and summary["records_accepted"] == 120 * 5
    stall = json.loads(out.read_text().splitlines()[1])
    # Every request scheduled while the server was stalled was answered after the stall
    # ended, and its latency says so: it counts from when it should have been sent.
    during = [s for s in samples if stall["stall_start"] <= t0 + s.scheduled < stall["stall_end"]]
    assert len(during) > 1
    for s in during:
        assert t0 + s.done >= stall["stall_end"]
        assert s.latency >= stall["stall_end"] - (t0 + s.scheduled)
    # and they were sent while it was stalled, not held back until it answered
    assert len([s for s in during if t0 + s.sent < stall["stall_end"]]) > 1


def test_a_connection_the_server_closed_while_idle_is_not_an_error(standin):
    url, _ = standin(idle_close=0.2)  # closes before the generator stops reusing it
    spec = LoadSpec(url=f"{url}/x", rate=4, duration=2.0, batch=1, run_id="t")
    result = asyncio.run(run_load(spec))
    summary = load_summary(result["samples"], 1)
    assert summary["requests"] == 8 and summary["errors"] == 0, summary["errors_by_kind"]
    assert result["connections"] > 1  # it did go back to the server for new ones


def test_a_refused_connection_is_an_error_with_its_latency(tmp_path):
    spec = LoadSpec(
        url=f"http://127.0.0.1:{free_port()}/x", rate=20, duration=0.2, batch=1, run_id="t"
    )
    result = asyncio.run(run_load(spec))
    summary = load_summary(result["samples"], 1)
    assert summary["requests"] == 4 and summary["errors"] == 4 and summary["records_accepted"] == 0
    assert set(summary["errors_by_kind"]) == {"ConnectionRefusedError"}
    assert summary["latency"]["n"] == 4


# -- against real `bucketq serve` processes -------------------------------------------------


def test_bench_ingest_runs_real_servers_and_counts_what_storage_holds(mongo_uri, tmp_path):
    console = Console(file=io.StringIO(), width=250)
    doc = run(
        mongo_uri,
        settings_for(rate=10, duration=2, batch=3, modes=["bucketq"]),
        json_path=str(tmp_path / "ingest.json"),
        plots_dir=str(tmp_path / "plots"),
        console=console,
    )
    assert json.loads((tmp_path / "ingest.json").read_text())["modes"].keys() == {"bucketq"}
    for mode in ("bucketq",):
        r = doc["modes"][mode]
        assert r["load"]["requests"] == 20 and r["load"]["errors"] == 0
        assert r["load"]["records_accepted"] == 60 == r["records_stored"]
        assert r["stored_ok"] and r["server_stopped_cleanly"]
        # every accepted record was seen arriving in storage
        assert r["end_to_end"]["available"] and r["end_to_end"]["n"] == 60
        assert r["stored_check"] == {"lost": 0, "duplicates": 0, "stored_unacknowledged": 0}
        assert r["mongodb_requests"] > 0 and r["api_cpu_s"] > 0
    out = console.file.getvalue()
    assert "bucketq buffer" in out and "seed p95" in out and "Targets" in out
    assert "✓ bucketq at 10 req/s: p50" in out  # the line each finished run prints
    assert (tmp_path / "plots" / "bucketq-bench-ingest.png").read_bytes().startswith(b"\x89PNG")
    # the run's databases are gone
    with MongoClient(mongo_uri) as client:
        assert not [d for d in client.list_database_names() if d.startswith("bqbench_")]


# -- --limits: capacity, overload, hostile neighbour ---------------------------------------


def test_hostile_bodies_are_what_they_say():
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    huge = _hostile.huge_body(1000)
    assert len(huge) <= 1000 and set(json.loads(huge)["logs"]) == {0}
    assert len(_hostile.huge_body()) <= _hostile.BODY_LIMIT
    deep = json.loads(_hostile.deep_body(50))["logs"][0]["metadata"]
    for _ in range(49):
        deep = deep["a"]
    assert deep == {"a": 1}
    msg = ExportLogsServiceRequest.FromString(_hostile.otlp_body(3))
    assert len(msg.resource_logs[0].scope_logs[0].log_records) == 3
    assert len(_hostile.otlp_body()) <= _hostile.BODY_LIMIT  # 2.6M records, under 5 MiB


def _fake_run(capacity_rate: float):
    """A stand-in for run_mode: sustained up to ``capacity_rate``; overload refused."""
    calls = []

    def run_one(mode, rate, duration, batch, side=None, settle=None, keep_samples=False, **kw):
        calls.append((mode, rate, batch))
        ok = rate <= capacity_rate
        lat = {"n": 10, "p50_ms": 5.0, "p95_ms": 20.0 if ok else 900.0, "p99_ms": 30.0,
               "max_ms": 40.0}  # fmt: skip
        errors = {} if ok or batch != 100 else {"HTTP 503": 3}
        load = {"requests": 10, "ok": 10 - sum(errors.values()), "errors": sum(errors.values()),
                "errors_by_kind": errors, "records_accepted": batch * 10, "latency": lat,
                "kept_schedule": True}  # fmt: skip
        # a capacity step that failed on its answers is not waited for storage
        if settle is not None:
            assert settle(load) == ok
        side_value = None
        extra = {}
        if side is _hostile.HealthProbe:
            side_value = {"n": 5, "max_ms": 3.0, "p99_ms": 3.0, "failures": {}}
        elif side is not None and side.func is _hostile.Alternating:
            assert keep_samples and side.keywords["window"] == min(5.0, duration / 4)
            side_value, samples = _windows([10.0, 20.0, 10.0, 20.0])
            extra = {"samples": samples, "t0": 100.0}
        return {"rate": rate, "batch": batch, "load": load, "stored_ok": True,
                "api_cpu_s": 0.5, "records_stored": load["records_accepted"], "side": side_value,
                "refused_without_retry_after": 0, **extra}  # fmt: skip

    return run_one, calls


def _windows(p99_ms, trailing_ms=None):
    """An ``Alternating`` report of 1 s windows from t=100 (quiet, hostile, ...), each
    window's requests (10, scheduled from t0=100) answered in 1 ms but one in ``p99_ms``;
    a last quiet window of 0.5 s (cut by the load's end) answered in ``trailing_ms``."""
    from bucketq.benchmark.ingest._stats import Sample

    windows, samples = [], []
    full = {"huge sent": 1, "deep sent": 1, "otlp sent": 1, "silent opened": 200, "slow opened": 5}
    cuts = [(k, 100.0 + k, 101.0 + k, ms) for k, ms in enumerate(p99_ms)]
    if trailing_ms is not None:
        k = len(p99_ms)
        cuts.append((k, 100.0 + k, 100.5 + k, trailing_ms))
    for k, start, end, ms in cuts:
        kind = "alone" if k % 2 == 0 else "hostile"
        windows.append({"kind": kind, "index": k, "start": start, "end": end, "quiesced": True,
                        "load1": 1.0 + k, "hostile_sent": full if kind == "hostile" else {}})  # fmt: skip
        n = int((end - start) * 10)
        for i in range(n):
            at = start - 100.0 + i / 10
            lat = ms / 1000 if i == n - 1 else 0.001
            samples.append(Sample(len(samples), at, at, at + lat, 200))
    answers = {"huge": {"sent": 2, "413": 2}}
    return {"window_s": 1.0, "windows": windows, "answers": answers}, samples


def test_the_hostile_neighbour_pools_whole_quiet_and_hostile_windows():
    side, samples = _windows([10.0, 40.0, 30.0, 30.0], trailing_ms=5000.0)
    hn = _limits.hostile_figures(samples, 100.0, side, 10)
    # p99 of 20 requests by nearest rank: the worst; the cut-short last window is left out
    assert hn["windows"] == {"alone": 2, "hostile": 2}
    assert hn["alone"]["p99_ms"] == pytest.approx(30.0)
    assert hn["beside"]["p99_ms"] == pytest.approx(40.0)
    assert hn["ratio"] == pytest.approx(40 / 30)
    assert [p["ratio"] for p in hn["pairs"]] == pytest.approx([4.0, 1.0])
    assert hn["pair_ratio"]["median"] == pytest.approx(2.5)
    assert hn["alone"]["requests"] == hn["beside"]["requests"] == 20
    assert hn["hostile_windows_with_every_case"] == 2 and hn["load1"] == [1.0, 4.0]
    assert hn["hostile_sent"]["silent"] == 400 and hn["hostile_sent_in_quiet_windows"] == 0
    # a request scheduled in a hostile window counts there however late its answer came
    late = [s for s in samples if 101.0 <= 100.0 + s.scheduled < 102.0][0]
    late.done = late.scheduled + 9.0
    assert _limits.hostile_figures(samples, 100.0, side, 10)["beside"]["p99_ms"] == pytest.approx(
        9000.0
    )
    # a hostile window where a case sent nothing is not counted as one where all ran
    side["windows"][3]["hostile_sent"] = {"huge sent": 1}
    assert _limits.hostile_figures(samples, 100.0, side, 10)["hostile_windows_with_every_case"] == 1


def test_limits_double_the_rate_then_bisect_and_judge_each_figure():
    run_one, calls = _fake_run(capacity_rate=50)
    st = _limits.LimitSettings(("off",), start_rate=10, max_rate=1000)
    lines: list[str] = []
    out = _limits.run_limits(run_one, st, lines.append)
    c = out["capacity"]["off"]
    # 10, 20, 40 sustained, 80 not, then 60 (halfway) not: 40 requests/s x 100 records
    assert [s["rate"] for s in c["steps"]] == [10, 20, 40, 80, 60]
    assert c["records_per_s"] == 4000 and c["api_cpu_us_per_record"] == 1e6 * 0.5 / 1000
    o = out["overload"]["off"]
    assert o["rate"] == 80 and o["refused"] == 3 and o["answered_in_time"] and o["health_in_time"]
    hn = out["hostile"]["off"]
    assert hn["ratio"] == 2.0 and hn["hostile_answers"] == {"huge": {"sent": 2, "413": 2}}
    assert any(line.startswith("hostile neighbour off:") and "x2.00" in line for line in lines)
    assert any(line.startswith("capacity off: 4,000 records/s") for line in lines)
    assert any("overload off at 80 req/s" in line and "✓" in line for line in lines)
    assert ("off", 50.0, 10) in calls  # the good traffic: 50 requests/s of 10 records
    # a start past the capacity: halved until sustained, then once halfway back up
    run_one, calls = _fake_run(capacity_rate=3)
    c = _limits.capacity(run_one, "off", st)
    assert [s["rate"] for s in c["steps"]] == [10, 5, 2.5, 3.75]
    assert c["records_per_s"] == 250
    # --only: one part
    run_one, calls = _fake_run(capacity_rate=50)
    st = _limits.LimitSettings.for_run(("memory",), False, parts=["hostile"], hostile_duration=8)
    out = _limits.run_limits(run_one, st, lines.append)
    assert calls == [("memory", 50.0, 10)] and out["capacity"] == {} and out["overload"] == {}
    assert st.hostile_window == 2.0 and out["hostile"]["memory"]["duration_s"] == 8


def test_hostile_clients_and_the_health_probe_against_a_real_server(mongo_uri):
    from bucketq.benchmark.ingest._runner import mode_env
    from bucketq.benchmark.ingest._serve import ServeProcess

    db = f"bqbench_hostile_{uuid.uuid4().hex[:8]}"
    serve = ServeProcess(mode_env("off", uri=mongo_uri, database=db, prefix="x", redis_url=""))
    try:
        serve.start()
        key = serve.create_key("bench")
        hostile = _hostile.Hostile(serve.url, key, scale=0.001)  # small bodies: brief
        with _hostile.HealthProbe(serve.url) as health, hostile as report:
            hostile.resume(1)

            def answered() -> dict | None:
                r = report()
                got = r.get("silent", {}).get("opened") and r.get("slow", {}).get("opened")
                return (
                    r
                    if got and all(len(r.get(k, {})) > 1 for k in ("huge", "deep", "otlp"))
                    else None
                )

            eventually(answered, timeout=120, what="the hostile clients to reach the server")
            # paused: every connection closed, nothing more sent until resumed
            assert hostile.pause(timeout=60)
            paused = report()
            assert not hostile.busy
            hostile.resume(3)
            eventually(lambda: hostile.window_report().get(3), timeout=60, what="a resume")
        assert health()["n"] > 0
        sent = hostile.window_report()
        assert sent[1]["huge sent"] >= 1 and sent[1]["silent opened"] >= 1
        assert paused["huge"]["sent"] == sent[1]["huge sent"]  # nothing sent while paused
    finally:
        serve.stop()
        serve.close()
        with MongoClient(mongo_uri) as client:
            client.drop_database(db)


def test_limits_only_hostile_runs_the_hostile_neighbour_alone(mongo_uri, tmp_path, capsys):
    from bucketq.cli import main

    path = tmp_path / "limits.json"
    # 2 s of good traffic: windows of 0.5 s (quiet, hostile, quiet, hostile)
    assert main(["bench", "ingest", "--limits", "--only", "hostile", "--mode", "memory",
                 "--hostile-duration", "2", "--mongodb-uri", mongo_uri, "--json", str(path),
                 "--no-plots"]) == 0  # fmt: skip
    limits = json.loads(path.read_text())["limits"]
    assert limits["capacity"] == {} and limits["overload"] == {}  # not run
    hn = limits["hostile"]["memory"]
    assert hn["window_s"] == 0.5 and hn["windows"]["alone"] == hn["windows"]["hostile"] >= 1
    # the good traffic ran throughout, answered and stored, in both kinds of window
    assert hn["alone"]["requests"] > 0 and hn["beside"]["requests"] > 0
    errors = {k: hn[k]["errors_by_kind"] for k in ("alone", "beside")}
    assert hn["alone"]["errors"] == 0 and hn["beside"]["errors"] == 0, errors
    assert hn["stored_ok"]
    assert hn["ratio"] is not None and len(hn["pairs"]) == hn["windows"]["hostile"]
    # every hostile case went in the hostile windows, none in the quiet ones, and was refused
    assert all(n >= 1 for n in hn["hostile_sent"].values()), hn["hostile_sent"]
    assert hn["hostile_sent_in_quiet_windows"] == 0
    answers = hn["hostile_answers"]
    assert answers["huge"].get("413") and answers["otlp"].get("413") and answers["deep"].get("400")
    out = capsys.readouterr().out
    assert "hostile neighbour memory: good traffic" in out and "capacity memory" not in out


def test_the_overload_reports_the_event_loop_from_two_metrics_scrapes():
    from bucketq.benchmark.ingest._hostile import loop_lag, loop_samples

    def text(buckets: list[float], late: dict[str, float]) -> str:
        bounds = [
            "0.001",
            "0.005",
            "0.01",
            "0.025",
            "0.05",
            "0.1",
            "0.25",
            "0.5",
            "1.0",
            "2.5",
            "+Inf",
        ]
        lines = [f'bucketq_event_loop_lag_seconds_bucket{{le="{b}"}} {n}'
                 for b, n in zip(bounds, buckets, strict=True)]  # fmt: skip
        lines += [
            f'bucketq_event_loop_late_seconds_total{{cause="{c}"}} {s}' for c, s in late.items()
        ]
        return "\n".join(["# TYPE bucketq_event_loop_lag_seconds histogram", *lines[:11],
                          "# TYPE bucketq_event_loop_late_seconds counter", *lines[11:]]) + "\n"  # fmt: skip

    before = loop_samples(text([10] * 11, {"loop": 0.5}))
    # 100 more looks: 90 on time, 6 up to 50 ms, 3 up to 100 ms, one up to 250 ms
    after = loop_samples(text([100, 100, 100, 100, 106, 109, 110, 110, 110, 110, 110],
                              {"loop": 0.75, "cpu": 0.3}))  # fmt: skip
    e = loop_lag(before, after)
    assert e == {"available": True, "samples": 100, "over_50ms": 4, "over_100ms": 1,
                 "max_le_ms": 250.0, "late_s": {"loop": 0.25, "cpu": 0.3}}  # fmt: skip
    assert loop_lag(None, after) == {"available": False}
    assert "over 100 ms 1 of 100" in _limits._loop(e) and "cpu 0.3 s" in _limits._loop(e)
