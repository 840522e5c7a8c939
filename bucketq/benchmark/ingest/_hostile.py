"""The hostile clients of the hostile-neighbour run, each a thread beside the good load.

- ``huge``: a body of the largest size made of tiny records (``{"logs":[0,0,...]}``);
- ``deep``: a record whose ``metadata`` nests 100,000 levels;
- ``otlp``: an OTLP protobuf body of 2.6 million empty ``log_records`` (5.2 MB);
- ``silent``: 200 connections that send nothing (reopened as the server closes them);
- ``slow``: 5 connections sending a request head one byte every half second.

Each request case is sent again as soon as its answer came (after a short pause); the
answers are counted by status. :class:`Alternating` switches them on and off in short
windows beside one steady good load, so the machine's drift falls on both kinds of
window alike. Nothing here asserts anything: ``_limits`` compares the good traffic's
latency in the two kinds of window.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

#: The size of the hostile bodies (5 MiB): under the service's default body limit.
BODY_LIMIT = 5 * 1024 * 1024
OTLP_RECORDS = 2_600_000
DEPTH = 100_000
SILENT_SOCKETS = 200
SLOW_CLIENTS = 5
#: Seconds between two requests of one case (its answer came first).
PAUSE = 0.5
SLOW_BYTE_EVERY = 0.5


def huge_body(limit: int = BODY_LIMIT) -> bytes:
    """``{"logs":[0,0,...]}`` just under ``limit`` bytes."""
    n = (limit - len(b'{"logs":[0]}')) // 2
    return b'{"logs":[' + b"0," * n + b"0]}"


def deep_body(depth: int = DEPTH) -> bytes:
    rec = (b'{"time":"2024-05-01T10:00:00Z","service":"s","level":"info","message":"m",'
           b'"metadata":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}")  # fmt: skip
    return b'{"logs":[' + rec + b"]}"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def otlp_body(records: int = OTLP_RECORDS) -> bytes:
    """ExportLogsServiceRequest{resource_logs: [{scope_logs: [{log_records: [{} x n]}]}]},
    written by hand (field 2 of ScopeLogs and of ResourceLogs, field 1 of the request)."""
    scope = b"\x12\x00" * records  # ScopeLogs.log_records (2): empty LogRecord
    resource = b"\x12" + _varint(len(scope)) + scope  # ResourceLogs.scope_logs (2)
    return b"\x0a" + _varint(len(resource)) + resource  # request.resource_logs (1)


class Hostile:
    """The hostile clients against ``url`` with ``key``, switched on and off: started
    (idle) on enter, stopped on exit; :meth:`resume` lets them go, :meth:`pause` stops
    them and waits until none holds a connection (the requests in flight answered, the
    silent and slow sockets closed), so a pause ends their effect on the server.
    :meth:`report` says what each case sent and got, in all and per window (the number
    :meth:`resume` was given). ``scale`` below 1 makes every case smaller (the bodies,
    the numbers of connections): a brief exercise of the machinery, not the benchmark's
    cases."""

    def __init__(self, url: str, key: str, *, scale: float = 1.0) -> None:
        self.scale = scale
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.key = key
        self.stop = threading.Event()
        self.on = threading.Event()
        self.window = 0
        self.answers: dict[str, Counter[str]] = {}
        self.by_window: dict[int, Counter[str]] = {}
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.busy: set[str] = set()

    def __enter__(self) -> Callable[[], dict[str, Any]]:
        json_type = "application/json"
        k = self.scale
        cases: list[tuple[str, str, str, bytes]] = [
            ("huge", "/api/v1/ingest", json_type, huge_body(int(BODY_LIMIT * k))),
            ("deep", "/api/v1/ingest", json_type, deep_body(max(1, int(DEPTH * k)))),
            ("otlp", "/v1/logs", "application/x-protobuf", otlp_body(int(OTLP_RECORDS * k))),
        ]
        for name, path, ctype, payload in cases:
            self._thread(name, functools.partial(self._post, name, path, ctype, payload))
        self._thread("silent", self._silent)
        for i in range(max(1, int(SLOW_CLIENTS * k))):
            self._thread(f"slow{i}", functools.partial(self._slow, f"slow{i}"))
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.on.set()  # wake the idle ones
        for t in self.threads:
            t.join(30)

    def resume(self, window: int = 0) -> None:
        """The clients go (what they send is counted under ``window``)."""
        with self.lock:
            self.window = window
        self.on.set()

    def pause(self, timeout: float = 60.0) -> bool:
        """The clients stop; True once none holds a connection, False if one still
        did after ``timeout`` seconds (a request the server has not answered)."""
        self.on.clear()
        with self.idle:
            return self.idle.wait_for(lambda: not self.busy, timeout)

    def report(self) -> dict[str, Any]:
        with self.lock:
            return {k: dict(v) for k, v in self.answers.items()}

    def window_report(self) -> dict[int, dict[str, int]]:
        """Per window: ``"<case> sent"`` / ``"<case> opened"`` counts."""
        with self.lock:
            return {w: dict(c) for w, c in self.by_window.items()}

    def _thread(self, name: str, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, name=f"hostile-{name}", daemon=True)
        t.start()
        self.threads.append(t)

    def _count(self, case: str, what: str) -> None:
        with self.lock:
            self.answers.setdefault(case, Counter())[what] += 1

    def _started(self, worker: str, case: str, what: str) -> bool:
        """``worker`` takes a connection in the current window (False: paused meanwhile)."""
        with self.lock:
            if not self.on.is_set() or self.stop.is_set():
                return False
            self.busy.add(worker)
            self.by_window.setdefault(self.window, Counter())[f"{case} {what}"] += 1
            self.answers.setdefault(case, Counter())[what] += 1
            return True

    def _released(self, worker: str) -> None:
        with self.idle:
            self.busy.discard(worker)
            self.idle.notify_all()

    def _going(self) -> bool:
        """Wait while paused; False once stopped."""
        while not self.stop.is_set():
            if self.on.wait(0.5):
                return not self.stop.is_set()
        return False

    def _nap(self, seconds: float) -> bool:
        """Sleep ``seconds`` in short steps; False as soon as paused or stopped."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop.is_set() or not self.on.is_set():
                return False
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return self.on.is_set() and not self.stop.is_set()

    def _post(self, case: str, path: str, ctype: str, payload: bytes) -> None:
        while self._going():
            if not self._started(case, case, "sent"):
                continue
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                conn.request("POST", path, body=payload,
                             headers={"Content-Type": ctype, "X-API-Key": self.key})  # fmt: skip
                r = conn.getresponse()
                r.read()
                self._count(case, str(r.status))
            except (OSError, http.client.HTTPException) as exc:
                self._count(case, type(exc).__name__)
            finally:
                conn.close()
                self._released(case)
            self._nap(PAUSE)

    def _silent(self) -> None:
        """Keep :data:`SILENT_SOCKETS` connections open that send nothing (all closed
        while paused)."""
        sel = selectors.DefaultSelector()
        silent = max(1, int(SILENT_SOCKETS * self.scale))

        def close_all() -> None:
            for key in list(sel.get_map().values()):
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            self._released("silent")

        try:
            while not self.stop.is_set():
                if not self.on.is_set():
                    close_all()
                    self.on.wait(0.5)
                    continue
                while len(sel.get_map()) < silent and self._started("silent", "silent", "opened"):
                    try:
                        s = socket.create_connection((self.host, self.port), timeout=5)
                    except OSError as exc:
                        self._count("silent", type(exc).__name__)
                        break
                    s.setblocking(False)
                    sel.register(s, selectors.EVENT_READ)
                for key, _ in sel.select(timeout=0.05):
                    held = key.fileobj
                    if not isinstance(held, socket.socket):
                        continue
                    with contextlib.suppress(OSError):
                        if held.recv(4096):
                            continue  # an answer (a 503 over the cap), closed next
                    sel.unregister(held)
                    held.close()
                    self._count("silent", "closed by the server")
        finally:
            close_all()
            sel.close()

    def _slow(self, worker: str) -> None:
        """A request head, one byte every :data:`SLOW_BYTE_EVERY` seconds, until paused."""
        line = b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 100_000
        while self._going():
            if not self._started(worker, "slow", "opened"):
                continue
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
            except OSError as exc:
                self._count("slow", type(exc).__name__)
                self._released(worker)
                self._nap(PAUSE)
                continue
            try:
                for b in _bytes(line):
                    s.sendall(b)
                    if not self._nap(SLOW_BYTE_EVERY):
                        break
            except OSError:
                self._count("slow", "closed by the server")
            finally:
                s.close()
                self._released(worker)


class Alternating:
    """The hostile-neighbour side (:func:`._runner.run_mode`'s ``side``): windows of
    ``window`` seconds, the hostile clients of :class:`Hostile` paused in the first
    and every other one, running in the others, from enter to exit. A hostile window
    ends when its clients are quiet again (:meth:`Hostile.pause`), so what they caused
    stays in it; the next quiet window starts then, and the next hostile one on the
    schedule (every ``2 x window`` seconds from the start, so the windows never drift).
    :meth:`report`: the windows (kind, start, end in ``time.monotonic()`` seconds: the
    load generator's clock too), what the hostile clients sent in each, the machine's
    1-minute load average at each window's start."""

    def __init__(self, url: str, key: str, *, window: float, scale: float = 1.0) -> None:
        self.hostile = Hostile(url, key, scale=scale)
        self.window = window
        self.stop = threading.Event()
        self.windows: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._run, name="hostile-windows", daemon=True)

    def __enter__(self) -> Callable[[], dict[str, Any]]:
        self.hostile.__enter__()
        self.thread.start()
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)
        self.hostile.__exit__(*exc)

    def _run(self) -> None:
        import os

        t0 = time.monotonic()
        k = 0
        start = t0
        while not self.stop.is_set():
            kind = "alone" if k % 2 == 0 else "hostile"
            load1 = os.getloadavg()[0]
            if kind == "hostile":
                self.hostile.resume(k)
            self.stop.wait(max(0.0, t0 + (k + 1) * self.window - time.monotonic()))
            quiet = self.hostile.pause() if kind == "hostile" else True
            end = time.monotonic()
            self.windows.append({"kind": kind, "index": k, "start": start, "end": end,
                                 "quiesced": quiet, "load1": load1})  # fmt: skip
            start = end
            k += 1

    def report(self) -> dict[str, Any]:
        sent = self.hostile.window_report()
        return {
            "window_s": self.window,
            "windows": [w | {"hostile_sent": sent.get(w["index"], {})} for w in self.windows],
            "answers": self.hostile.report(),
        }


def _bytes(data: bytes) -> Iterator[bytes]:
    for i in range(len(data)):
        yield data[i : i + 1]


class HealthProbe:
    """``GET /health`` every ``every`` seconds on one kept-alive connection beside a
    load; :meth:`report`: the latencies (ms) and the failures."""

    def __init__(self, url: str, _key: str = "", every: float = 0.05) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.every = every
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures: Counter[str] = Counter()
        self.thread = threading.Thread(target=self._run, name="health-probe", daemon=True)

    def __enter__(self) -> Callable[[], dict[str, Any]]:
        self.loop_before = self._loop_metrics()
        self.thread.start()
        return self.report

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.loop_after = self._loop_metrics()

    def report(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "n": len(lat),
            "max_ms": lat[-1] if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
            "failures": dict(self.failures),
            "event_loop": loop_lag(self.loop_before, getattr(self, "loop_after", None)),
        }

    def _loop_metrics(self) -> dict[str, float] | None:
        """The service's event-loop figures from ``/metrics`` (None: not answered)."""
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                text = r.read().decode()
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            return None
        return loop_samples(text) if r.status == 200 else None

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            t = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                conn.request("GET", "/health")
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    self.failures[f"HTTP {r.status}"] += 1
                self.latencies.append((time.perf_counter() - t) * 1000)
            except (OSError, http.client.HTTPException) as exc:
                self.failures[type(exc).__name__] += 1
                if conn is not None:
                    conn.close()
                conn = None
            self.stop.wait(self.every)
        if conn is not None:
            conn.close()


def loop_samples(text: str) -> dict[str, float]:
    """``bucketq_event_loop_lag_seconds`` buckets (``le=...``) and
    ``bucketq_event_loop_late_seconds_total`` by cause (``late:...``) of a ``/metrics`` text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "bucketq_event_loop_lag_seconds_bucket":
                out["le:" + s.labels["le"]] = out.get("le:" + s.labels["le"], 0.0) + s.value
            elif s.name == "bucketq_event_loop_late_seconds_total":
                key = "late:" + s.labels["cause"]
                out[key] = out.get(key, 0.0) + s.value
    return out


def loop_lag(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """The event loop between two :func:`loop_samples`: timers looked at, how many ran
    over 50 and 100 ms late, the bucket of the latest, and the seconds late by cause."""
    if before is None or after is None or "le:+Inf" not in after:
        return {"available": False}
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total = d["le:+Inf"]
    bounds = sorted((float(k[3:]), v) for k, v in d.items() if k.startswith("le:"))
    worst = next((b for b, v in bounds if v >= total), None)
    return {
        "available": True,
        "samples": int(total),
        "over_50ms": int(total - d.get("le:0.05", total)),
        "over_100ms": int(total - d.get("le:0.1", total)),
        "max_le_ms": None if worst is None or worst == float("inf") else worst * 1000,
        "late_s": {k[5:]: round(v, 3) for k, v in d.items() if k.startswith("late:")},
    }
