"""What a processor holds (its queue, spill, endpoints, threads and counters), and its
bookkeeping: counting, records to the spill, batches in flight.

:class:`ProcessorState` is the base of the processor (``_processor``): the sender
threads (``_sending``) and the monitor and health threads (``_monitoring``) are built
on it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from typing import Any

from .._guard import LoopGuard
from ._endpoint import Endpoint
from ._options import DRAIN_START_PERCENT, LOGGER_NAME, Config
from ._queue import SafeQueue
from ._record import Queued, wire
from ._spill import Spill
from ._transport import Sender

log = logging.getLogger(LOGGER_NAME)


class _SdkThread(threading.local):
    #: a class attribute: reading it in an application thread raises nothing (a missing
    #: attribute read through getattr(..., default) costs an exception on every log call)
    active = False


#: ``active`` in every thread the SDK runs, so the handler ignores what they log (urllib3...)
sdk_thread = _SdkThread()

#: records the monitor writes to the spill at a time
_SPILL_CHUNK = 500
#: the spill buffer (records the full queue refused, on their way to the spill) holds up
#: to this many times ``queue_size``. The monitor shares the interpreter lock with the
#: application, so a hot loop of log calls outruns it for a while; a record that finds
#: the buffer full is converted and written by the caller's own thread, several times the
#: cost of a call, and such calls make up much of the slowest calls. A queued record is a
#: tuple of about 250 bytes: 4,000 of them are about 1 MB.
SPILL_BUFFER_QUEUES = 4


class ProcessorState:
    """The state of one configuration's processor; ``cfg`` is its configuration."""

    cfg: Config

    # -- setup -------------------------------------------------------------------------
    def _init_state(self) -> None:
        cfg = self.cfg
        #: wakes the monitor: fill reached 90%, or records wait in _overflow
        self._wake = threading.Event()
        #: wakes the health thread: an endpoint went down, or close()
        self._health_wake = threading.Event()
        self.queue = SafeQueue(cfg.queue_size, notify_every=cfg.batch_size,
                               high_water=DRAIN_START_PERCENT, high=self._wake)  # fmt: skip
        #: records the queue refused, on their way to the spill (written by the monitor)
        self._overflow: deque[Queued] = deque()
        self._overflow_max = SPILL_BUFFER_QUEUES * cfg.queue_size
        self._overflow_lock = threading.Lock()
        self.spill = Spill(
            cfg.spill_path(),
            max_bytes=cfg.spill_max_bytes,
            segment_bytes=cfg.spill_segment_bytes,
            meta={"url": cfg.url, "fallback_url": cfg.fallback_url},
        )
        self.primary = Endpoint("primary", cfg.ingest_url, cfg.base_url, cfg.api_key,
                                self._health_wake)  # fmt: skip
        self.fallback = (
            None
            if cfg.fallback_url is None
            else Endpoint(
                "fallback",
                cfg.fallback_ingest_url or "",
                cfg.fallback_base_url or "",
                cfg.fallback_api_key or cfg.api_key,
                self._health_wake,
            )  # fmt: skip
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._accepting = True
        self._inflight: dict[int, list[Queued]] = {}
        self._handling = 0
        self._tokens = itertools.count()
        self._threads: list[threading.Thread] = []
        self._drain_thread: threading.Thread | None = None
        #: the drain workers' connection pool, kept from one drain to the next (one at a time)
        self._drain_sender: Sender | None = None
        self._replay_thread: threading.Thread | None = None
        self._replay_wanted = self.spill.has_segments()
        self._spill_gen = 0
        self._replayed_gen = 0
        self._pid = os.getpid()
        self._warned: dict[str, float] = {}
        self.counters = {
            "sent": 0,
            "retried": 0,
            "to_fallback": 0,
            "replayed": 0,
            "refused": 0,
            "invalid": 0,
            "drains": 0,
            "worker_errors": 0,
        }
        self._lost: dict[str, int] = {}
        self.last_error = ""
        # Drains and replays are threads that come and go: one guard each across them.
        self._drain_guard = self._guard("drain worker")
        self._replay_guard = self._guard("replay")

    def _spawn(self, target: Any, name: str) -> threading.Thread:
        t = threading.Thread(target=self._run, args=(target,), daemon=True,
                             name=f"bucketq-sdk-{name}")  # fmt: skip
        # Drains and replays come and go: keep only the threads that still run.
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()
        return t

    def _run(self, target: Any) -> None:
        sdk_thread.active = True
        target()

    def _guard(self, loop: str) -> LoopGuard:
        """What a background thread does with a failure it did not expect, as every
        bucketq loop does (``bucketq._guard``): count it (``stats()["worker_errors"]``),
        log it with its traceback once per distinct failure, and back off (bounded)."""
        return LoopGuard(f"bucketq.sdk {loop}", self.counters, log,
                         counter="worker_errors", lock=self._lock)  # fmt: skip

    # -- counters ----------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def _lose(self, reason: str, n: int) -> None:
        with self._lock:
            self._lost[reason] = self._lost.get(reason, 0) + n

    def _warn(self, key: str, msg: str, *args: Any, every: float = 30.0) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= every:
            self._warned[key] = now
            log.warning(msg, *args)

    # -- spilling ----------------------------------------------------------------------
    def _spill_items(self, items: list[Queued], reason: str, *, retry: bool,
                     flush: bool = True) -> None:  # fmt: skip
        service = self.cfg.service
        try:
            records = [wire(i, service) for i in items]
        except Exception as exc:  # noqa: BLE001 - a record that cannot be converted
            self._lose("unconvertible", len(items))
            log.error("could not convert %d record(s) for the spill: %r", len(items), exc)
            return
        self.spill.append(records, reason, retry=retry, flush=flush)
        if retry:
            self._spill_gen += 1
        self._warn(
            "spill:" + reason.split(":")[0],
            "records go to the spill in %s (%s); they are replayed when %s",
            self.spill.directory,
            reason,
            "the primary answers"
            if retry
            else "you run `bucketq sdk replay` after fixing the cause",
        )

    def _write_overflow(self) -> None:
        """Write the records the queue refused to the spill (monitor, flush, stats, close)."""
        buf = self._overflow
        with self._overflow_lock:  # held while writing: flush() waits for the last chunk
            while buf:
                chunk: list[Queued] = []
                try:
                    while len(chunk) < _SPILL_CHUNK:
                        chunk.append(buf.popleft())
                except IndexError:
                    pass
                self._spill_items(chunk, "queue full", retry=True, flush=False)

    # -- in-flight batches -------------------------------------------------------------
    def _register(self, items: list[Queued]) -> int:
        token = next(self._tokens)
        with self._lock:
            self._inflight[token] = items
        return token

    def _claim(self, token: int) -> bool:
        """Take a batch out of flight to handle its outcome; False when close() took it.
        A claimed batch still counts as pending until :meth:`_handled`."""
        with self._lock:
            if self._inflight.pop(token, None) is None:
                return False
            self._handling += 1
            return True

    def _handled(self) -> None:
        with self._lock:
            self._handling -= 1
