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

One job a module, each class built on the one below: what the processor holds and its
bookkeeping (``_processor_state``), the senders and the drain worker (``_sending``),
the monitor and health threads and the replays (``_monitoring``); this module starts
the threads, takes the caller's records, and flushes, closes and reports.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ._monitoring import Monitoring
from ._options import LOGGER_NAME, Config
from ._record import Queued

log = logging.getLogger(LOGGER_NAME)


class Processor(Monitoring):
    """Queue + workers + drain + health + spill of one configuration. Use :func:`acquire`."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._init_state()
        self._users = 0
        self._closed = False
        self._start()

    # -- setup -------------------------------------------------------------------------
    def _start(self) -> None:
        for i in range(self.cfg.workers):
            self._spawn(self._worker_loop, f"worker-{i}")
        self._spawn(self._monitor_loop, "monitor")
        self._spawn(self._health_loop, "health")

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
