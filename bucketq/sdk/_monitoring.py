"""The processor's monitor thread (the spill buffer to the spill, drains and replays
started), its health thread (probes of an endpoint marked down), and the replays of
the spill to the primary they start.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ._options import DRAIN_STOP_PERCENT, LOGGER_NAME
from ._policy import DOWN, INVALID, RETRY, Outcome
from ._sending import Sending
from ._transport import Sender

log = logging.getLogger(LOGGER_NAME)

#: seconds the monitor sleeps when nothing wakes it (spill flush, replay checks)
_MONITOR_TICK = 0.25
#: a replay stops (to start again later) when the queue is this full with new records
REPLAY_YIELD_PERCENT = 50.0


class Monitoring(Sending):
    """The monitor and health threads, and the replays."""

    # -- threads -----------------------------------------------------------------------
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
