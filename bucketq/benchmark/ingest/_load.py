"""The open-loop load generator: ``POST`` requests at a constant arrival rate, each
latency measured from its scheduled send time (no coordinated omission).

A request is sent at its scheduled time whether or not earlier ones were answered, on
an idle keep-alive connection or a new one (up to ``max_connections``; past that it
waits for one, and that wait is part of its latency). The client is a minimal
HTTP/1.1 client on asyncio streams: the body of each request is built before its
turn, so what the generator spends per request is a write and a read, and it reports
how late it sent each request (its lag) so a run where the generator, not the server,
fell behind says so.

:func:`run_in_process` runs one load in a spawned process of its own, so nothing
else in the benchmark's process (the storage watcher, the progress display) can
delay a send; :func:`run_load` is the same in the caller's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from ._stats import Sample, schedule

#: Connections the generator opens at most (a request past that waits for a free one).
DEFAULT_MAX_CONNECTIONS = 512
#: Seconds a request may take before it counts as an error ("timeout").
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Seconds a kept-alive connection may stay idle and still be reused (uvicorn closes
#: them after 5 s; reusing one as it closes would fail the request).
IDLE_MAX = 3.0
#: The message of every record is about this long, like an application's log line.
MESSAGE_BYTES = 120


@dataclass(frozen=True)
class LoadSpec:
    """One load: ``rate`` requests/s of ``batch`` records for ``duration`` seconds to
    ``url`` (``http://host:port/path``) with ``headers``. Every record carries
    ``metadata.bench_run`` = ``run_id``, ``bench_req`` (the request's number) and
    ``bench_rec`` (its index in the request), so storage can be matched to requests."""

    url: str
    rate: float
    duration: float
    batch: int
    run_id: str
    headers: dict[str, str] = field(default_factory=dict)
    service: str = "bench"
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    timeout: float = DEFAULT_REQUEST_TIMEOUT


_SEQ, _STAMP = 987654321, "1970-01-01T00:00:00.000Z"


def body_template(spec: LoadSpec) -> tuple[str, str]:
    """A request's JSON built once, with the request number and time as markers: a body
    is then two string replacements (the generator must not be the bottleneck)."""
    logs = []
    for j in range(spec.batch):
        msg = f"GET /api/orders/{_SEQ}-{j} 200 served from cache; user=u{j} region=eu-west-1 "
        logs.append(
            {
                "time": _STAMP,
                "service": spec.service,
                "level": "info" if j % 10 else "warn",
                "message": (msg * 2)[:MESSAGE_BYTES],
                "metadata": {"bench_run": spec.run_id, "bench_req": _SEQ, "bench_rec": j},
            }
        )
    return json.dumps({"logs": logs}, separators=(",", ":")), str(_SEQ)


def body(template: tuple[str, str], seq: int, when: datetime) -> bytes:
    """The JSON body of request ``seq``: the template's records, of time ``when``."""
    text, marker = template
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return text.replace(marker, str(seq)).replace(_STAMP, stamp).encode()


class _Pool:
    """Keep-alive HTTP/1.1 connections to one host (used from one event loop only)."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port, self.limit = host, port, limit
        # (connection, when it went idle); the last one in is the first reused
        self.idle: list[tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], float]] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.opened_total = 0

    async def get(
        self, fresh: bool = False
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], bool]:
        """A connection and whether it was reused (a reused one may have been closed);
        ``fresh``: a new one. Connections idle longer than :data:`IDLE_MAX` are closed
        rather than reused: the server is about to close them."""
        now = time.monotonic()
        while self.idle and now - self.idle[0][1] > IDLE_MAX:
            old, _ = self.idle.pop(0)
            self.drop(old)
        while (fresh or not self.idle) and self.open >= self.limit:
            if fresh and self.idle:
                self.drop(self.idle.pop(0)[0])
                continue
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            await fut
        if self.idle and not fresh:
            return self.idle.pop()[0], True
        self.open += 1
        try:
            conn = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            self.drop(None)
            raise
        self.opened_total += 1
        return conn, False

    def _wake(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append((conn, time.monotonic()))
        self._wake()

    def drop(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        if conn is not None:
            conn[1].close()
        self.open -= 1
        self._wake()

    def close(self) -> None:
        for (_, w), _since in self.idle:
            w.close()
        self.idle.clear()


class _Closed(Exception):
    """The server closed a kept-alive connection before answering."""


async def _exchange(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], head: bytes, payload: bytes
) -> tuple[int, bool, bytes, bool]:
    """Send one request, read its answer: (status, keep the connection, body, whether it
    carried ``Retry-After``)."""
    reader, writer = conn
    writer.write(head + payload)
    await writer.drain()
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed from None
        raise
    lines = raw.split(b"\r\n")
    parts = lines[0].split(None, 2)
    status = int(parts[1])
    length = 0
    keep = parts[0] == b"HTTP/1.1"
    chunked = False
    retry_after = False
    for h in lines[1:]:
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"connection":
            keep = value.strip().lower() != b"close"
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"retry-after":
            retry_after = bool(value.strip())
    if chunked:
        data = b""
        while True:
            size = int((await reader.readline()).strip().split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            data += chunk[:-2]
    else:
        data = await reader.readexactly(length) if length else b""
    return status, keep, data, retry_after


async def run_load(
    spec: LoadSpec,
    *,
    on_done: Callable[[int], None] | None = None,
    start_at: float | None = None,
) -> dict[str, Any]:
    """Run the load; returns ``{"samples", "t0", "connections", "cpu_s", ...}`` with
    times in seconds from ``t0`` (a ``time.monotonic()`` value: system-wide, so other
    processes on the machine can compare their own stamps with it)."""
    u = urlsplit(spec.url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"url must be http://host:port/path, not {spec.url!r}")
    port = u.port or 80
    path = u.path or "/"
    extra = "".join(f"{k}: {v}\r\n" for k, v in spec.headers.items())
    times = schedule(spec.rate, spec.duration)
    pool = _Pool(u.hostname, port, spec.max_connections)
    samples: list[Sample | None] = [None] * len(times)
    done_count = 0
    # 429/503 answers without a Retry-After (admission control must always give one)
    refused_bare = 0
    wall0 = datetime.now(UTC)
    template = body_template(spec)

    def head(n: int) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {n}\r\n{extra}\r\n"
        ).encode()

    async def one(seq: int, scheduled: float, payload: bytes) -> None:
        nonlocal done_count, refused_bare
        sent = time.monotonic() - t0
        status, error, done = 0, None, None
        try:
            async with asyncio.timeout(spec.timeout):
                for attempt in (0, 1):
                    conn, reused = await pool.get(fresh=attempt > 0)
                    try:
                        status, keep, _, retry = await _exchange(conn, head(len(payload)), payload)
                        refused_bare += status in (429, 503) and not retry
                    except (_Closed, ConnectionError) as exc:
                        pool.drop(conn)
                        # A kept-alive connection the server closed as it went idle: once
                        # more on a new one (still timed from the schedule).
                        if reused and attempt == 0:
                            continue
                        raise ConnectionError(str(exc) or type(exc).__name__) from exc
                    except BaseException:
                        pool.drop(conn)
                        raise
                    if keep:
                        pool.put(conn)
                    else:
                        pool.drop(conn)
                    break
            done = time.monotonic() - t0
            if status != 200:
                error = f"HTTP {status}"
        except TimeoutError:
            error = "timeout"
            done = time.monotonic() - t0
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
            error = type(exc).__name__
            done = time.monotonic() - t0
        samples[seq] = Sample(seq, scheduled, sent, done, status, error)
        done_count += 1
        if on_done is not None:
            on_done(done_count)

    cpu0 = time.process_time()
    t0 = start_at if start_at is not None else time.monotonic()
    tasks = set()
    for seq, at in enumerate(times):
        payload = body(template, seq, wall0 + timedelta(seconds=at))
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(one(seq, at, payload))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
    pool.close()
    return {
        "t0": t0,
        "samples": [s for s in samples if s is not None],
        "connections": pool.opened_total,
        "refused_without_retry_after": refused_bare,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.monotonic() - t0,
    }


def _child(spec: LoadSpec, conn: Any, progress: Any) -> None:
    """The generator's process: wait for the go (a start time), run, send the result."""
    import asyncio as aio

    try:
        conn.send(("ready", None))
        start_at = conn.recv()

        def on_done(n: int) -> None:
            progress.value = n

        result = aio.run(run_load(spec, on_done=on_done, start_at=start_at))
        result["samples"] = [
            (s.seq, s.scheduled, s.sent, s.done, s.status, s.error) for s in result["samples"]
        ]
        conn.send(("result", result))
    except BaseException as exc:  # noqa: BLE001 - tell the parent, whatever it was
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class LoadProcess:
    """:func:`run_load` in a spawned process: :meth:`start` (waits until it is ready),
    :meth:`go` (the schedule starts ``delay`` seconds later), :meth:`result`."""

    def __init__(self, spec: LoadSpec) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.spec = spec
        self._conn, child = ctx.Pipe()
        self.progress = ctx.RawValue("q", 0)
        self._proc = ctx.Process(
            target=_child, args=(spec, child, self.progress), name="bucketq-bench-load", daemon=True
        )

    def start(self, timeout: float = 60.0) -> LoadProcess:
        self._proc.start()
        kind, value = self._recv(timeout)
        if kind != "ready":
            raise RuntimeError(f"the load generator failed to start: {value}")
        return self

    def go(self, delay: float = 0.05) -> float:
        t0 = time.monotonic() + delay
        self._conn.send(t0)
        return t0

    def _recv(self, timeout: float) -> tuple[str, Any]:
        if not self._conn.poll(timeout):
            raise RuntimeError(f"the load generator said nothing for {timeout:.0f} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the load generator exited (code {self._proc.exitcode}) without a result"
            ) from None

    def done(self) -> bool:
        return self._conn.poll(0)

    def result(self, timeout: float) -> dict[str, Any]:
        kind, value = self._recv(timeout)
        self._proc.join(10)
        if kind != "result":
            raise RuntimeError(f"the load generator failed: {value}")
        value["samples"] = [Sample(*row) for row in value["samples"]]
        return value

    def stop(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
