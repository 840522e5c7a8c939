"""``bucketq bench stream-wake``: how long a stream consumer waiting in ``next_batch``
takes to return a bucket once it is stored.

One producer pushes ``--n`` items, one bucket each (``push(..., durable=True)``), with a
random pause between them (``--gap-min``..``--gap-max`` seconds, so the consumer is idle
and waiting each time, as a consumer of a quiet stream is); one consumer reads them with
``next_batch`` and acknowledges each. Latency is from the producer's receipt (the insert
acknowledged) to ``next_batch`` returning the bucket, on this machine's one clock; the
time from the push call (before the insert) is shown beside it. Modes:

- ``change-stream``: the producer in another process, the consumer woken by its change
  stream (``change_streams`` left on: what a consumer gets where the server has them);
- ``polling``: the same with ``change_streams=False`` (what it gets without them: reads
  every 40 ms, doubling to ``poll_interval``, 1 s, while idle);
- ``same-process``: the producer a thread pushing through the consumer's own stream
  object, ``change_streams=False`` (woken by its own writes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import _validate as v

MODES = ("change-stream", "polling", "same-process")
DEFAULT_N = 200
DEFAULT_GAP_MIN = 0.02
DEFAULT_GAP_MAX = 0.25
STREAM = "wake"


def _produce(q: Any, n: int, gap_min: float, gap_max: float, seed: int) -> dict[str, list[float]]:
    """Push ``n`` items one bucket each, pausing between them; the push and receipt times."""
    rng = random.Random(seed)
    pushed, received = [], []
    for k in range(n):
        time.sleep(rng.uniform(gap_min, gap_max))
        t0 = time.time()
        q.push({"k": k}, durable=True)
        received.append(time.time())
        pushed.append(t0)
    return {"pushed": pushed, "received": received}


def _consume(c: Any, n: int) -> tuple[list[float], list[int]]:
    """Read ``n`` items; when each came back from next_batch, and their ks."""
    got = [0.0] * n
    order: list[int] = []
    while len(order) < n:
        b = c.next_batch(timeout=60)
        t = time.time()
        if b is None:
            raise RuntimeError(f"no bucket came within 60 s ({len(order)} of {n} read)")
        for item in b.items:
            got[item["k"]] = t
            order.append(item["k"])
        c.ack(b.seq)
    return got, order


def _percentiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    n = len(s)
    return {"p50_ms": s[min(n - 1, int(0.50 * n))], "p95_ms": s[min(n - 1, int(0.95 * n))],
            "max_ms": s[-1], "mean_ms": sum(s) / n}  # fmt: skip


def _run_mode(
    mode: str, uri: str, db_name: str, n: int, gap: tuple[float, float]
) -> dict[str, Any]:
    from pymongo import MongoClient

    from ..stream import StreamQueue

    client: MongoClient = MongoClient(uri)
    name = f"{STREAM}_{mode.replace('-', '_')}"
    q = StreamQueue(
        client[db_name], name, change_streams=None if mode == "change-stream" else False
    )
    c = q.consumer()
    load = [os.getloadavg()[0]]
    try:
        if mode == "same-process":
            out: dict[str, Any] = {}
            t = threading.Thread(
                target=lambda: out.update(_produce(q, n, *gap, seed=1)), name="bench-producer"
            )
            t.start()
            got, order = _consume(c, n)
            t.join()
            prod = out
        else:
            args = [sys.executable, "-m", "bucketq.benchmark.stream_wake", "producer", uri,
                    db_name, name, str(n), str(gap[0]), str(gap[1])]  # fmt: skip
            p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                got, order = _consume(c, n)
                stdout, stderr = p.communicate(timeout=120)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if p.returncode != 0:
                raise RuntimeError(f"the producer process failed:\n{stderr[-3000:]}")
            prod = json.loads(stdout.strip().splitlines()[-1])
        load.append(os.getloadavg()[0])
        stats = q.stats()
    finally:
        c.close()
        q.close()
        client.close()
    if order != list(range(n)):
        raise RuntimeError(f"{mode}: the items came out of order")
    from_receipt = [(g - r) * 1000 for g, r in zip(got, prod["received"], strict=True)]
    from_push = [(g - p) * 1000 for g, p in zip(got, prod["pushed"], strict=True)]
    return {"mode": mode, "n": n, "from_receipt": _percentiles(from_receipt),
            "from_push": _percentiles(from_push), "load_avg_1m": load,
            "change_stream_events": stats["change_stream_events"],
            "change_stream_fallbacks": stats["change_stream_fallbacks"]}  # fmt: skip


def run(mongodb_uri: str | None, *, n: int = DEFAULT_N, gap_min: float = DEFAULT_GAP_MIN,
        gap_max: float = DEFAULT_GAP_MAX, modes: list[str] | None = None,
        json_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    from ..embedded import EmbeddedServer

    if gap_max < gap_min:
        raise RuntimeError(f"--gap-max ({gap_max}) must be at least --gap-min ({gap_min})")
    uri = v.mongodb_uri(mongodb_uri, running_store=False) or None
    embedded = None if uri else EmbeddedServer().start()
    uri = uri or embedded.uri  # type: ignore[union-attr]
    db_name = f"bqbench_wake_{os.getpid()}"
    results: dict[str, Any] = {"modes": {}, "env": {
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "n": n, "gap_s": [gap_min, gap_max],
        "mongodb": "embedded SecantusDB" if embedded else "given URI"}}  # fmt: skip
    try:
        for mode in modes or MODES:
            print(f"{mode}: {n} buckets, {gap_min:g}-{gap_max:g} s apart ...", file=sys.stderr)
            results["modes"][mode] = _run_mode(mode, uri, db_name, n, (gap_min, gap_max))
    finally:
        try:
            from pymongo import MongoClient

            MongoClient(uri).drop_database(db_name)
        except Exception as exc:  # noqa: BLE001 - clean-up is best effort
            print(f"could not drop {db_name}: {exc}", file=sys.stderr)
        if embedded is not None:
            embedded.stop()
    _report(results)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    return results


def _report(results: dict[str, Any]) -> None:
    print()
    print("| mode | buckets | receipt -> next_batch p50 / p95 / max ms | "
          "push -> next_batch p50 / p95 / max ms | change events | load avg (1 min) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for mode, r in results["modes"].items():
        a, b = r["from_receipt"], r["from_push"]
        fell = " (no change streams: polled)" if r["change_stream_fallbacks"] else ""
        print(f"| {mode}{fell} | {r['n']} | {a['p50_ms']:.1f} / {a['p95_ms']:.1f} / "
              f"{a['max_ms']:.1f} | {b['p50_ms']:.1f} / {b['p95_ms']:.1f} / {b['max_ms']:.1f} | "
              f"{r['change_stream_events']} | "
              f"{' -> '.join(f'{x:.1f}' for x in r['load_avg_1m'])} |")  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .cli import add_bench_parser, add_run_arguments

    p = add_bench_parser(sub, "stream-wake", "stream mode: from a bucket's insert until a waiting "
                         "next_batch returns it, change streams vs polling", __doc__)  # fmt: skip
    p.add_argument("--n", type=v.cli_count(1), default=DEFAULT_N,
                   help=f"buckets per mode (default {DEFAULT_N})")  # fmt: skip
    p.add_argument("--gap-min", type=v.cli_number(0, unit="seconds"), default=DEFAULT_GAP_MIN,
                   help=f"shortest pause between two pushes, s (default {DEFAULT_GAP_MIN})")  # fmt: skip
    p.add_argument("--gap-max", type=v.cli_number(0, unit="seconds"), default=DEFAULT_GAP_MAX,
                   help=f"longest pause between two pushes, s (default {DEFAULT_GAP_MAX})")  # fmt: skip
    add_run_arguments(p, "bucketq bench stream-wake", run, only=("mode", MODES))
    return p


def _producer_main(argv: list[str]) -> int:
    from pymongo import MongoClient

    from ..stream import StreamQueue

    uri, db_name, name, n, gap_min, gap_max = argv
    client: MongoClient = MongoClient(uri)
    q = StreamQueue(client[db_name], name)
    out = _produce(q, int(n), float(gap_min), float(gap_max), seed=1)
    q.close()
    client.close()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["producer"]:
        sys.exit(
            "usage: python -m bucketq.benchmark.stream_wake producer URI DB STREAM N GAP_MIN GAP_MAX"
        )
    sys.exit(_producer_main(sys.argv[2:]))
