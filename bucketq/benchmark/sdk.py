"""``bucketq bench sdk``: what one log call costs the caller, and how fast records arrive.

Caller cost: p50/p99/p99.9/max wall time of one ``logger.info(...)`` (plus the caller
thread's CPU per call) in a hot loop, each case in a fresh child process, one after the
other against one ``bucketq serve`` on loopback, in ``--rounds`` rounds (default 3) that
each run every case once (the order turns by one case each round), so the cases share
the machine's moods; each figure is the median of the rounds, with their range:

- ``sdk, server up``: :class:`~bucketq.sdk.IngestHandler` with its defaults
- ``sdk, server stopped``: the same, nothing listening on its port (records spill)
- ``sdk, queue full``: the server frozen with SIGSTOP, so the queue stays full and
  every call goes to the spill
- ``FileHandler``: the standard library's, to a local file (the floor a user knows)
- ``HTTPHandler``: the standard library's blocking handler, one POST per record, to
  the same server (fewer calls: each one is a round trip)

Each SDK case's p99 is also given as a ratio to ``FileHandler``'s p99 of the same round
(median and range of the rounds' ratios), beside the target: at most 1.5x.

Delivery: records/s from one process to ``bucketq serve`` end to end (first call until
the server has every record), and the SDK's memory while the server is stopped (RSS
every quarter of the loop: bounded by the queue, not growing with the calls).
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from .. import _validate as v

DEFAULT_N = 100_000
DEFAULT_HTTP_N = 2_000
DEFAULT_DELIVERY_N = 10_000
DEFAULT_ROUNDS = 3
#: the most an SDK case's p99 may be, as a multiple of FileHandler's p99 in the same round
P99_TARGET = 1.5

CASES = ("sdk_up", "sdk_down", "sdk_full", "file", "http")
LABELS = {
    "sdk_up": "IngestHandler, server up",
    "sdk_down": "IngestHandler, server stopped",
    "sdk_full": "IngestHandler, queue full (server frozen)",
    "file": "logging.FileHandler",
    "http": "logging.handlers.HTTPHandler, server up",
}


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _percentiles(lat: Any) -> dict[str, float]:
    ns = sorted(lat)
    n = len(ns)

    def at(q: float) -> float:
        return ns[min(n - 1, int(q * n))] / 1000.0

    return {"p50_us": at(0.50), "p99_us": at(0.99), "p999_us": at(0.999),
            "max_us": ns[-1] / 1000.0, "mean_us": sum(ns) / n / 1000.0}  # fmt: skip


def _child(case: str, url: str, key: str, n: int, spill: str) -> dict[str, Any]:
    """Run one caller-cost case in this (fresh) process; return its figures."""
    from ..sdk import IngestHandler

    handler: logging.Handler
    if case in ("sdk_up", "sdk_down", "sdk_full"):
        handler = IngestHandler(url, key, spill_dir=spill, service="bench")
    elif case == "file":
        handler = logging.FileHandler(os.path.join(spill, "file.log"))
    else:
        host = url.split("//", 1)[1]
        handler = logging.handlers.HTTPHandler(host, "/api/v1/ingest", method="POST")
    logger = logging.getLogger("bench.caller")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    if case == "sdk_full":  # fill the queue first: the measured calls all find it full
        fill = (time.time(), "info", "fill", "bench", None, None, None)
        assert isinstance(handler, IngestHandler)
        while handler.processor.queue.add(fill):
            pass
    extra = {"user": "u-42", "path": "/api/orders", "status": 200}
    pc = time.perf_counter_ns
    lat = array("q", bytes(8 * n))  # preallocated: the loop allocates nothing of its own
    rss = [_rss_kib()]
    quarter = max(1, n // 4)
    cpu0 = time.thread_time()
    for i in range(n):
        t0 = pc()
        logger.info("request %d handled", i, extra=extra)
        lat[i] = pc() - t0
        if (i + 1) % quarter == 0:
            rss.append(_rss_kib())
    cpu = time.thread_time() - cpu0
    out: dict[str, Any] = {"case": case, "n": n, **_percentiles(lat),
                           "caller_cpu_us_per_call": cpu / n * 1e6, "rss_kib": rss}  # fmt: skip
    if isinstance(handler, IngestHandler):
        out["stats"] = handler.stats()
        handler.processor.close(0)
    else:
        handler.close()
    return out


def _delivery(url: str, key: str, n: int, spill: str) -> dict[str, Any]:
    """Records/s from one process to the server, counted as accepted by the server."""
    from ..sdk import Client

    c = Client(url, key, spill_dir=spill, service="bench-delivery")
    t0 = time.perf_counter()
    for i in range(n):
        c.log("info", f"delivery {i}", i=i)
    logged = time.perf_counter() - t0
    deadline = time.monotonic() + 600
    while True:
        st = c.stats()
        if st["sent"] + st["replayed"] >= n or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    total = time.perf_counter() - t0
    st = c.stats()
    c.close(5)
    return {"n": n, "log_seconds": logged, "seconds": total,
            "records_per_s": (st["sent"] + st["replayed"]) / total,
            "via_spill": st["spilled"], "stats": st}  # fmt: skip


def _ceiling(url: str, key: str, n: int) -> dict[str, Any]:
    """The server's own rate: two threads POSTing ready-made batches of the SDK's default
    batch size (what its two workers send), no SDK in the way."""
    import urllib3

    from ..sdk import Client

    with Client(url, key) as client:  # only to read its default batch size
        size = client.processor.cfg.batch_size

    batches = [
        json.dumps({"logs": [{"time": "2026-01-01T00:00:00+00:00", "service": "bench-ceiling",
                              "level": "info", "message": f"ceiling {b * size + i}",
                              "metadata": {"i": i}} for i in range(size)]}).encode()
        for b in range(max(1, n // size))
    ]  # fmt: skip
    lock = threading.Lock()
    ok = [0]

    def post(mine: list[bytes]) -> None:
        pool = urllib3.PoolManager(retries=False, timeout=60)
        for body in mine:
            r = pool.request("POST", url + "/api/v1/ingest", body=body,
                             headers={"Content-Type": "application/json", "X-API-Key": key})  # fmt: skip
            if r.status == 200:
                with lock:
                    ok[0] += size

    t0 = time.perf_counter()
    threads = [threading.Thread(target=post, args=(batches[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {"n": ok[0], "seconds": seconds, "records_per_s": ok[0] / seconds, "batch": size}


def _run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "bucketq.benchmark.sdk", *args], env=env,
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"benchmark child {args[0]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


#: the figures of one case that are summarised over the rounds (median and range)
FIGURES = ("p50_us", "p99_us", "p999_us", "max_us", "mean_us", "caller_cpu_us_per_call")


def _rss_growth(r: dict[str, Any]) -> int:
    """KiB the process grew after the first quarter of its loop."""
    rss = r["rss_kib"]
    return max(rss) - rss[1] if len(rss) > 1 else 0


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each case's figures over the rounds: ``{figure: median, figure + "_range": [lo, hi]}``,
    and for an SDK case in a round that also ran ``file``, ``p99_vs_file`` (its p99 over
    FileHandler's p99 of the same round: median, range, and every round's)."""
    out: dict[str, dict[str, Any]] = {}
    for case in CASES:
        runs = [r[case] for r in rounds if case in r]
        if not runs:
            continue
        c: dict[str, Any] = {"n": runs[0]["n"], "rounds": len(runs)}
        for fig in (*FIGURES, "rss_growth_kib"):
            xs = [_rss_growth(x) if fig == "rss_growth_kib" else x[fig] for x in runs]
            c[fig] = statistics.median(xs)
            c[fig + "_range"] = [min(xs), max(xs)]
        if case.startswith("sdk_"):
            ratios = [r[case]["p99_us"] / r["file"]["p99_us"]
                      for r in rounds if case in r and "file" in r]  # fmt: skip
            if ratios:
                c["p99_vs_file"] = statistics.median(ratios)
                c["p99_vs_file_range"] = [min(ratios), max(ratios)]
                c["p99_vs_file_rounds"] = ratios
        out[case] = c
    return out


def run(mongodb_uri: str | None, *, n: int = DEFAULT_N, http_n: int = DEFAULT_HTTP_N,
        delivery_n: int = DEFAULT_DELIVERY_N, rounds: int = DEFAULT_ROUNDS,
        cases: list[str] | None = None, json_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    from ..embedded import URI_ENV, EmbeddedServer
    from .ingest._serve import ServeProcess, free_port

    cases = list(cases or CASES)
    uri = mongodb_uri or os.environ.get(URI_ENV) or None
    embedded = None if uri else EmbeddedServer().start()
    db = f"bqbench_sdk_{os.getpid()}"
    env = {URI_ENV: uri or embedded.uri, "BUCKETQ_DATABASE": db,  # type: ignore[union-attr]
           # The buffer with the bucketq transport: 200 means durable in a bucketq queue.
           "RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "bucketq",
           "RESERVOIR_BUFFER_STREAM_PREFIX": db}  # fmt: skip
    serve = ServeProcess(env)
    results: dict[str, Any] = {"cases": {}, "rounds": [], "env": {
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "n": n, "http_n": http_n, "rounds": rounds,
        "load_average": os.getloadavg(),
        "mongodb": "embedded SecantusDB" if embedded else "given URI",
        "serve": "buffer on, bucketq transport"}}  # fmt: skip
    try:
        print("starting bucketq serve ...", file=sys.stderr)
        serve.start()
        key = serve.create_key("bench-sdk")
        child_env = {**os.environ, **serve.env}
        dead = f"http://127.0.0.1:{free_port()}"
        for rnd in range(rounds):
            # Every case once per round, the order turned by one each round: a case is not
            # always the one after the server's busiest moment (its replay of the spill).
            order = cases[rnd % len(cases) :] + cases[: rnd % len(cases)]
            this: dict[str, Any] = {}
            for case in order:
                with tempfile.TemporaryDirectory(prefix="bucketq-bench-sdk-") as spill:
                    url = dead if case == "sdk_down" else serve.url
                    count = http_n if case == "http" else n
                    print(f"round {rnd + 1}/{rounds}, caller cost: {LABELS[case]} "
                          f"({count:,} calls) ...", file=sys.stderr)  # fmt: skip
                    if case == "sdk_full":
                        os.kill(serve.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                    try:
                        res = _run_child(["child", case, url, key, str(count), spill], child_env)
                    finally:
                        if case == "sdk_full":
                            os.kill(serve.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
                    this[case] = res
            results["rounds"].append({c: this[c] for c in cases})
        results["cases"] = summarize(results["rounds"])
        with tempfile.TemporaryDirectory(prefix="bucketq-bench-sdk-") as spill:
            print(f"delivery: {delivery_n:,} records end to end ...", file=sys.stderr)
            results["delivery"] = _run_child(
                ["delivery", serve.url, key, str(delivery_n), spill], child_env
            )
        print(f"server ceiling: {delivery_n:,} records by direct POSTs ...", file=sys.stderr)
        results["ceiling"] = _run_child(["ceiling", serve.url, key, str(delivery_n)], child_env)
    finally:
        serve.stop()
        serve.close()
        if embedded is not None:
            embedded.stop()
        elif uri:
            try:
                from pymongo import MongoClient

                MongoClient(uri).drop_database(db)
            except Exception as exc:  # noqa: BLE001 - clean-up is best effort
                print(f"could not drop {db}: {exc}", file=sys.stderr)
    _report(results)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


def _range(c: dict[str, Any], fig: str, fmt: str = "{:,.1f}") -> str:
    lo, hi = c[fig + "_range"]
    if c["rounds"] == 1:
        return fmt.format(c[fig])
    return f"{fmt.format(c[fig])} ({fmt.format(lo)}-{fmt.format(hi)})"


def _report(results: dict[str, Any]) -> None:
    cases = results["cases"]
    rounds = results["env"].get("rounds", 1)
    http = cases.get("http")
    print()
    load = ", ".join(f"{x:.2f}" for x in results["env"].get("load_average", ()))
    print(f"caller cost, median of {rounds} round(s) (range in brackets); "
          f"load average at the start: {load}")  # fmt: skip
    print("| case | calls | p50 µs | p99 µs | p99 / FileHandler p99 (target ≤ "
          f"{P99_TARGET}x) | p99.9 µs | max µs | caller CPU µs/call | "
          "HTTPHandler p99 / this p99 | RSS growth KiB |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case, c in cases.items():
        vs_file = ""
        if "p99_vs_file" in c:
            met = "met" if c["p99_vs_file"] <= P99_TARGET else "missed"
            vs_file = f"{_range(c, 'p99_vs_file', '{:.2f}')}x, {met}"
        vs_http = f"{http['p99_us'] / c['p99_us']:,.0f}x" if http and case != "http" else ""
        print(f"| {LABELS[case]} | {c['n']:,} | {_range(c, 'p50_us')} | {_range(c, 'p99_us')} | "
              f"{vs_file} | {_range(c, 'p999_us', '{:,.0f}')} | {_range(c, 'max_us', '{:,.0f}')} | "
              f"{_range(c, 'caller_cpu_us_per_call')} | {vs_http} | "
              f"{_range(c, 'rss_growth_kib', '{:,.0f}')} |")  # fmt: skip
    d = results.get("delivery")
    if d:
        print(f"\ndelivery: {d['n']:,} records in {d['seconds']:.2f} s = "
              f"{d['records_per_s']:,.0f} records/s end to end ({d['via_spill']:,} went through "
              f"the spill and its replay; the log calls took {d['log_seconds']:.2f} s)")  # fmt: skip
    c = results.get("ceiling")
    if c:
        print(f"server ceiling: {c['records_per_s']:,.0f} records/s from two threads POSTing "
              f"{c.get('batch', 100)}-record batches directly (SDK delivery / ceiling: "
              f"{(d or {}).get('records_per_s', 0) / max(c['records_per_s'], 1e-9):.2f})")  # fmt: skip
    last = results["rounds"][-1] if results.get("rounds") else {}
    for case in ("sdk_down", "sdk_full"):
        if case in last:
            st = last[case].get("stats", {})
            print(f"{LABELS[case]}, last round: RSS KiB at each quarter {last[case]['rss_kib']}; "
                  f"queued {st.get('queued')}, spilled {st.get('spilled')}, "
                  f"lost {st.get('lost_total')}")  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .cli import add_bench_parser, add_run_arguments

    p = add_bench_parser(sub, "sdk", "the logging SDK: caller cost of a log call (server up, stopped, "
                         "queue full) beside FileHandler and HTTPHandler; delivery records/s; memory",
                         __doc__)  # fmt: skip
    p.add_argument(
        "--n",
        type=v.cli_count(1),
        default=DEFAULT_N,
        help=f"calls per case (default {DEFAULT_N:,})",
    )
    p.add_argument("--http-n", type=v.cli_count(1), default=DEFAULT_HTTP_N,
                   help=f"calls through HTTPHandler (default {DEFAULT_HTTP_N:,}; each is a round trip)")  # fmt: skip
    p.add_argument("--delivery-n", type=v.cli_count(1), default=DEFAULT_DELIVERY_N,
                   help=f"records for the delivery rate (default {DEFAULT_DELIVERY_N:,})")  # fmt: skip
    p.add_argument("--rounds", type=v.cli_count(1), default=DEFAULT_ROUNDS,
                   help=f"rounds of every case, interleaved; figures are their medians "
                        f"(default {DEFAULT_ROUNDS})")  # fmt: skip
    add_run_arguments(p, "bucketq bench sdk", run, only=("case", CASES))
    return p


def _main(argv: list[str]) -> int:
    kind = argv[0]
    if kind == "child":
        case, url, key, n, spill = argv[1:6]
        out = _child(case, url, key, int(n), spill)
    elif kind == "ceiling":
        url, key, n = argv[1:4]
        out = _ceiling(url, key, int(n))
    else:
        url, key, n, spill = argv[1:5]
        out = _delivery(url, key, int(n), spill)
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(_main(sys.argv[1:]))
