"""The consumer's drain and stop: serve what is in memory, release the rest, and end
its workers.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import time
from collections import deque

from ...bucket.concurrency import async_sleep
from .state_flush import AsyncStateFlush

_now = time.time
_monotonic = time.monotonic


class AsyncDrain(AsyncStateFlush):
    """Drains the consumer (``drain()``) and stops it (``wake_all``, ``join``)."""

    def stop_claiming(self) -> None:
        """drain() began: claim nothing more (a claim already under way is released)."""
        self.draining = True
        self._fetch_wake.notify()

    async def drain(self, timeout: float) -> tuple[int, int, int]:
        """Release at once the read-ahead nobody started on, serve what is in memory to
        reserve() callers (until consumed or ``timeout`` seconds), release the rest and
        flush state. Returns (items served, buckets released, items released unserved)."""
        with self._mutex:
            read_ahead = [b for b in self.held.values() if b.handed == 0]
            for b in read_ahead:
                b.released = True
                b.queued = 0
            self.ready = deque(m for m in self.ready if not m.bucket.released)
        if read_ahead:
            with self._runtime.bounded(None, f"drain() of queue {self.name!r}"):
                await self.release(read_ahead)
        served_before = self._stats["reserved"]
        deadline = _monotonic() + timeout
        while _monotonic() < deadline:
            with self._mutex:
                outstanding = sum(
                    b.outstanding - b.queued for b in self.held.values() if not b.lost
                )
            if not self.ready and not outstanding:
                break
            recent = _now() - self._last_reserve < 0.25
            if not outstanding and not self._waiters and not recent:
                break  # nothing here is consuming: do not sit out the deadline
            self._consumers.notify()
            await async_sleep(0.02)
        with self._mutex:
            left_in_memory = len(self.ready)
            self.ready.clear()
            for b in self.held.values():
                b.queued = 0
        released = len(self.held)
        with self._runtime.bounded(None, f"drain() of queue {self.name!r}"):
            await self.flush_state(release_all=True)
        self._consumers.notify()
        served = self._stats["reserved"] - served_before
        return served, released + len(read_ahead), left_in_memory

    def wake_all(self) -> None:
        """The queue closed: wake every worker and waiting reserve() so they see it."""
        for n in (self._fetch_wake, self._flush_wake, self._consumers):
            n.notify()
        if self.watcher is not None:
            self.watcher.stop()

    async def join(self) -> None:
        """Wait for the workers to end (each join is bounded: their driver calls are),
        then close the dead-letter queue."""
        for w in (self.fetcher, self.flusher):
            if w is not None:
                await w.join(5.0)
        if self.watcher is not None:
            await self.watcher.join()  # not waited for: it only wakes the fetcher
        if self._dlq is not None:
            await self._dlq.close()
