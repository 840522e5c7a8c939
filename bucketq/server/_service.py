"""The service's state: storage, the (maybe buffered) reservoir, the key cache and the
tee, opened in the app's lifespan; routes reach it with the :data:`Svc` dependency."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

from .._validate import one_line
from ..bucket.writes import durable_write_concern
from ..errors import BucketQError, Overloaded
from ..reservoir import (
    STORAGE_METHOD,
    BufferConfig,
    BufferedReservoir,
    MongoReservoir,
    keyed_record_ids,
    new_record_ids,
    wrap_reservoir,
)
from ._admission import (
    AdmissionMetrics,
    ProjectReads,
    RecordGate,
    StreamSlots,
    past_deadline,
    remaining,
)
from ._config import DEFAULT_DATABASE, STOP_SIGNALS, ServerConfig
from ._http_errors import ApiError
from ._keys import KeyCache
from ._records import iso

log = logging.getLogger("bucketq.server")

#: Bodies up to this many bytes (decoded) are decoded on the event loop; larger ones in
#: :data:`DECODE_THREADS` threads (pure-Python steps there let the loop run every 5 ms).
DECODE_INLINE_BYTES = 64 * 1024
DECODE_THREADS = 2
T = TypeVar("T")

#: Seconds between two retention sweeps (expired log buckets deleted whole).
EXPIRE_EVERY_S = 60.0

#: Seconds the buffer's stop may take beyond ``RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS``
#: (counting what is left, stopping the transport) before the service gives up on it.
DEFAULT_STOP_MARGIN = 5.0


class Service:
    """What the routes use: the storage, the (maybe buffered) reservoir, the keys, the tee."""

    def __init__(
        self,
        config: ServerConfig,
        buffer_config: BufferConfig,
        registry: Any,
        admission: AdmissionMetrics | None = None,
    ) -> None:
        self.config = config
        self.admission = admission if admission is not None else AdmissionMetrics(registry)
        #: Records handed to the reservoir and not answered yet, within their limit.
        self.records = RecordGate(config.max_records_in_flight, config.retry_after_s)
        #: Log reads of each project served at once.
        self.reads = ProjectReads(config.reads_per_project, config.retry_after_s)
        #: Live log streams open (``GET /api/v1/logs/stream``), within their limits.
        self.streams = StreamSlots(config.max_streams, config.streams_per_project,
                                   config.retry_after_s)  # fmt: skip
        self._expiry: asyncio.Task[None] | None = None
        self.buffer_config = buffer_config
        self.registry = registry
        self.client: Any = None
        self.db: Any = None
        self.storage: MongoReservoir | None = None
        self.reservoir: Any = None
        self.keys: KeyCache | None = None
        self.tee: Any = None
        self._idempotency_index = False
        #: Decoding of large bodies runs here, off the event loop (a bounded pool).
        self.decoder = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="bucketq-decode")
        #: The buffer's stop ran out of time: ``bucketq serve`` then exits 1 whether or
        #: not the process gets to end by itself before the forced exit.
        self.stop_incomplete = False
        #: Set by SIGTERM/SIGINT (:meth:`watch_stop_signals`): live streams end at their
        #: next poll, so a graceful stop does not wait for readers who never leave.
        self.stopping = False
        #: Collectors whose figures are the same in every process (the queue sizes the
        #: console's watch reads): with ``--workers``, ``/metrics`` adds this worker's.
        self.shared_collectors: list[Any] = []
        self._lag_watch: asyncio.Task[None] | None = None
        #: Projects' own retention in days (``bucketq keys retention``), read every sweep.
        self.retentions: dict[str, int] = {}
        #: Whether storage takes records: one log line per change, not one per request.
        self.storage_state = StorageState()

    async def open(self) -> Service:
        from pymongo import AsyncMongoClient

        cfg = self.config
        if not cfg.mongodb_uri:
            raise BucketQError(
                "The ingest service needs a MongoDB URI (BUCKETQ_MONGODB_URI); "
                "`bucketq serve` starts the embedded server when none is given."
            )
        self.client = AsyncMongoClient(
            cfg.mongodb_uri,
            serverSelectionTimeoutMS=cfg.mongodb_timeout_ms,
            tz_aware=True,
            appname="bucketq-serve",
        )
        db = (
            self.client[cfg.database]
            if cfg.database
            else self.client.get_default_database(DEFAULT_DATABASE)
        )
        # Every write a 200 reports (records, the idempotency claim, the tee) on disk.
        self.db = db.with_options(write_concern=durable_write_concern(None, db.write_concern))
        self.storage = MongoReservoir(self.db, retention_days=self.retention_of,
                                      log_layout=cfg.log_layout)  # fmt: skip
        self.reservoir = wrap_reservoir(
            self.storage, self.buffer_config, db=self.db, registry=self.registry
        )
        if isinstance(self.reservoir, BufferedReservoir):
            await self.reservoir.start()
        self.keys = KeyCache(
            self.db,
            ttl=cfg.key_cache_ms / 1000,
            size=cfg.key_cache_size,
            lookups_per_s=cfg.key_lookups_per_s,
            counted=self.admission.key_lookup,
        )
        if cfg.tee_stream:
            from ..stream import AsyncStreamQueue

            self.tee = AsyncStreamQueue(self.db, cfg.tee_stream)
        self._lag_watch = asyncio.create_task(self.admission.watch_loop_lag())
        self._expiry = asyncio.create_task(self._expire_loop())
        log.info(
            "storage: MongoDB database %r; buffer: %s; tee stream: %s",
            self.db.name,
            self.reservoir.transport.name if self.buffered else "off",
            cfg.tee_stream or "off",
        )
        return self

    def retention_of(self, project: str) -> float | None:
        """Days ``project``'s records are kept (None: forever): its own setting, else
        ``BUCKETQ_RETENTION_DAYS``."""
        days = self.retentions.get(project, self.config.retention_days)
        return days or None

    async def _expire_loop(self) -> None:
        """Delete expired log buckets every :data:`EXPIRE_EVERY_S` (MongoDB's TTL monitor
        does too where there is one); say once at start what the old layout still holds."""
        assert self.storage is not None
        store = self.storage.logstore
        try:
            left = await store.legacy_left()
            if left:
                log.warning("%d log records are stored in the layout of an earlier release "
                            "(collection %r): reads do not see them until `bucketq logs convert` "
                            "moves them into buckets", left, store.legacy.name)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a check at start, not worth failing for
            log.info("counting old-layout log records failed: %s", exc)
        from ._keys import PROJECTS_COLLECTION

        while True:
            try:
                docs = await self.db.get_collection(PROJECTS_COLLECTION).find({}).to_list(10_000)
                self.retentions = {str(d["_id"]): int(d["retention_days"]) for d in docs
                                   if isinstance(d.get("retention_days"), int)}  # fmt: skip
                # A project's shortened setting applies to the buckets stored already.
                n = await store.expire(projects=list(self.retentions))
                if n:
                    log.info("retention: %d expired log buckets deleted", n)
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                log.warning("retention: deleting expired log buckets failed: %s", exc)
            await asyncio.sleep(EXPIRE_EVERY_S)

    async def offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: inline for a body of ``size`` bytes up to
        :data:`DECODE_INLINE_BYTES` (cheaper than a thread hop), else in :attr:`decoder`,
        so that a large body's decoding leaves the event loop free to answer others."""
        if size <= DECODE_INLINE_BYTES:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.decoder, partial(fn, *args))

    @property
    def buffered(self) -> bool:
        return isinstance(self.reservoir, BufferedReservoir)

    def watch_stop_signals(self) -> Callable[[], None]:
        """Note SIGTERM/SIGINT in :attr:`stopping` before the handlers in place (uvicorn's,
        which stop the server) run; returns what puts those handlers back. Only the main
        thread may set handlers: elsewhere (an app run in a test's thread) it does nothing."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def noted(sig: int, frame: Any) -> None:
            self.stopping = True
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)
            elif handler != signal.SIG_IGN:  # the default: die by it, as without this
                signal.signal(sig, signal.SIG_DFL)
                signal.raise_signal(sig)

        for sig in STOP_SIGNALS:
            signal.signal(sig, noted)

        def undo() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return undo

    async def close(self) -> None:
        if self._lag_watch is not None:
            self._lag_watch.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
        if self.buffered:
            budget = self.buffer_config.graceful_shutdown_ms / 1000 + DEFAULT_STOP_MARGIN
            try:
                report = await asyncio.wait_for(self.reservoir.stop(), budget)
            except TimeoutError:
                # Storage (or the transport) does not answer: the drain could not end.
                stats = self.reservoir.stats()
                durable = self.reservoir.transport.durable
                log.error(
                    "buffer stop did not finish within %.0f s (storage or transport not answering); "
                    "%d records pending were %s",
                    budget, stats.get("pending", 0),
                    "kept by the transport for the next process" if durable else "lost",
                )  # fmt: skip
                report = None
                self.stop_incomplete = True
                # Tasks the buffer leaves behind may not end while storage is down, and
                # asyncio.run would wait for them forever: exit after a grace period.
                exit_soon(DEFAULT_STOP_MARGIN, 1)
            if report is not None:
                self._log_report(report)
        if self.tee is not None:
            try:
                await asyncio.wait_for(self.tee.close(), DEFAULT_STOP_MARGIN)
            except Exception:
                log.exception("closing the tee stream failed")
        self.decoder.shutdown(wait=False, cancel_futures=True)
        if self.client is not None:
            await self.client.close()

    @staticmethod
    def _log_report(report: dict[str, Any]) -> None:
        # A warning only when something was not stored: a clean stop is routine.
        clean = not (report.get("left") or report.get("lost") or report.get("timed_out"))
        log.log(
            logging.INFO if clean else logging.WARNING,
            "buffer stopped: flushed=%d left=%d kept=%d lost=%d timed_out=%s (%.1f s)",
            report.get("flushed", 0), report.get("left", 0), report.get("kept", 0),
            report.get("lost", 0), report.get("timed_out", False), report.get("seconds", 0.0),
        )  # fmt: skip

    def unavailable(self, message: str, *, handed_over: bool = False) -> ApiError:
        """A 503 + ``Retry-After``. ``handed_over``: the request's records were handed to
        the reservoir and their outcome is not a success: some may be stored (the answer
        says so); otherwise nothing of the request was stored."""
        if handed_over:
            then = (" Some records of this request may be stored: retry with the same "
                    "Idempotency-Key (a record is then stored once) after the Retry-After delay.")  # fmt: skip
        else:
            then = " Nothing of this request was stored; retry after the Retry-After delay."
        return ApiError(
            503,
            "Service unavailable",
            message + then,
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    async def accept(
        self,
        kind: str,
        project: str,
        records: list[dict[str, Any]],
        idempotency_key: str | None,
        origin: str = "api",
        *,
        route: str = "",
    ) -> int:
        """Hand ``records`` to the reservoir; raise a 503 unless every one was accepted.
        ``origin="otlp"``: a collector batched them already (the buffer does not delay them).
        Each record gets its stable ``_id`` here: from ``route`` and the idempotency key
        when there is one (a retry makes the same ids), else a fresh one per request.

        Before the hand-over every refusal stores nothing (the deadline passed, the record
        gate). Once handed over, the reservoir call is never cancelled at the deadline:
        the request waits for its outcome up to :data:`HANDED_OVER_GRACE` of the ingest
        timeout longer, so that a 503 is not given for records storage then stores. Only
        a reservoir that gives no outcome by then (or fails) makes a 503 whose records may
        be stored; that answer says so (``bucketq_ingest_unsettled``)."""
        self.reads.note(project)  # other projects' reads keep to their share meanwhile
        if idempotency_key:
            ids = keyed_record_ids(
                request_digest(project, route or kind, idempotency_key), len(records)
            )
        else:
            # Records accepted in the same second share a group: they pack together.
            ids = new_record_ids(len(records))
        for r, rid in zip(records, ids, strict=True):
            r["_id"] = rid
        method = STORAGE_METHOD[kind]
        timeout = self.config.ingest_timeout_ms / 1000
        if past_deadline():
            # Decoding (or waiting for the CPU) used the budget: nothing is handed over.
            self.admission.refused("deadline")
            raise self.unavailable(
                f"The request's {timeout:g} s (BUCKETQ_INGEST_TIMEOUT_MS) ran out before its "
                "records were handed to storage."
            )
        # What is left of the request's deadline (its key lookup came out of it too).
        budget = remaining(timeout)
        grace = HANDED_OVER_GRACE * timeout
        try:
            with self.records.admit(len(records), budget):
                call = getattr(self.reservoir, method)
                aw = call(records, origin=origin) if self.buffered else call(records)
                res = await _outcome(aw, budget, grace, len(records), kind)
        except Overloaded:
            self.admission.refused("records")
            raise
        except TimeoutError as exc:
            self.admission.unsettled_answer("timeout")
            self.storage_state.failed(f"no outcome within {budget + grace:.1f} s "
                                      "(BUCKETQ_INGEST_TIMEOUT_MS and its grace)")  # fmt: skip
            raise self.unavailable(
                f"Storage did not answer within {budget + grace:g} s (BUCKETQ_INGEST_TIMEOUT_MS "
                "and its grace for records handed over).",
                handed_over=True,
            ) from exc
        except Exception as exc:
            self.admission.unsettled_answer("error")
            self.storage_state.failed(f"{type(exc).__name__}: {one_line(exc)}")
            raise self.unavailable(
                f"Storage is unavailable ({type(exc).__name__}).", handed_over=True
            ) from exc
        failed = int(res.get("failed", 0))
        if failed:
            first = (res.get("errors") or [{}])[0]
            why = first.get("error", "") if isinstance(first, dict) else str(first)
            if failed == len(records):  # storage refused the request: an outage's line
                self.storage_state.failed(one_line(why))
            else:
                log.warning("%d of %d %s records not accepted: %s", failed, len(records), kind,
                            one_line(why))  # fmt: skip
            self.admission.unsettled_answer("partial")
            raise self.unavailable(
                f"{failed} of {len(records)} records were not accepted ({why}).", handed_over=True
            )
        if kind == "log" and self.tee is not None:
            try:
                await asyncio.wait_for(
                    self.tee.push_many([tee_item(project, r) for r in records], durable=True),
                    remaining(budget),
                )
            except Exception as exc:
                log.warning(
                    "tee stream %r refused %d records: %s",
                    self.config.tee_stream,
                    len(records),
                    exc,
                )
                self.admission.unsettled_answer("tee")
                raise self.unavailable(
                    "The records were accepted; the tee stream is unavailable.", handed_over=True
                ) from exc
        self.storage_state.answered()
        return len(records)

    async def claim_idempotency_key(self, route: str, project: str, key: str, digest: str) -> None:
        """Remember that ``key`` on ``route`` was sent with a body of ``digest``; a 422
        when it was sent before with another body (its records would silently be the
        first body's). Kept :data:`IDEMPOTENCY_TTL_S`; store calls within the ingest budget."""
        from pymongo import timeout as mongo_timeout

        coll = self.db[IDEMPOTENCY_COLLECTION]
        kid = hashlib.sha256(f"{project}\x00{route}\x00{key}".encode()).hexdigest()
        # pymongo's deadline, never the event loop's (asyncio.wait_for): a driver call
        # cancelled mid-reply closes its connection, and under load the reconnects wedged
        # the service (see the read route).
        try:
            with mongo_timeout(self.config.ingest_timeout_ms / 1000):
                if not self._idempotency_index:
                    try:
                        await coll.create_index("at", expireAfterSeconds=IDEMPOTENCY_TTL_S)
                    except OperationFailure as exc:
                        if exc.timeout:
                            raise
                        # another TTL on "at": keys still work
                        log.warning("idempotency keys' TTL index not made: %s", exc)
                    self._idempotency_index = True
                try:
                    await coll.insert_one({"_id": kid, "digest": digest, "at": datetime.now(UTC)})
                    return
                except DuplicateKeyError:
                    first = await coll.find_one({"_id": kid})
        except (TimeoutError, PyMongoError) as exc:
            self.storage_state.failed(f"idempotency key store: {type(exc).__name__}: "
                                      f"{one_line(exc)}")  # fmt: skip
            raise self.unavailable("The idempotency key store is unavailable.") from exc
        if first is not None and first.get("digest") != digest:
            raise ApiError(
                422,
                "Idempotency key reused",
                f"Idempotency-Key {key[:80]!r} was already used on {route} with another body; "
                "a retry must send the same body. Use a new key for new content. "
                "Nothing of this request was stored.",
            )


class StorageState:
    """Whether storage takes records, logged once per change: one warning when requests
    start failing (the first failure's reason, on one line), one when a request is stored
    again (how long it lasted, how many requests failed meanwhile); each failure in
    between at debug level. An outage under load is two lines, not one per request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: Since when requests fail (None: they are stored), and how many failed since.
        self.failing_since: float | None = None
        self.failures = 0

    def failed(self, why: str) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self.clock()
            log.warning("storage is not taking records (%s): requests are answered 503 until "
                        "it does; one line when it does", why)  # fmt: skip
        else:
            log.debug("storage is not taking records: %s", why)

    def answered(self) -> None:
        if self.failing_since is not None:
            log.warning("storage takes records again after %.1f s; %d requests failed there "
                        "meanwhile", self.clock() - self.failing_since, self.failures)  # fmt: skip
            self.failing_since, self.failures = None, 0


#: Once a request's records are handed to the reservoir it waits for their outcome up to
#: this share of ``BUCKETQ_INGEST_TIMEOUT_MS`` past its deadline (so its answer still comes
#: within twice the timeout of its body's arrival, with room for a busy event loop).
HANDED_OVER_GRACE = 0.8


async def _outcome(aw: Awaitable[T], budget: float, grace: float, n: int, kind: str) -> T:
    """The result of the reservoir call ``aw``, waited for ``budget`` seconds and then
    ``grace`` more; ``TimeoutError`` (the call cancelled) only when it has none by then.
    A call that ended is its outcome whenever it ended: a call that finished as the
    deadline passed (an event loop late on its timers) is not answered as timed out."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait((task,), timeout=budget)
        if not task.done():
            log.debug("%d %s records handed to the reservoir: no outcome within %.1f s, "
                      "waiting %.1f s more", n, kind, budget, grace)  # fmt: skip
            await asyncio.wait((task,), timeout=grace)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        raise TimeoutError
    return task.result()


#: Where idempotency keys are remembered, and for how long (seconds).
IDEMPOTENCY_COLLECTION = "idempotency_keys"
IDEMPOTENCY_TTL_S = 24 * 3600

#: Called before a forced exit (``bucketq serve`` stops its embedded server there).
AT_FORCED_EXIT: list[Any] = []


def exit_soon(delay: float, code: int) -> None:
    """In ``delay`` seconds, unless the process ended by itself, run
    :data:`AT_FORCED_EXIT` and leave with ``code`` (a daemon timer thread)."""

    def force() -> None:
        log.error("the process did not end %.0f s after shutdown; exiting (%d)", delay, code)
        for fn in AT_FORCED_EXIT:
            try:
                fn()
            except Exception:
                log.exception("cleanup before a forced exit failed")
        logging.shutdown()
        os._exit(code)

    t = threading.Timer(delay, force)
    t.daemon = True
    t.start()


def request_digest(project: str, route: str, key: str) -> str:
    """What names a request to ``route`` sent with ``Idempotency-Key: key`` (keys are
    scoped per project and route): its records' ids are ``<digest>.<index>``, so a retry
    makes the same ids, in one group (stored once however the retry is grouped)."""
    return hashlib.sha256(f"{project}\x00{route}\x00{key}".encode()).hexdigest()[:40]


def tee_item(project: str, r: dict[str, Any]) -> dict[str, Any]:
    """A log record as ``bucketq pipeline`` reads it (``ts, project, service, level, message``)."""
    item = {"ts": iso(r["time"]), "project": project, "service": r["service"],
            "level": r["level"], "message": r["message"]}  # fmt: skip
    for k in ("metadata", "trace_id", "span_id"):
        if r.get(k) is not None:
            item[k] = r[k]
    return item


async def get_service(request: Request) -> Service:
    """The app's :class:`Service` (opened by the lifespan). Async: FastAPI would run a
    plain function in a worker thread, a thread hop on every request."""
    svc: Service = request.app.state.svc
    return svc


#: A route's parameter for the service.
Svc = Annotated[Service, Depends(get_service)]
