"""The processor: one per configuration, owning its queue, threads, HTTP pools and spill.

::

    caller ──submit──▶ SafeQueue ──get_batch──▶ worker threads ──POST──▶ primary
       │ full           ▲  writeback               │ down          └──▶ fallback
       ▼                │                          ▼ both down / refused
     Spill ◀────────────┴──────────────────────── Spill ──replay (primary back)──▶ primary

    monitor thread: writes what the queue refused to the spill, starts the drain worker
                    at 90% fill, flushes the spill, starts replays
    health thread:  probes an endpoint marked down every health_interval

The caller's side (:meth:`Processor.submit`) is a deque append: when the queue is full
the record goes to a second bounded deque (``SPILL_BUFFER_QUEUES * queue_size``
records) that the monitor thread writes to the spill in batches; only when that one is
full too does the caller write its record to the spill itself. Every background thread sleeps on an event with
a long timeout rather than polling: a thread that wakes must take the interpreter lock
from the application.

Nothing is shared between processors: ``_registry.acquire`` returns the one processor of a
:class:`~bucketq.sdk._options.Config` (creating it on first use), and two configurations
never share a queue, thread, connection or spill file.
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
from ._options import DRAIN_BATCH_SIZE, DRAIN_START_PERCENT, DRAIN_STOP_PERCENT, LOGGER_NAME, Config
from ._policy import (
    DOWN,
    INVALID,
    OK,
    REFUSED,
    RETRY,
    Outcome,
    should_start_drain,
    should_stop_drain,
)
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

#: seconds the monitor sleeps when nothing wakes it (spill flush, replay checks)
_MONITOR_TICK = 0.25
#: seconds an idle sender waits for a first record before looking at its stop flag
_WORKER_IDLE = 1.0
#: records the monitor writes to the spill at a time
_SPILL_CHUNK = 500
#: the spill buffer (records the full queue refused, on their way to the spill) holds up
#: to this many times ``queue_size``. The monitor shares the interpreter lock with the
#: application, so a hot loop of log calls outruns it for a while; a record that finds
#: the buffer full is converted and written by the caller's own thread, several times the
#: cost of a call, and such calls make up much of the slowest calls. A queued record is a
#: tuple of about 250 bytes: 4,000 of them are about 1 MB.
SPILL_BUFFER_QUEUES = 4
#: a replay stops (to start again later) when the queue is this full with new records
REPLAY_YIELD_PERCENT = 50.0


class Processor:
    """Queue + workers + drain + health + spill of one configuration. Use :func:`acquire`."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._init_state()
        self._users = 0
        self._closed = False
        self._start()

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

    def _start(self) -> None:
        for i in range(self.cfg.workers):
            self._spawn(self._worker_loop, f"worker-{i}")
        self._spawn(self._monitor_loop, "monitor")
        self._spawn(self._health_loop, "health")

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

    # -- the caller's side -------------------------------------------------------------
    def submit(self, item: Queued) -> bool:
        """Queue ``item``; never waits. False: the queue was full (or the processor closed)
        and the record went to the spill instead."""
        if self._accepting:
            if self.queue.add(item):
                return True
            buf = self._overflow
            if len(buf) < self._overflow_max:
                buf.append(item)  # the monitor writes it to the spill
                if len(buf) == 1:
                    self._wake.set()
                return False
            reason = "queue full"  # and the monitor is behind: this call writes its own
        else:
            reason = "closed"
        self._spill_items([item], reason, retry=True, flush=False)
        return False

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

    # -- sending -----------------------------------------------------------------------
    def _route(self, *, drain: bool) -> Endpoint | None:
        now = time.monotonic()
        p, fb = self.primary, self.fallback
        if drain:
            if fb is not None and fb.up:
                # Asked to wait (Retry-After): the drain waits too. The primary is the
                # server that is not keeping up; a drain sent there can hang a whole timeout.
                return fb if fb.available(now) else None
            return p if p.available(now) else None
        if p.available(now):
            return p
        if fb is not None and fb.available(now):
            return fb
        return None

    def _paused_wait(self) -> float:
        """Seconds until an endpoint that is up but paused (Retry-After) may be used."""
        now = time.monotonic()
        waits = [e.paused_until - now for e in (self.primary, self.fallback)
                 if e is not None and e.up and e.paused_until > now]  # fmt: skip
        return min(waits) if waits else 0.0

    def _send_items(self, sender: Sender, items: list[Queued], *, drain: bool) -> str:
        token = self._register(items)
        try:
            return self._deliver(sender, items, drain=drain, token=token)
        except BaseException as exc:
            if self._claim(token):
                try:
                    self._spill_items(items, f"SDK error: {exc!r}", retry=True)
                finally:
                    self._handled()
            raise

    def _deliver(self, sender: Sender, items: list[Queued], *, drain: bool, token: int) -> str:
        target = self._route(drain=drain)
        if target is None and self._paused_wait() > 0:
            # Up but asked to wait (Retry-After) since this batch was taken: back it goes.
            if self._claim(token):
                try:
                    self._count("retried", len(items))
                    rest = self.queue.writeback_batch(items)
                    if rest:
                        self._spill_items(rest, "writeback full", retry=True)
                finally:
                    self._handled()
            return RETRY
        if target is None:
            if self._claim(token):
                try:
                    reasons = "; ".join(f"{e.name}: {e.reason}"
                                        for e in (self.primary, self.fallback) if e is not None)  # fmt: skip
                    self._spill_items(items, f"unreachable ({reasons})", retry=True)
                finally:
                    self._handled()
            return DOWN
        service = self.cfg.service
        records = [wire(i, service) for i in items]
        outcome = sender.post(target.ingest_url, target.api_key, records)
        if not self._claim(token):
            return outcome.kind  # close() took this batch to the spill meanwhile
        try:
            self._handle(target, items, outcome)
        finally:
            self._handled()
        return outcome.kind

    def _handle(self, target: Endpoint, items: list[Queued], outcome: Outcome) -> None:
        n = len(items)
        if outcome.kind == OK:
            self._count("sent" if target is self.primary else "to_fallback", n)
            return
        self.last_error = f"{target.name}: {outcome.reason}"
        if outcome.kind == REFUSED:
            self._count("refused", n)
            log.warning("the %s server refused %d record(s) (%s); they are in the spill",
                        target.name, n, outcome.reason)  # fmt: skip
            self._spill_items(items, outcome.reason, retry=False)
            return
        if outcome.kind == INVALID:
            # Not delivered, whatever the status said: to the spill (replayed once the
            # endpoint answers as the service does), and the endpoint left alone for a
            # probe's interval meanwhile (the fallback, if any, takes the records).
            self._count("invalid", n)
            target.pause(self.cfg.health_interval, outcome.reason)
            self._warn("invalid:" + target.name, "the %s server's answer was not the service's: "
                       "%d record(s) are in the spill (%s)", target.name, n, outcome.reason)  # fmt: skip
            self._spill_items(items, outcome.reason, retry=True)
            return
        if outcome.kind == RETRY:
            target.pause(outcome.retry_after, outcome.reason)
            self._warn("retry:" + target.name, "the %s server asked to wait %.1f s (%s)",
                       target.name, outcome.retry_after, outcome.reason)  # fmt: skip
        elif target.mark_down(outcome.reason):
            log.warning("the %s server at %s is down (%s); %s", target.name, target.base_url,
                        outcome.reason,
                        "sending to the fallback" if target is self.primary and self.fallback
                        else "records go to the spill until it answers")  # fmt: skip
        self._requeue(items, outcome)

    def _requeue(self, items: list[Queued], outcome: Outcome) -> None:
        """Back through the writeback if some endpoint can take them now or after a pause;
        to the spill if none can (both down) or the writeback is full."""
        reachable = any(e is not None and e.up for e in (self.primary, self.fallback))
        if not reachable or self._stop.is_set():
            self._spill_items(items, f"unreachable ({outcome.reason})", retry=True)
            return
        self._count("retried", len(items))
        rest = self.queue.writeback_batch(items)
        if rest:
            self._spill_items(rest, "writeback full", retry=True)

    # -- threads -----------------------------------------------------------------------
    def _worker_loop(self) -> None:
        sender = Sender(self.cfg)
        cfg = self.cfg
        guard = self._guard("worker")
        try:
            while not self._stop.is_set():
                try:
                    wait = self._paused_wait()
                    if wait > 0 and self._route(drain=False) is None:
                        self._stop.wait(min(wait, 0.5))
                        continue
                    batch = self.queue.get_batch(cfg.batch_size, timeout=_WORKER_IDLE,
                                                 fill_wait=cfg.batch_wait)  # fmt: skip
                    if batch:
                        self._send_items(sender, batch, drain=False)
                except Exception as exc:  # noqa: BLE001 - the guard logs it with its traceback
                    self._stop.wait(guard.failed(exc))
        finally:
            sender.close()

    def _monitor_loop(self) -> None:
        guard = self._guard("monitor")
        while not self._stop.is_set():
            try:
                self._wake.wait(_MONITOR_TICK)
                self._wake.clear()
                self._write_overflow()
                self._maybe_drain()
                self.spill.flush()
                if (
                    not self._replay_wanted
                    and self._spill_gen != self._replayed_gen
                    and self.queue.fill_percentage() <= DRAIN_STOP_PERCENT
                ):
                    # Records spilled while the primary was up (queue full, shutdown of
                    # another process): send them once there is room again.
                    self._replay_wanted = True
                if (
                    self._replay_wanted
                    and self.queue.fill_percentage() < REPLAY_YIELD_PERCENT
                    and self.primary.available(time.monotonic())
                    and (self._replay_thread is None or not self._replay_thread.is_alive())
                    and not self._stop.is_set()
                ):
                    self._replay_wanted = False
                    self._replay_thread = self._spawn(self._replay, "replay")
            except Exception as exc:  # noqa: BLE001 - the guard logs it with its traceback
                self._stop.wait(guard.failed(exc))

    def _guard(self, loop: str) -> LoopGuard:
        """What a background thread does with a failure it did not expect, as every
        bucketq loop does (``bucketq._guard``): count it (``stats()["worker_errors"]``),
        log it with its traceback once per distinct failure, and back off (bounded)."""
        return LoopGuard(f"bucketq.sdk {loop}", self.counters, log,
                         counter="worker_errors", lock=self._lock)  # fmt: skip

    def _maybe_drain(self) -> None:
        running = self._drain_thread is not None and self._drain_thread.is_alive()
        if not running and self._route(drain=True) is None:
            return  # nowhere to send: the senders spill what they take, a drain would too
        if should_start_drain(self.queue.fill_percentage(), DRAIN_START_PERCENT, running):
            self._count("drains")
            self._drain_thread = self._spawn(self._drain_loop, "drain")

    def _drain_loop(self) -> None:
        if self._drain_sender is None:
            self._drain_sender = Sender(self.cfg)
        sender = self._drain_sender
        try:
            while not self._stop.is_set():
                if should_stop_drain(self.queue.fill_percentage(), DRAIN_STOP_PERCENT):
                    break
                batch = self.queue.get_batch(DRAIN_BATCH_SIZE)
                if not batch:
                    break
                if self._send_items(sender, batch, drain=True) != OK:
                    break
        except Exception as exc:  # noqa: BLE001 - the guard logs it; the monitor starts another
            self._drain_guard.failed(exc)

    def _health_loop(self) -> None:
        sender = Sender(self.cfg)
        guard = self._guard("health probe")
        interval = self.cfg.health_interval
        wake = self._health_wake
        try:
            while not self._stop.is_set():
                try:
                    down = [ep for ep in (self.primary, self.fallback)
                            if ep is not None and not ep.up]  # fmt: skip
                    if not down:  # sleep until an endpoint goes down (or close())
                        wake.wait(60.0)
                        wake.clear()
                        continue
                    next_probe = interval
                    for ep in down:
                        last = getattr(ep, "_probed", 0.0)
                        due = last + interval - time.monotonic()
                        if due > 0:
                            next_probe = min(next_probe, due)
                            continue
                        ep._probed = time.monotonic()  # type: ignore[attr-defined]
                        if sender.probe(ep.base_url) and ep.mark_up():
                            log.warning("the %s server at %s answers again", ep.name,
                                        ep.base_url)  # fmt: skip
                            if ep is self.primary:
                                self._replay_wanted = True
                    self._stop.wait(next_probe)
                except Exception as exc:  # noqa: BLE001 - the guard logs it with its traceback
                    self._stop.wait(guard.failed(exc))
        finally:
            sender.close()

    def _replay(self) -> None:
        sender = Sender(self.cfg)
        p = self.primary
        gen = self._spill_gen
        self._replayed_gen = gen

        def send(records: list[dict[str, Any]]) -> Outcome:
            if not p.available(time.monotonic()):
                return Outcome(DOWN, 0, "primary unavailable")
            out = sender.post(p.ingest_url, p.api_key, records)
            if out.kind == DOWN:
                p.mark_down(out.reason)
            elif out.kind == RETRY:
                p.pause(out.retry_after, out.reason)
            elif out.kind == INVALID:
                p.pause(self.cfg.health_interval, out.reason)
            return out

        try:
            # Replay in quiet periods: it gives way (and resumes later) once new records
            # fill half the queue, so it never competes with a burst for the senders' CPU.
            def busy() -> bool:
                return self._stop.is_set() or self.queue.fill_percentage() >= REPLAY_YIELD_PERCENT

            result = self.spill.replay(send, batch_size=self.cfg.batch_size, should_stop=busy)
            self._count("replayed", result.sent)
            if result.sent:
                log.info("replayed %d spilled record(s) to %s", result.sent, p.base_url)
            if result.stopped or result.skipped_segments or self._spill_gen != gen:
                # Went away again, or someone was still writing: try again when it is up.
                self._replay_wanted = True
                self._stop.wait(0.5)
        except Exception as exc:  # noqa: BLE001 - the guard logs it; the monitor tries again
            self._replay_wanted = True
            self._stop.wait(self._replay_guard.failed(exc))
        finally:
            sender.close()

    # -- flush / close -----------------------------------------------------------------
    def pending(self) -> int:
        return len(self.queue) + len(self._overflow) + len(self._inflight) + self._handling

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued was handled (sent, or spilled), at most ``timeout``
        seconds (default ``shutdown_timeout``); True when nothing is pending."""
        self._write_overflow()
        if self.pending() == 0:
            self.spill.flush()
            return True
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.queue.urgent = True
        self.queue.wake_all()
        try:
            while self.pending() > 0:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
        finally:
            self.queue.urgent = False
        self._write_overflow()  # also waits for a chunk the monitor is writing
        self.spill.flush()
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush with ``timeout`` (default ``shutdown_timeout``), spill what is left, stop the
        threads. True when everything was sent (nothing spilled by the close). Idempotent."""
        if self._closed:
            return True
        timeout = self.cfg.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        done = self.flush(timeout)
        self._finish_replay(deadline)
        self._accepting = False
        self._stop.set()
        self._health_wake.set()
        self._wake.set()
        self.queue.wake_all()
        self._write_overflow()
        left = self.queue.take_all()
        with self._lock:
            inflight = [i for items in self._inflight.values() for i in items]
            self._inflight.clear()
        if left or inflight:
            self._spill_items(left + inflight, "shutdown: not sent within shutdown_timeout",
                              retry=True)  # fmt: skip
        me = threading.current_thread()
        end = time.monotonic() + 1.0
        for t in self._threads:
            if t is not me and t.is_alive():
                t.join(max(0.0, end - time.monotonic()))
        late = self.queue.take_all()
        if late:
            self._spill_items(late, "closed", retry=True)
        self._write_overflow()
        if self._drain_sender is not None:
            self._drain_sender.close()
        self.spill.close()
        self._closed = True
        from ._registry import _forget  # it imports this module

        _forget(self)
        if self.spill.has_segments():
            log.warning(
                "records stay in the spill in %s: the next process sending to %s with the same "
                "API key replays them once the server answers; to send them now: "
                "bucketq sdk replay %s --url %s --api-key KEY",
                self.spill.directory, self.cfg.base_url, self.spill.directory, self.cfg.base_url,
            )  # fmt: skip
        return done and not left and not inflight

    def _finish_replay(self, deadline: float) -> None:
        """At close, while the primary answers: one replay pass of what is spilled (this
        process's records, or those an exited process left) within the shutdown deadline,
        so a program that lives less than a monitor tick still sends an earlier spill."""
        t = self._replay_thread
        wanted = self._replay_wanted or self._spill_gen != self._replayed_gen
        if (t is None or not t.is_alive()) and wanted:
            if not self.primary.available(time.monotonic()):
                return
            self._replay_wanted = False
            t = self._replay_thread = self._spawn(self._replay, "replay")
        if t is not None and t.is_alive():
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, Any]:
        """The counters; records waiting for the spill are written first, so ``spilled``
        counts every record the queue refused."""
        self._write_overflow()
        with self._lock:
            c = dict(self.counters)
            lost = dict(self._lost)
        for k, v in self.spill.lost.items():
            lost[k] = lost.get(k, 0) + v
        return {
            "queued": self.queue.added,
            "queue_full": self.queue.refused,
            "sent": c["sent"],
            "retried": c["retried"],
            "to_fallback": c["to_fallback"],
            "spilled": self.spill.written,
            "replayed": c["replayed"],
            "refused": c["refused"],
            "invalid": c["invalid"],
            "lost": lost,
            "lost_total": sum(lost.values()),
            "pending": self.pending(),
            "fill_percentage": self.queue.fill_percentage(),
            "primary_up": self.primary.up,
            "fallback_up": None if self.fallback is None else self.fallback.up,
            "drains": c["drains"],
            "worker_errors": c["worker_errors"],
            "damaged": self.spill.damaged,
            "last_error": self.last_error,
            "spill_dir": str(self.spill.directory),
        }

    # -- sharing -----------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        # The parent's threads do not exist here and its locks may be held: start afresh.
        # What the parent had queued stays the parent's (sending it here would duplicate it).
        if self.spill._file is not None:
            try:
                self.spill._file.close()
            except OSError:
                pass
        self._init_state()
        self._start()
