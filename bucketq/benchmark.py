"""The lifecycle benchmark behind ``bucketq bench``: bucketq against the per-element
queue, side by side in one run on one server (see BENCHMARKS.md).

Per contender: N items of ~100-byte JSON-like payloads pushed until durable, then
reserved and committed until the queue is empty and the state is flushed. Reports
push/s, consume/s, end-to-end items/s, MongoDB commands per 1,000 items by command,
and client CPU microseconds per item next to the BSON floor (each payload encoded
once and decoded once).
"""

from __future__ import annotations

import asyncio
import json
import platform
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import bson
import pymongo
from pymongo import AsyncMongoClient, MongoClient, monitoring

from . import __version__
from .embedded import mongodb
from .queue import AsyncElementQueue, AsyncQueue, ElementQueue, Queue

__all__ = ["Result", "payload", "bson_floor_us", "run"]


def payload(i: int) -> dict[str, Any]:
    """About 100 bytes as JSON, like a small log record."""
    return {"i": i, "svc": "checkout", "level": "info", "msg": f"order {i:08d} paid", "user": f"u{i % 997:04d}"}


class CommandCounter(monitoring.CommandListener):
    """Counts the commands this process sends, by name (pymongo command monitoring)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.enabled = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.enabled:
            with self._lock:
                self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> dict[str, int]:
        with self._lock:
            out = dict(self.counts)
            self.counts.clear()
        return out


_IGNORED_COMMANDS = {"hello", "isMaster", "ismaster", "ping", "endSessions", "killCursors", "createIndexes"}


@dataclass
class Result:
    contender: str
    n: int
    push_s: float
    consume_s: float
    cpu_s: float
    commands: dict[str, int] = field(default_factory=dict)

    @property
    def push_rate(self) -> float:
        return self.n / self.push_s if self.push_s else 0.0

    @property
    def consume_rate(self) -> float:
        return self.n / self.consume_s if self.consume_s else 0.0

    @property
    def e2e_rate(self) -> float:
        total = self.push_s + self.consume_s
        return self.n / total if total else 0.0

    @property
    def commands_per_1000(self) -> float:
        real = sum(v for k, v in self.commands.items() if k not in _IGNORED_COMMANDS)
        return 1000 * real / self.n if self.n else 0.0

    @property
    def cpu_us_per_item(self) -> float:
        return 1e6 * self.cpu_s / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            push_per_s=self.push_rate,
            consume_per_s=self.consume_rate,
            end_to_end_per_s=self.e2e_rate,
            commands_per_1000_items=self.commands_per_1000,
            cpu_us_per_item=self.cpu_us_per_item,
        )
        return d


def bson_floor_us(n: int = 20_000) -> float:
    """Client CPU per item of encoding each payload to BSON once and decoding it once."""
    items = [payload(i) for i in range(n)]
    t = time.process_time()
    for enc in [bson.encode(p) for p in items]:
        bson.decode(enc)
    return 1e6 * (time.process_time() - t) / n


Progress = Callable[[str, int], None]  # (phase, items done so far)


def _sync_lifecycle(q: Any, n: int, progress: Progress) -> tuple[float, float]:
    t0 = time.perf_counter()
    step = max(n // 100, 1)
    for i in range(n):
        q.push(payload(i))
        if i % step == 0:
            progress("push", i)
    q.flush()
    progress("push", n)
    t1 = time.perf_counter()
    got = 0
    while got < n:
        m = q.reserve(timeout=30)
        if m is None:
            raise RuntimeError(f"{type(q).__name__}: only {got} of {n} items came back")
        q.commit(m)
        got += 1
        if got % step == 0:
            progress("consume", got)
    q.close()
    progress("consume", n)
    return t1 - t0, time.perf_counter() - t1


async def _async_lifecycle(q: Any, n: int, progress: Progress) -> tuple[float, float]:
    t0 = time.perf_counter()
    step = max(n // 100, 1)
    for i in range(n):
        await q.push(payload(i))
        if i % step == 0:
            progress("push", i)
    await q.flush()
    progress("push", n)
    t1 = time.perf_counter()
    got = 0
    while got < n:
        m = await q.reserve(timeout=30)
        if m is None:
            raise RuntimeError(f"{type(q).__name__}: only {got} of {n} items came back")
        await q.commit(m)
        got += 1
        if got % step == 0:
            progress("consume", got)
    await q.close()
    progress("consume", n)
    return t1 - t0, time.perf_counter() - t1


CONTENDERS = {
    "bucketq Queue": (Queue, False),
    "bucketq AsyncQueue": (AsyncQueue, True),
    "per-element ElementQueue": (ElementQueue, False),
    "per-element AsyncElementQueue": (AsyncElementQueue, True),
}
PER_ELEMENT = {"per-element ElementQueue", "per-element AsyncElementQueue"}


def run_one(uri: str, name: str, n: int, progress: Progress) -> Result:
    """Run one contender in a fresh process, so its CPU time is its own (not the progress
    bar's, nor an earlier contender's garbage)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    proc = ctx.Process(target=_child, args=(uri, name, n, events), daemon=True)
    proc.start()
    try:
        while True:
            try:
                kind, value = events.get(timeout=1.0)
            except Exception:  # noqa: BLE001 - queue.Empty: check the child is alive
                if not proc.is_alive():
                    raise RuntimeError(f"the {name} benchmark process died (exit code {proc.exitcode})") from None
                continue
            if kind == "progress":
                progress(*value)
            elif kind == "error":
                raise RuntimeError(f"{name}: {value}")
            else:
                return Result(**value)
    finally:
        proc.join(10)


def _child(uri: str, name: str, n: int, events: Any) -> None:
    try:
        res = _measure(uri, name, n, CommandCounter(), lambda phase, done: events.put(("progress", (phase, done))))
        events.put(("result", asdict(res)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        events.put(("error", f"{type(exc).__name__}: {exc}"))


def _measure(uri: str, name: str, n: int, counter: CommandCounter, progress: Progress) -> Result:
    cls, is_async = CONTENDERS[name]
    db_name = f"bucketq_bench_{uuid.uuid4().hex[:8]}"
    sync_client: MongoClient = MongoClient(uri, event_listeners=[counter])
    try:
        counter.take()
        cpu0 = time.process_time()
        counter.enabled = True
        if is_async:

            async def go() -> tuple[float, float]:
                client: AsyncMongoClient = AsyncMongoClient(uri, event_listeners=[counter])
                try:
                    return await _async_lifecycle(cls(client[db_name], "bench"), n, progress)
                finally:
                    await client.close()

            push_s, consume_s = asyncio.run(go())
        else:
            push_s, consume_s = _sync_lifecycle(cls(sync_client[db_name], "bench"), n, progress)
        counter.enabled = False
        cpu = time.process_time() - cpu0
        return Result(name, n, push_s, consume_s, cpu, counter.take())
    finally:
        counter.enabled = False
        sync_client.drop_database(db_name)
        sync_client.close()


def run(
    uri: str | None = None,
    *,
    n: int = 100_000,
    element_n: int | None = None,
    contenders: list[str] | None = None,
    json_path: str | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """Run the benchmark and print the table; returns every figure (also written as JSON)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(width=None if sys.stdout.isatty() else 150)
    names = contenders or list(CONTENDERS)
    element_n = element_n or max(n // 100, 500)
    results: list[Result] = []
    with mongodb(uri) as server_uri:
        server = _server_info(server_uri)
        floor = bson_floor_us()
        console.print(
            f"[bold]bucketq bench[/]: {', '.join(names)} on {server['description']} "
            f"({n:,} items; per-element {element_n:,})"
        )
        with Progress(
            TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=False,
        ) as bar:  # fmt: skip
            for name in names:
                count = element_n if name in PER_ELEMENT else n
                push_task = bar.add_task(f"{name}: push", total=count)
                cons_task = bar.add_task(f"{name}: consume", total=count)

                def progress(phase: str, done: int, p=push_task, c=cons_task) -> None:
                    bar.update(p if phase == "push" else c, completed=done)

                results.append(run_one(server_uri, name, count, progress))
    report = _report(results, floor, server, n, element_n)
    _print_table(console, report, results, floor)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2, default=str)
        console.print(f"every figure: {json_path}")
    return report


def _server_info(uri: str) -> dict[str, Any]:
    with MongoClient(uri) as c:
        info = c.server_info()
        hello = c.admin.command("hello")
    embedded = "secantus" in str(hello.get("setName", "")).lower() or "127.0.0.1" in uri and not hello.get("msg")
    kind = "the embedded SecantusDB server" if embedded else "MongoDB"
    return {
        "version": info.get("version"),
        "embedded": embedded,
        "description": f"{kind} {info.get('version')}",
        "write_concern": "server default (w:1)",
    }


def _report(results: list[Result], floor: float, server: dict[str, Any], n: int, element_n: int) -> dict[str, Any]:
    return {
        "bucketq": __version__,
        "python": sys.version.split()[0],
        "pymongo": pymongo.version,
        "platform": platform.platform(),
        "server": server,
        "n": n,
        "per_element_n": element_n,
        "payload_bytes_json": len(json.dumps(payload(0))),
        "payload_bytes_bson": len(bson.encode(payload(0))),
        "bson_floor_us_per_item": floor,
        "processes": 1,
        "results": [r.as_dict() for r in results],
    }


def _print_table(console: Any, report: dict[str, Any], results: list[Result], floor: float) -> None:
    from rich.table import Table

    base = next((r for r in results if r.contender in PER_ELEMENT), None)
    t = Table(title="Lifecycle throughput (items/s; one producer, one consumer, one process)")
    for col in ("contender", "N", "push/s", "consume/s", "end-to-end/s", "vs per-element", "cmds/1k",
                "CPU µs/item", "vs floor"):  # fmt: skip
        t.add_column(col, justify="left" if col == "contender" else "right")
    for r in results:
        ratio = f"{r.e2e_rate / base.e2e_rate:,.1f}x" if base and base.e2e_rate else "-"
        t.add_row(
            r.contender, f"{r.n:,}", f"{r.push_rate:,.0f}", f"{r.consume_rate:,.0f}", f"{r.e2e_rate:,.0f}", ratio,
            f"{r.commands_per_1000:,.1f}", f"{r.cpu_us_per_item:,.1f}", f"{r.cpu_us_per_item / floor:,.1f}x",
        )  # fmt: skip
    console.print(t)
    console.print(
        f"BSON floor: {floor:.2f} µs/item (encode + decode each payload once). "
        f"Payload: {report['payload_bytes_json']} bytes as JSON."
    )
    if report["server"]["embedded"]:
        console.print(
            "[dim]On the embedded SecantusDB server every operation costs 10-100x what it costs on mongod "
            "(and its findAndModify scans the collection), so absolute figures are low: "
            "compare the ratios, which come from this one run on this one server.[/]"
        )
