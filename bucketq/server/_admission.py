"""Admission control: what the service takes on at once, and how long it waits for it.

Three layers, outermost first:

- :class:`GuardedH11Protocol`, uvicorn's HTTP/1.1 protocol with two bounds uvicorn does
  not have: a connection that has not sent a whole request head within
  ``BUCKETQ_HEADER_TIMEOUT_MS`` is closed (uvicorn waits for a head forever: silent
  sockets and slow-header clients held connections open without end), and a request on a
  connection past ``BUCKETQ_MAX_CONNECTIONS`` is answered 503 + ``Retry-After`` and closed;
  and a head two parsers could read two ways (``_framing``) is answered 400 and closed.
- :class:`Admission`, an ASGI middleware: ingest and read requests past
  ``BUCKETQ_MAX_REQUESTS_IN_FLIGHT``, and every one while the embedded store is down
  (its supervisor restarts it), are answered 503 + ``Retry-After`` at once (the
  operations routes are never refused, so ``/health`` answers throughout); each request
  gets a deadline (:func:`remaining`) every store call it makes is bounded by (started
  when it arrives, started again once its body is in); a body not
  received whole within ``BUCKETQ_BODY_TIMEOUT_MS`` is a 408; and an answer given before
  the body was read whole closes the connection (a 413 does not read the rest).
- :class:`RecordGate`: records handed to the reservoir and not yet answered stay within
  ``BUCKETQ_MAX_RECORDS_IN_FLIGHT``; a request that would pass it is refused at once
  instead of queueing behind a storage that cannot keep up.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ClassVar

import h11
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

from ..errors import Overloaded
from ._config import ServerConfig
from ._framing import StrictConnection
from ._middleware._base import Middleware
from ._middleware.answer_headers import NOSNIFF

#: Routes never refused nor given a deadline: liveness, readiness, metrics, the docs, and
#: the live log stream (open for as long as its reader stays; it has its own limits:
#: ``BUCKETQ_MAX_STREAMS``, ``BUCKETQ_STREAMS_PER_PROJECT``).
EXEMPT = frozenset({"/health", "/ready", "/metrics", "/docs", "/openapi.json",
                    "/api/v1/logs/stream"})  # fmt: skip
READ_PATH = "/api/v1/logs"
_CLOSE = (b"connection", b"close")

#: The deadline (event loop time) of the request being served in this context.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "bucketq_request_deadline", default=None
)


def remaining(budget: float) -> float:
    """Seconds left to the current request's deadline, at most ``budget`` (``budget``
    itself outside a request). At least a millisecond: a call past its deadline then
    fails at once instead of having no bound."""
    deadline = _deadline.get()
    if deadline is None:
        return budget
    return max(0.001, min(budget, deadline - asyncio.get_running_loop().time()))


def past_deadline() -> bool:
    """Whether the current request's deadline has passed (False outside a request)."""
    deadline = _deadline.get()
    return deadline is not None and asyncio.get_running_loop().time() >= deadline


def refusal(status: int, error: str, message: str, retry_after: float) -> tuple[bytes, list[Any]]:
    """The body and headers of an answer the service gives without the app."""
    body = json.dumps({"error": error, "message": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(max(1, round(retry_after))).encode()),
        _CLOSE,
        NOSNIFF,
    ]
    return body, headers


async def _send_refusal(send: Any, status: int, error: str, message: str, retry: float) -> None:
    body, headers = refusal(status, error, message, retry)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _has_body(scope: dict[str, Any]) -> bool:
    for k, v in scope.get("headers") or ():
        if k == b"content-length":
            return v.strip() not in (b"", b"0")
        if k == b"transfer-encoding":
            return True
    return False


class BodyTimeout(HTTPException):
    """The request's body did not arrive within ``BUCKETQ_BODY_TIMEOUT_MS`` (an HTTP
    exception: FastAPI turns any other exception raised while it reads a body into a 400)."""

    def __init__(self, ms: int) -> None:
        super().__init__(408, f"The body did not arrive within {ms} ms (BUCKETQ_BODY_TIMEOUT_MS).")


class Admission(Middleware):
    """The ASGI middleware (see the module's text). ``on_refused(reason)`` counts refusals;
    ``store()`` says what the embedded store is doing (a ``bucketq.supervisor.StoreState``,
    None without one)."""

    def __init__(
        self, app: Any, *, config: ServerConfig, on_refused: Any = None, store: Any = None
    ) -> None:
        super().__init__(app)
        self.config = config
        self.in_flight = 0
        self.on_refused = on_refused or (lambda _reason: None)
        self.store = store

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        cfg = self.config
        path = scope.get("path", "")
        bounded = path not in EXEMPT
        loop = asyncio.get_running_loop()
        state = self.store() if bounded and self.store is not None else None
        if state is not None and not state.up:
            self.on_refused("store")
            await _send_refusal(send, 503, "Service unavailable",
                                f"The embedded store is {state.describe()}; nothing of this "
                                "request was stored. Retry after the Retry-After delay.",
                                cfg.retry_after_s)  # fmt: skip
            return
        if bounded and self.in_flight >= cfg.max_requests_in_flight:
            self.on_refused("requests")
            await _send_refusal(send, 503, "Service unavailable",
                                f"{self.in_flight} requests are being served, the most at once "
                                "(BUCKETQ_MAX_REQUESTS_IN_FLIGHT); nothing of this request was stored. "
                                "Retry after the Retry-After delay.", cfg.retry_after_s)  # fmt: skip
            return
        reading = path == READ_PATH or path.startswith(READ_PATH + "/")
        budget = (cfg.read_timeout_ms if reading else cfg.ingest_timeout_ms) / 1000
        token = _deadline.set(loop.time() + budget) if bounded else None
        body_whole = not _has_body(scope)
        body_by: float | None = None

        async def timed_receive() -> Any:
            nonlocal body_whole, body_by
            if body_whole:
                return await receive()
            if body_by is None:
                # From when the route starts reading it: the key is checked first, and a
                # slow key lookup is not the client's delay.
                body_by = loop.time() + cfg.body_timeout_ms / 1000
            try:
                # asyncio.timeout, not wait_for: no task per body chunk
                async with asyncio.timeout_at(body_by):
                    message = await receive()
            except TimeoutError:
                self.on_refused("body_timeout")
                raise BodyTimeout(cfg.body_timeout_ms) from None
            if message.get("type") == "http.request" and not message.get("more_body", False):
                body_whole = True
                if bounded:
                    # The body is in: storage gets the whole budget again (a slow upload,
                    # bounded by BUCKETQ_BODY_TIMEOUT_MS, is not storage's time).
                    _deadline.set(loop.time() + budget)
            return message

        async def closing_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                if not body_whole:
                    # Answered before the body was read whole (413, 401, a refusal): close
                    # the connection rather than read and discard the rest of it.
                    message["headers"] = [*message.get("headers", ()), _CLOSE]
            await send(message)

        if bounded:
            self.in_flight += 1
        try:
            # A BodyTimeout raised in the app is answered by its handler (a 408).
            await self.app(scope, timed_receive, closing_send)
        finally:
            if bounded:
                self.in_flight -= 1
            if token is not None:
                _deadline.reset(token)


#: Seconds between two looks at the event loop's lag (``bucketq_event_loop_lag_seconds``),
#: and the lag past which its cause is counted (``bucketq_event_loop_late_seconds``).
LAG_PROBE_S = 0.02
LATE_S = 0.01


def lag_cause(wall: float, thread_cpu: float, process_cpu: float) -> str:
    """What a late event loop's ``wall`` seconds went to, from the CPU seconds its thread
    and its process ran meanwhile: ``loop`` (the thread ran half of it or more),
    ``threads`` (the process's other threads did), else ``cpu`` (the process waited for
    a CPU)."""
    if thread_cpu >= 0.5 * wall:
        return "loop"
    if process_cpu >= 0.5 * wall:
        return "threads"
    return "cpu"


class AdmissionMetrics:
    """Counters of admission control and key lookups, in ``registry``; never raise."""

    def __init__(self, registry: Any) -> None:
        import prometheus_client as prom

        self.lookups = prom.Counter(
            "bucketq_key_lookups",
            "API key lookups by result: found, unknown, failed (the store did not answer in "
            "time), refused (over BUCKETQ_KEY_LOOKUPS_PER_S or the lookups in flight: no "
            "database call), bad_checksum (a key whose checksum is wrong: no database call).",
            ("result",),
            registry=registry,
        )
        self.unsettled = prom.Counter(
            "bucketq_ingest_unsettled",
            "Requests answered 503 after their records were handed to the reservoir, by "
            "reason: timeout (no outcome within the grace), error (the reservoir failed), "
            "partial (some records not accepted), tee (stored, the tee stream failed). Some "
            "of their records may be stored; every other 503 stored nothing.",
            ("reason",),
            registry=registry,
        )
        self.refusals = prom.Counter(
            "bucketq_admission_refused",
            "Requests refused by admission control, by reason: requests, records (in "
            "flight), body_timeout, deadline (it passed before the records were handed to "
            "storage), store (the embedded store is restarting).",
            ("reason",),
            registry=registry,
        )

        self.loop_lag = prom.Histogram(
            "bucketq_event_loop_lag_seconds",
            f"How late the event loop ran a timer due every {LAG_PROBE_S * 1000:g} ms: the "
            "wait of any request (/health too) for the loop before its own work starts.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.loop_late = prom.Counter(
            "bucketq_event_loop_late_seconds",
            f"Seconds the event loop was late (lags over {LATE_S * 1000:g} ms), by cause: loop "
            "(its thread ran: work on the loop, garbage collection), threads (the process's "
            "other threads ran: the GIL), cpu (the process did not run: other processes had "
            "the CPU).",
            ("cause",),
            registry=registry,
        )

    async def watch_loop_lag(self) -> None:
        """Observe the event loop's lag every :data:`LAG_PROBE_S` until cancelled, and
        what the lag was spent on (:func:`lag_cause`)."""
        import time

        loop = asyncio.get_running_loop()
        while True:
            start, thread0, process0 = loop.time(), time.thread_time(), time.process_time()
            await asyncio.sleep(LAG_PROBE_S)
            now = loop.time()
            lag = max(0.0, now - start - LAG_PROBE_S)
            try:
                self.loop_lag.observe(lag)
                if lag > LATE_S:
                    cause = lag_cause(now - start, time.thread_time() - thread0,
                                      time.process_time() - process0)  # fmt: skip
                    self.loop_late.labels(cause).inc(lag)
            except Exception:  # noqa: BLE001 - a metric never fails the service
                pass

    def key_lookup(self, result: str) -> None:
        self._inc(self.lookups, result)

    def refused(self, reason: str) -> None:
        self._inc(self.refusals, reason)

    def unsettled_answer(self, reason: str) -> None:
        self._inc(self.unsettled, reason)

    @staticmethod
    def _inc(counter: Any, label: str) -> None:
        try:
            counter.labels(label).inc()
        except Exception:  # noqa: BLE001 - a metric never fails a request
            pass


class StreamSlots:
    """Live streams open, per project and in all, within their limits (a service's own:
    per process). :meth:`take` refuses one more (429 over a project's, 503 over all)."""

    def __init__(self, limit: int, per_project: int, retry_after: float) -> None:
        self.limit = limit
        self.per_project = per_project
        self.retry_after = retry_after
        self.open: dict[str, int] = {}

    def take(self, project: str) -> None:
        if sum(self.open.values()) >= self.limit:
            raise Overloaded(f"{self.limit} live streams are open, the most at once "
                             "(BUCKETQ_MAX_STREAMS)", self.retry_after)  # fmt: skip
        if self.open.get(project, 0) >= self.per_project:
            raise Overloaded(f"this project has {self.per_project} live streams open, "
                             "the most at once (BUCKETQ_STREAMS_PER_PROJECT)",
                             self.retry_after, status=429)  # fmt: skip
        self.open[project] = self.open.get(project, 0) + 1

    def give_back(self, project: str) -> None:
        n = self.open.get(project, 0) - 1
        if n > 0:
            self.open[project] = n
        else:
            self.open.pop(project, None)


class ProjectReads:
    """Log reads of each project: at most ``limit`` served at once, and no more than
    ``share`` of the time while another project is served (each read's seconds are a
    debt that drains at ``share`` per second; past ``burst`` seconds of debt the
    project's reads are refused until it has drained). Only reads while another project
    is served (it read or ingested within the last ``window`` seconds) are owed and only
    then are reads refused: alone, a project may use the whole store, and what it read
    alone is not held against it when a neighbour arrives. One more read waits for a place up to ``wait`` seconds (a console page and
    its tail overlapping), behind at most ``waiting`` others; past either bound it is
    refused (429 + ``Retry-After``), never queued without bound: a project's readers,
    however many and however fast, leave the store to the others most of the time."""

    def __init__(
        self,
        limit: int,
        retry_after: float,
        *,
        wait: float = 1.0,
        waiting: int = 8,
        share: float = 0.25,
        burst: float = 5.0,
        window: float = 3.0,
        clock: Any = None,
    ) -> None:
        import time

        self.limit = limit
        self.retry_after = retry_after
        self.wait = wait
        self.waiting = waiting
        self.share = share
        self.burst = burst
        self.window = window
        self.clock = clock or time.monotonic
        #: The two projects served last (distinct, newest first) and when: the newest
        #: activity of any project other than a given one is in it.
        self._recent: list[tuple[str, float]] = []
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._queued: dict[str, int] = {}
        self._active: dict[str, int] = {}
        #: Read seconds owed per project, and when that was last worked out.
        self._debt: dict[str, tuple[float, float]] = {}

    def note(self, project: str) -> None:
        """``project`` is being served (an ingest, a read): its neighbours' reads are held
        to their share of the time while it is."""
        now = self.clock()
        rest = [(p, t) for p, t in self._recent if p != project]
        self._recent = [(project, now), *rest[:1]]

    def _others_active(self, project: str, now: float) -> bool:
        return any(p != project and now - t <= self.window for p, t in self._recent)

    def _owed(self, project: str, now: float) -> float:
        debt, at = self._debt.get(project, (0.0, now))
        return max(0.0, debt - (now - at) * self.share)

    def _refuse(self, project: str) -> Overloaded:
        return Overloaded(
            f"{self.limit} read(s) of this project are being served and others wait "
            f"(BUCKETQ_READS_PER_PROJECT={self.limit})",
            self.retry_after,
            status=429,
        )

    @asynccontextmanager
    async def admit(self, project: str, budget: float | None = None) -> AsyncIterator[None]:
        now = self.clock()
        owed = self._owed(project, now)
        if owed > self.burst and self._others_active(project, now):
            raise Overloaded(
                f"this project's reads took {owed:.1f} s of the store lately (more than "
                f"{self.share:.0%} of the time)",
                max(1.0, (owed - self.burst) / self.share),
                status=429,
            )
        sem = self._sems.get(project)
        if sem is None:
            sem = self._sems[project] = asyncio.Semaphore(self.limit)
        if sem.locked():
            if self._queued.get(project, 0) >= self.waiting:
                raise self._refuse(project)
            self._queued[project] = self._queued.get(project, 0) + 1
            try:
                await asyncio.wait_for(sem.acquire(), min(self.wait, budget or self.wait))
            except TimeoutError:
                raise self._refuse(project) from None
            finally:
                self._queued[project] -= 1
        else:
            await sem.acquire()
        self._active[project] = self._active.get(project, 0) + 1
        self.note(project)
        started = self.clock()
        try:
            yield
        finally:
            sem.release()
            now = self.clock()
            read = now - started if self._others_active(project, now) else 0.0
            self._debt[project] = (self._owed(project, now) + read, now)
            if len(self._debt) > 10_000:  # drained debts first: a bounded map
                for p in [p for p in self._debt if not self._owed(p, now)]:
                    del self._debt[p]
            self._active[project] -= 1
            if not self._active[project] and not self._queued.get(project):
                # No one reads or waits: forget the project (a map bounded by readers).
                for m in (self._sems, self._queued, self._active):
                    m.pop(project, None)


class RecordGate:
    """Records in flight (handed to the reservoir, not yet answered): within ``limit``,
    and no more than storage gets through in half a request's budget.

    The second bound is Little's law: with ``in_flight`` records ahead of it and storage
    getting through ``rate`` records a second, a request's records wait about
    ``(in_flight + n) / rate`` seconds. Past half its remaining budget the request is
    refused at once, instead of being handed to storage, timing out, and being stored
    anyway after its 503. ``rate`` is measured over the time records were in flight
    (busy time), so a quiet service does not look slow."""

    #: Share of a request's remaining budget its records may be expected to wait.
    WAIT_SHARE = 0.5
    #: Busy seconds per throughput sample, and the weight of a new sample (one lower than
    #: the estimate replaces it: a slowdown counts at once, a recovery gradually).
    SAMPLE_S = 0.5
    ALPHA = 0.5
    #: Records in flight at most before the rate is measured: at the start of a burst
    #: nothing is known, and admitting all of it would time out and store records after
    #: their 503.
    COLD_RECORDS = 2000

    def __init__(self, limit: int, retry_after: float, clock: Any = None) -> None:
        import time

        self.limit = limit
        self.retry_after = retry_after
        self.in_flight = 0
        self.clock = clock or time.monotonic
        #: Records per second storage got through while busy (None: not measured yet).
        self.rate: float | None = None
        self._busy_since: float | None = None
        self._busy = 0.0
        self._done = 0

    @contextmanager
    def admit(self, n: int, budget: float = float("inf")) -> Iterator[None]:
        """Hold ``n`` records' places while the block runs; ``Overloaded`` at once when
        they would pass the limit or wait past ``WAIT_SHARE`` of ``budget`` (a request
        alone is always let through: ``BUCKETQ_MAX_RECORDS`` bounds one request)."""
        ahead = self.in_flight
        if ahead and ahead + n > self.limit:
            raise Overloaded(
                f"{ahead} records are waiting for storage, the most at once "
                "(BUCKETQ_MAX_RECORDS_IN_FLIGHT)",
                self.retry_after,
            )
        if ahead and self.rate is None and ahead + n > self.COLD_RECORDS:
            raise Overloaded(
                f"{ahead} records are waiting for storage, whose rate is not known yet",
                self.retry_after,
            )
        if ahead and self.rate and (ahead + n) / self.rate > self.WAIT_SHARE * budget:
            raise Overloaded(
                f"Storage is behind: {ahead} records are waiting for it, about "
                f"{(ahead + n) / self.rate:.1f} s at its recent {self.rate:.0f} records/s",
                self.retry_after,
            )
        now = self.clock()
        if not ahead:
            self._busy_since = now
        self.in_flight += n
        ok = False
        try:
            yield
            ok = True
        finally:
            self.in_flight -= n
            self._account(n if ok else 0)

    def _account(self, done: int) -> None:
        now = self.clock()
        if self._busy_since is not None:
            self._busy += now - self._busy_since
            self._busy_since = now if self.in_flight else None
        self._done += done
        if self._busy >= self.SAMPLE_S:
            sample = self._done / self._busy
            if self.rate is None or sample < self.rate:
                self.rate = sample
            else:
                self.rate = self.ALPHA * sample + (1 - self.ALPHA) * self.rate
            self._busy, self._done = 0.0, 0


#: The ASGI scope extension (``scope["extensions"]``) whose value drops the connection at
#: once, unsent bytes and all.
ABORT = "bucketq.abort"


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head timeout, a connection cap, and request
    heads checked before h11 parses them (:class:`~._framing.StrictConnection`).

    The limits are class attributes, set by :func:`configure` in each process before it
    serves (uvicorn builds one protocol object per connection from its class)."""

    header_timeout: ClassVar[float] = 10.0
    max_connections: ClassVar[int] = 512
    retry_after: ClassVar[float] = 5.0
    #: Connections closed for want of a whole head, requests refused over the cap, and
    #: request heads refused as ambiguous.
    closed_slow: ClassVar[int] = 0
    refused_over_cap: ClassVar[int] = 0
    refused_heads: ClassVar[int] = 0

    _head_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size  # as uvicorn makes its own
        self.conn = StrictConnection(
            h11.SERVER, DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if size is None else size
        )

    def handle_events(self) -> None:
        super().handle_events()
        scope = getattr(self, "scope", None)
        if scope is not None and ABORT not in scope.setdefault("extensions", {}):
            # A response that must drop its connection now (a live stream's reader that
            # takes nothing): uvicorn's close() waits for the unread bytes to go first.
            scope["extensions"][ABORT] = self.transport.abort
        conn = self.conn
        if isinstance(conn, StrictConnection) and conn.refusal and not self.transport.is_closing():
            GuardedH11Protocol.refused_heads += 1
            self.send_400_response(conn.refusal)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head h11 cannot parse (and ours to one it must not): the
        service's JSON error body, and the connection closed."""
        body = json.dumps(
            {"error": "Bad request", "message": f"{msg} The connection is closed."}
        ).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), _CLOSE, NOSNIFF]  # fmt: skip
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.max_connections
        super().connection_made(transport)
        if over:
            # Its request is answered 503 and the connection closed (answering before the
            # request would make clients see a reset instead).
            self.app = _over_capacity
            GuardedH11Protocol.refused_over_cap += 1
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            # (part of) a head, not whole yet: it must be whole within the timeout of its
            # first byte; more bytes do not extend it.
            if self._head_timer is None:
                self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            GuardedH11Protocol.closed_slow += 1
            self.transport.close()


async def _over_capacity(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await _send_refusal(send, 503, "Service unavailable",
                        f"The service has {GuardedH11Protocol.max_connections} connections open, the "
                        "most it keeps (BUCKETQ_MAX_CONNECTIONS); retry after the Retry-After delay.",
                        GuardedH11Protocol.retry_after)  # fmt: skip


def configure(config: ServerConfig) -> type[GuardedH11Protocol]:
    """Set the protocol's limits from ``config`` in this process; returns the class."""
    GuardedH11Protocol.header_timeout = config.header_timeout_ms / 1000
    GuardedH11Protocol.max_connections = config.max_connections
    GuardedH11Protocol.retry_after = config.retry_after_s
    return GuardedH11Protocol
