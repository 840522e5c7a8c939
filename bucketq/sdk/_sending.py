"""The processor's senders: a sender thread takes a request batch from the queue and
posts it to the primary (or the fallback while the primary is down), and an answer
decides what becomes of the batch (sent, back through the writeback, or to the spill);
the drain worker does the same with the fallback first once the queue is 90% full.
"""

from __future__ import annotations

import logging
import time

from ._endpoint import Endpoint
from ._options import DRAIN_BATCH_SIZE, DRAIN_START_PERCENT, DRAIN_STOP_PERCENT, LOGGER_NAME
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
from ._processor_state import ProcessorState
from ._record import Queued, wire
from ._transport import Sender

log = logging.getLogger(LOGGER_NAME)

#: seconds an idle sender waits for a first record before looking at its stop flag
_WORKER_IDLE = 1.0


class Sending(ProcessorState):
    """Sends request batches: the sender threads, the drain worker, what an answer does."""

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

    # -- sender threads and the drain worker -------------------------------------------
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
