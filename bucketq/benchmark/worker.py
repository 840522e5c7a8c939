"""``bucketq bench worker``: the worker's cost per item over a hand-written
reserve/commit loop, both consuming the same N items on the same server, in one run.

Each round pushes ``--n`` items (~100-byte payloads, stored before the clock starts)
into a fresh queue per contender, then one consumer takes them all and stops (the
state flushed: ``drain()``). The handler does the least a handler does (reads the
payload), so what is measured is the loop around it. Contenders:

- ``loop``: ``while``: ``m = q.reserve(timeout)``, ``handler(m)``, ``q.commit(m)``,
  then ``q.drain()`` (a ``Queue``);
- ``consume``: ``q.consume(handler, max_items=N)`` (a ``Queue``, one sync handler:
  ``concurrency=1``);
- ``async loop`` and ``async consume``: the same on an ``AsyncQueue`` with an async
  handler.

The contenders run interleaved, each round in the other order, and the figures are the
medians of the rounds: items/s, wall and client CPU (process time: the queue's own
threads too) per item, and each ``consume`` beside its ``loop`` (target: at most 1.10x
the loop's time per item).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .. import _validate as v
from ._workload import payload

CONTENDERS = ("loop", "consume", "async loop", "async consume")
#: Each ``consume`` and the loop it is compared with.
PAIRS = {"consume": "loop", "async consume": "async loop"}
TARGET = 1.10
DEFAULT_N = 20_000
DEFAULT_ROUNDS = 5
PUSH_CHUNK = 1000


def _handler(m: Any) -> None:
    m.payload["i"]


async def _async_handler(m: Any) -> None:
    m.payload["i"]


def _fill(db: Any, name: str, n: int) -> None:
    from ..queue import Queue

    q = Queue(db, name)
    for lo in range(0, n, PUSH_CHUNK):
        q.push_many([payload(i) for i in range(lo, min(lo + PUSH_CHUNK, n))])
    q.flush()
    q.close()


def _loop(db: Any, name: str, n: int) -> int:
    from ..queue import Queue

    q = Queue(db, name)
    done = 0
    while done < n:
        m = q.reserve(timeout=60)
        if m is None:
            break
        _handler(m)
        q.commit(m)
        done += 1
    q.drain(timeout=0)
    q.close()
    return done


def _consume(db: Any, name: str, n: int) -> int:
    from ..queue import Queue

    q = Queue(db, name)
    report = q.consume(_handler, max_items=n, signals=False)
    q.close()
    return int(report["committed"])


async def _async_loop(uri: str, db_name: str, name: str, n: int) -> int:
    from pymongo import AsyncMongoClient

    from ..queue import AsyncQueue

    client: AsyncMongoClient = AsyncMongoClient(uri)
    q = AsyncQueue(client[db_name], name)
    done = 0
    while done < n:
        m = await q.reserve(timeout=60)
        if m is None:
            break
        await _async_handler(m)
        await q.commit(m)
        done += 1
    await q.drain(timeout=0)
    await q.close()
    await client.close()
    return done


async def _async_consume(uri: str, db_name: str, name: str, n: int) -> int:
    from pymongo import AsyncMongoClient

    from ..queue import AsyncQueue

    client: AsyncMongoClient = AsyncMongoClient(uri)
    q = AsyncQueue(client[db_name], name)
    report = await q.consume(_async_handler, max_items=n, signals=False)
    await q.close()
    await client.close()
    return int(report["committed"])


def _one(contender: str, uri: str, db: Any, name: str, n: int) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    if contender == "loop":
        done = _loop(db, name, n)
    elif contender == "consume":
        done = _consume(db, name, n)
    elif contender == "async loop":
        done = asyncio.run(_async_loop(uri, db.name, name, n))
    else:
        done = asyncio.run(_async_consume(uri, db.name, name, n))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    left = db[name].count_documents({})
    if done != n or left:
        raise RuntimeError(f"{contender}: {done} of {n} items handled, {left} bucket(s) left")
    return {"items_per_s": n / wall, "wall_us": wall / n * 1e6, "cpu_us": cpu / n * 1e6}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run(mongodb_uri: str | None, *, n: int = DEFAULT_N, rounds: int = DEFAULT_ROUNDS,
        contenders: list[str] | None = None, json_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    from pymongo import MongoClient

    from ..embedded import EmbeddedServer

    names = [c for c in CONTENDERS if c in (contenders or CONTENDERS)]
    uri = v.mongodb_uri(mongodb_uri, running_store=False) or None
    embedded = None if uri else EmbeddedServer().start()
    uri = uri or embedded.uri  # type: ignore[union-attr]
    client: MongoClient = MongoClient(uri)
    db = client[f"bqbench_worker_{os.getpid()}"]
    per: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    load = [os.getloadavg()[0]]
    try:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for c in order:
                name = f"w{r}_{c.replace(' ', '_')}"
                _fill(db, name, n)
                print(f"round {r + 1}/{rounds}: {c}, {n} items ...", file=sys.stderr)
                per[c].append(_one(c, uri, db, name, n))
        load.append(os.getloadavg()[0])
    finally:
        client.drop_database(db.name)
        client.close()
        if embedded is not None:
            embedded.stop()
    results: dict[str, Any] = {"contenders": {}, "env": {
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "n": n, "rounds": rounds, "load_avg_1m": load,
        "mongodb": "embedded SecantusDB" if embedded else "given URI"}}  # fmt: skip
    for c, rows in per.items():
        out: dict[str, Any] = {k: _median(rows, k) for k in ("items_per_s", "wall_us", "cpu_us")}
        out["rounds"] = rows
        base = PAIRS.get(c)
        if base in per:
            ratios = [a["wall_us"] / b["wall_us"] for a, b in zip(rows, per[base], strict=True)]
            cpu = [a["cpu_us"] / b["cpu_us"] for a, b in zip(rows, per[base], strict=True)]
            out.update(vs=base, wall_ratio=statistics.median(ratios), wall_ratios=ratios,
                       cpu_ratio=statistics.median(cpu), target=TARGET,
                       met=statistics.median(ratios) <= TARGET)  # fmt: skip
        results["contenders"][c] = out
    _report(results)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    return results


def _report(results: dict[str, Any]) -> None:
    env = results["env"]
    print()
    print(f"worker overhead: {env['n']} items per run, median of {env['rounds']} round(s), "
          f"{env['mongodb']}, load avg (1 min) "
          f"{' -> '.join(f'{x:.1f}' for x in env['load_avg_1m'])}")  # fmt: skip
    print()
    print("| contender | items/s | wall µs/item | CPU µs/item | time per item vs loop "
          f"(target ≤ {TARGET:.2f}x) | CPU vs loop |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for c, r in results["contenders"].items():
        vs = cpu = "-"
        if "wall_ratio" in r:
            verdict = "met" if r["met"] else "missed"
            vs = f"{r['wall_ratio']:.2f}x ({verdict})"
            cpu = f"{r['cpu_ratio']:.2f}x"
        print(f"| {c} | {r['items_per_s']:,.0f} | {r['wall_us']:.1f} | {r['cpu_us']:.1f} | "
              f"{vs} | {cpu} |")  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .cli import add_bench_parser, add_run_arguments

    p = add_bench_parser(sub, "worker", "the worker (Queue.consume) against a hand-written "
                         "reserve/commit loop: cost per item", __doc__)  # fmt: skip
    p.add_argument("--n", type=v.cli_count(1), default=DEFAULT_N,
                   help=f"items per run (default {DEFAULT_N:,})")  # fmt: skip
    p.add_argument("--rounds", type=v.cli_count(1), default=DEFAULT_ROUNDS,
                   help=f"rounds; figures are their medians (default {DEFAULT_ROUNDS})")  # fmt: skip
    add_run_arguments(p, "bucketq bench worker", run, only=("contender", CONTENDERS))
    return p
