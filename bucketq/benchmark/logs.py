"""``bucketq bench logs``: what the log store's reads cost as a project grows, and what
a project's readers do to another project's ingest.

1. **Reads by project size**: projects of 10,000, 100,000 and 1,000,000 records (built
   straight from bucket documents: ``LogStore.insert_buckets``, no HTTP), then, on each,
   the newest page, a filtered page (service and level), a text search page, the page
   after ten pages, a trace lookup and the count of a filter, each timed ``repeat``
   times (median and p95) with the buckets and records each read; flat figures are the
   point.
2. **A neighbour's ingest**: ``bucketq serve`` on the same store; a neighbour project
   ingests at a constant rate (open loop, latency from the scheduled send) for a quiet
   window, then for a window while ``readers`` clients read the largest project's pages
   as fast as they are answered; its p99 in both, and their ratio (target: within 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import _validate as v

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
#: Records a built bucket holds (what a buffered flush of a busy project writes).
BUILD_BUCKET = 500
#: The built projects' records: this many a second, ending now.
BUILD_RATE = 200.0
SERVICES = ("api", "web", "worker", "billing", "auth")
BIG = "bench-big"
NEIGHBOUR = "bench-neighbour"
#: The neighbour's ingest: requests a second, records a request.
NEIGHBOUR_RATE, NEIGHBOUR_BATCH = 20.0, 10


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "logs",
        help="the log store's reads at 10k/100k/1M records, and a neighbour's ingest while "
        "readers hammer a large project",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="10k and 100k records, shorter windows")
    p.add_argument("--sizes", help="comma-separated project sizes (default 10000,100000,1000000)")
    p.add_argument("--repeat", type=int, default=15, help="timings per read (default 15)")
    p.add_argument(
        "--readers", type=int, default=8, help="readers of the large project (default 8)"
    )
    p.add_argument(
        "--window", type=float, help="seconds of each neighbour window (default 20, quick 10)"
    )
    p.add_argument("--no-neighbour", action="store_true", help="skip the neighbour's ingest part")
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    v.add_mongodb_uri(p, v.STARTS_ONE)
    p.set_defaults(func=run_from_args)
    return p


def run_from_args(args: argparse.Namespace) -> int:
    sizes = (
        tuple(int(x) for x in args.sizes.split(","))
        if args.sizes
        else (QUICK_SIZES if args.quick else SIZES)
    )
    window = args.window or (10.0 if args.quick else 20.0)

    def body() -> None:
        out = run(args.mongodb_uri, sizes=sizes, repeat=args.repeat, readers=args.readers,
                  window=window, neighbour=not args.no_neighbour)  # fmt: skip
        out["settings"] = {"sizes": list(sizes), "repeat": args.repeat, "readers": args.readers,
                           "window_s": window, "neighbour": not args.no_neighbour}  # fmt: skip
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2, default=str)
            print(f"figures written to {args.json}")

    from .cli import run_command

    # The machine and its load while it ran go into the JSON, as for every bench command.
    return run_command("bucketq bench logs", body, args.json)


def _records(start: datetime, n: int, base: int) -> list[dict[str, Any]]:
    out = []
    step = timedelta(seconds=1 / BUILD_RATE)
    for i in range(n):
        k = base + i
        level = "error" if k % 97 == 0 else "warn" if k % 13 == 0 else "info"
        out.append({
            "_id": f"build{k // BUILD_BUCKET}.{k % BUILD_BUCKET}",
            "time": start + step * i,
            "service": SERVICES[k % len(SERVICES)],
            "level": level,
            "message": f"GET /api/orders/{k} 200 served; user=u{k % 1000} region=eu-west-1"
            + (" needle" if k % 1000 == 7 else ""),
            "metadata": {"seq": k, "region": "eu-west-1"},
            "trace_id": f"{k // 20:032x}",
        })  # fmt: skip
    return out


async def build(store: Any, project: str, n: int) -> dict[str, Any]:
    """``n`` records of ``project`` ending now, inserted as bucket documents."""
    from ..reservoir import build_bucket

    t0 = time.perf_counter()
    start = datetime.now(UTC) - timedelta(seconds=n / BUILD_RATE)
    docs = []
    for b in range(0, n, BUILD_BUCKET):
        m = min(BUILD_BUCKET, n - b)
        recs = _records(start + timedelta(seconds=b / BUILD_RATE), m, b)
        docs.append(build_bucket(project, f"build{b // BUILD_BUCKET}", recs))
        if len(docs) == 20:
            await store.insert_buckets(docs)
            docs = []
    if docs:
        await store.insert_buckets(docs)
    s = time.perf_counter() - t0
    return {"records": n, "seconds": round(s, 2), "records_per_s": round(n / s)}


async def _timed(fn: Any, repeat: int) -> dict[str, Any]:
    times: list[float] = []
    last: Any = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = await fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    info: dict[str, Any] = {"median_ms": round(1000 * statistics.median(times), 1),
                            "p95_ms": round(1000 * p95, 1)}  # fmt: skip
    if isinstance(last, list):
        info["records"] = len(last)
        return info
    for k in ("buckets_read", "records_unpacked", "count", "exact"):
        if hasattr(last, k):
            info[k] = getattr(last, k)
    if hasattr(last, "records"):
        info["records"] = len(last.records)
    return info


async def reads(store: Any, project: str, n: int, repeat: int) -> dict[str, Any]:
    from ..reservoir import LogFilter

    async def deep() -> Any:
        before = None
        page: Any = None
        for _ in range(10):
            page = await store.page(project, LogFilter(before=before), limit=100)
            before = page.next_before
        return page

    old_trace = f"{(n // 10) // 20:032x}"  # a trace of the oldest tenth
    return {
        "newest page (100)": await _timed(lambda: store.page(project, limit=100), repeat),
        "filtered page (service+level, 50)": await _timed(
            lambda: store.page(project, LogFilter(service="billing", level="error"), limit=50), repeat),
        "text search page (q, 20)": await _timed(
            lambda: store.page(project, LogFilter(q="needle"), limit=20), repeat),
        "11th page (cursor)": await _timed(deep, max(3, repeat // 5)),
        "trace lookup (an old trace)": await _timed(lambda: store.trace(project, old_trace), repeat),
        "count (level=error)": await _timed(lambda: store.count(project, LogFilter(level="error")), max(3, repeat // 3)),
    }  # fmt: skip


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(
    uri: str | None,
    *,
    sizes: tuple[int, ...] = SIZES,
    repeat: int = 15,
    readers: int = 8,
    window: float = 20.0,
    neighbour: bool = True,
) -> dict[str, Any]:
    from ..embedded import EmbeddedServer

    uri = v.mongodb_uri(uri, running_store=False) or None
    embedded = None if uri else EmbeddedServer().start()
    server_uri = uri or str(embedded.uri)  # type: ignore[union-attr]
    database = f"bqbench_logs_{os.urandom(4).hex()}"
    out: dict[str, Any] = {"server": "embedded SecantusDB" if embedded else "given URI",
                           "load_average_start": os.getloadavg(), "sizes": {}}  # fmt: skip
    print(f"bucketq bench logs: projects of {', '.join(f'{s:,}' for s in sizes)} records on "
          f"{out['server']} [load {_load()}]", flush=True)  # fmt: skip
    try:
        out["sizes"] = asyncio.run(_sizes(server_uri, database, sizes, repeat))
        if neighbour:
            out["neighbour"] = _neighbour(server_uri, database, max(sizes), readers, window)
    finally:
        with contextlib.suppress(Exception):
            from pymongo import MongoClient

            MongoClient(server_uri).drop_database(database)
        if embedded is not None:
            embedded.stop()
    out["load_average_end"] = os.getloadavg()
    return out


async def _sizes(uri: str, database: str, sizes: tuple[int, ...], repeat: int) -> dict[str, Any]:
    from pymongo import AsyncMongoClient

    from ..reservoir import LogStore

    client: Any = AsyncMongoClient(uri, tz_aware=True)
    out: dict[str, Any] = {}
    try:
        store = LogStore(client[database], retention_days=None)
        await store.create_indexes()
        for n in sizes:
            project = BIG if n == max(sizes) else f"bench-{n}"
            b = await build(store, project, n)
            print(f"built {n:,} records in {b['seconds']:g} s ({b['records_per_s']:,} records/s) "
                  f"[load {_load()}]", flush=True)  # fmt: skip
            r = await reads(LogStore(client[database], retention_days=None), project, n, repeat)
            for what, f in r.items():
                extra = ", ".join(
                    f"{k} {f[k]}" for k in ("records", "buckets_read", "count", "exact") if k in f
                )
                print(f"  {n:>9,} records: {what:<36} median {f['median_ms']:>7.1f} ms, p95 "
                      f"{f['p95_ms']:>7.1f} ms ({extra}) [load {_load()}]", flush=True)  # fmt: skip
            out[str(n)] = {"build": b, "reads": r}
    finally:
        await client.close()
    return out


def _neighbour(uri: str, database: str, big: int, readers: int, window: float) -> dict[str, Any]:
    """The neighbour's ingest latency, quiet and while ``readers`` read the big project."""
    from .ingest._load import LoadProcess, LoadSpec
    from .ingest._serve import ServeProcess
    from .ingest._stats import latency_summary

    serve = ServeProcess({v.MONGODB_URI_ENV: uri, "BUCKETQ_DATABASE": database,
                          "RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "memory"})  # fmt: skip
    serve.start()
    try:
        big_key, key = serve.create_key(BIG), serve.create_key(NEIGHBOUR)
        result: dict[str, Any] = {
            # "quiet" and "readers" hold the two windows' figures.
            "reader_clients": readers,
            "window_s": window,
            "rate": NEIGHBOUR_RATE,
            "batch": NEIGHBOUR_BATCH,
            "big_project_records": big,
        }
        for phase in ("quiet", "readers"):
            hammer = _Readers(serve.url, big_key, readers if phase == "readers" else 0)
            with hammer:
                spec = LoadSpec(url=f"{serve.url}/api/v1/ingest", rate=NEIGHBOUR_RATE,
                                duration=window, batch=NEIGHBOUR_BATCH, run_id=phase,
                                headers={"X-API-Key": key})  # fmt: skip
                load = LoadProcess(spec).start()
                load.go()
                res = load.result(timeout=window + 120)
            lat = [s.latency for s in res["samples"] if s.latency is not None]
            errors = sum(1 for s in res["samples"] if not s.ok)
            summary = latency_summary(lat)
            result[phase] = {**summary, "errors": errors, "reads": hammer.reads,
                             "read_status": hammer.status, "load_average": os.getloadavg()}  # fmt: skip
            line = (f"neighbour ingest, {phase}: p50 {summary['p50_ms']:.1f} ms, p95 {summary['p95_ms']:.1f} ms, "
                    f"p99 {summary['p99_ms']:.1f} ms, errors {errors}")  # fmt: skip
            if phase == "readers":
                line += (f"; {hammer.reads} reads of the {big:,}-record project by {readers} readers, "
                         f"answers {hammer.status}")  # fmt: skip
            print(f"{line} [load {_load()}]", flush=True)
        q, r = result["quiet"]["p99_ms"], result["readers"]["p99_ms"]
        result["p99_ratio"] = None if not q or r is None else r / q
        if result["p99_ratio"] is not None:
            print(f"neighbour p99 with readers / quiet: {result['p99_ratio']:.2f}x (target ≤ 2x)")
        return result
    finally:
        serve.stop()
        serve.close()


class _Readers:
    """``n`` threads reading a project's pages as fast as they are answered (a 429 waits
    a tenth of its Retry-After), until the block ends."""

    PATHS = ("/api/v1/logs?limit=100", "/api/v1/logs?limit=50&service=billing&level=error",
             "/api/v1/logs?limit=20&q=needle")  # fmt: skip

    def __init__(self, url: str, key: str, n: int) -> None:
        self.url, self.key, self.n = url, key, n
        self.stop = threading.Event()
        self.reads = 0
        self.status: dict[int, int] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)
        ]

    def _run(self, i: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, headers={"X-API-Key": self.key}, timeout=30) as c:
            k = i
            while not self.stop.is_set():
                r = c.get(self.PATHS[k % len(self.PATHS)])
                k += 1
                self.reads += 1
                self.status[r.status_code] = self.status.get(r.status_code, 0) + 1
                if r.status_code == 429:
                    time.sleep(float(r.headers.get("Retry-After", "1")) / 10)

    def __enter__(self) -> _Readers:
        for t in self.threads:
            t.start()
        if self.threads:
            time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
