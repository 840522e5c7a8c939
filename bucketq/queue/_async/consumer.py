"""The consume side of the bucket queue (pymongo ``AsyncMongoClient``).

It claims buckets (the fetcher, woken by the change-stream watcher, ``wake.py``, or by
polling), hands their items to ``reserve()`` callers, and writes their state back (the flusher:
commits, rollbacks, lease renewals, releases, dead letters). The queue owns it and
hands it what both sides share: the collection, the mutex, the counters, bounded
driver calls and the background-worker factory.

One job a module, each class built on the one below: what it holds
(``consumer_state.py``), dead letters (``dead_lettering.py``), the state flush
(``state_flush.py``), claims (``claiming.py``), drain and stop (``drain.py``); this
module serves: ``reserve()``, ``commit()``, ``rollback()`` and the like.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import time
from typing import Any

from ... import _validate as v
from ... import bucket
from ...bucket.concurrency import async_pass_turn
from ...errors import QueueClosed
from .. import _core as core
from .claiming import AsyncClaiming
from .drain import AsyncDrain

_now = time.time
_monotonic = time.monotonic


class AsyncConsumer(AsyncDrain, AsyncClaiming):
    """The consume side of one queue object: serves its held buckets' messages to
    reserve() callers and takes their commits and rollbacks (see ``AsyncConsumerState``)."""

    def start(self) -> None:
        """Start the fetcher and the flusher (the fetcher starts the watcher when idle)."""
        if self.fetcher is None and not self._runtime.is_closed():
            self.fetcher = self._runtime.worker("fetcher", self._fetcher_loop)
            self.flusher = self._runtime.worker("flusher", self._flusher_loop)

    async def reserve(self, timeout: float | None = None) -> core.Message | None:
        out: list[core.Message] = []
        if timeout is not None:
            v.timeout("timeout", timeout)
        if self.ready and self.fetcher is not None:  # the common case: no waiting
            if self._turn_in <= 0:
                await self._pass_turn()  # before the take: a cancel here loses no item
            with self._mutex:
                self._take(_now(), 1, out)
                self._turn_in -= len(out)
            if out:
                return out[0]
        got = await self._reserve(1, timeout)
        return got[0] if got else None

    async def reserve_many(
        self, max_items: int, timeout: float | None = None
    ) -> list[core.Message]:
        return await self._reserve(bucket.check_max_items(max_items), v.timeout("timeout", timeout))

    async def _reserve(self, max_items: int, timeout: float | None) -> list[core.Message]:
        if self.fetcher is None:
            if self._runtime.is_closed():
                raise QueueClosed(f"Queue {self.name!r} is closed.")
            self.start()
        if self._turn_in <= 0:
            await self._pass_turn()
        deadline = None
        out: list[core.Message] = []
        while True:
            gen = self._consumers.gen
            with self._mutex:
                expired = self._take(_now(), max_items, out)
                self._turn_in -= len(out)
                if out or self.draining or self._runtime.is_closed():
                    return out
            if timeout is not None:
                if deadline is None:
                    deadline = _monotonic() + timeout
                remaining = deadline - _monotonic()
                if remaining <= 0:
                    return out
            else:
                remaining = None
            if expired:
                self._flush_wake.notify()
                period = self.options.state_flush_period
                remaining = period if remaining is None else min(remaining, period)
            self._waiters += 1
            try:
                await self._consumers.wait(gen, remaining)
            finally:
                self._waiters -= 1

    async def _pass_turn(self) -> None:
        """Let the event loop run the queue's own tasks (the fetcher, the flusher) and the
        others: served from memory, reserve() does not wait (``core.SERVE_TURN``). Given
        before an item is taken, never between its take and its return."""
        self._turn_in = core.SERVE_TURN
        await async_pass_turn()

    def _take(self, now: float, max_items: int, out: list[core.Message]) -> bool:
        """Move up to ``max_items`` ready messages into ``out`` (mutex held). True when a
        bucket's lease is (nearly) out: our process was frozen or cut off from the server,
        or its claim came back late, so nothing of it is handed out until the flusher
        renewed it or found it lost."""
        ready = self.ready
        if self.paused:
            return False
        limit = core.serve_until(now, self.options.lease)
        while ready and len(out) < max_items:
            msg = ready[0]
            b = msg.bucket
            if b.until <= limit and b.held:
                return True
            ready.popleft()
            b.queued -= 1
            if b.lost or b.released or not b.held:
                continue
            b.handed += 1
            b.handed_at[msg.index] = now
            out.append(msg)
            if b.queued == 0 and self._fetch_full:
                self._fetch_wake.notify()  # room for the fetcher's next claim
        if out:
            self._stats["reserved"] += len(out)
            self._last_reserve = now
        return False

    async def commit(self, msg: core.Message, *, flush: bool = False) -> bool:
        core.check_message(msg, self.origin, "commit")
        if flush is not False:
            v.flag("flush", flush)
        with self._mutex:
            ok = core.is_current(msg) and msg.bucket.commit(msg.index)
            if ok:
                self._stats["committed"] += 1
                if msg.bucket.finished() or self.releasing:
                    # Its last item (delete it), or paused with release (give it back if
                    # nothing of it is handed out now): now, not a period later.
                    self._flush_wake.notify()
        if ok and flush:
            with self._runtime.bounded(None, f"commit(flush=True) on queue {self.name!r}"):
                await self.flush_state()
            if msg.bucket.lost:
                return False
        return ok

    async def commit_many(self, msgs: Any, *, flush: bool = False) -> int:
        msgs = [core.check_message(m, self.origin, "commit_many") for m in v.payloads(msgs, "msgs")]
        v.flag("flush", flush)
        with self._mutex:
            done = [m for m in msgs if core.is_current(m) and m.bucket.commit(m.index)]
            self._stats["committed"] += len(done)
            if any(m.bucket.finished() for m in done):
                self._flush_wake.notify()
        if done and flush:
            with self._runtime.bounded(None, f"commit_many(flush=True) on queue {self.name!r}"):
                await self.flush_state()
            return sum(1 for m in done if not m.bucket.lost)
        return len(done)

    def touch(self, msg: core.Message) -> bool:
        core.check_message(msg, self.origin, "touch")
        with self._mutex:
            return core.is_current(msg) and msg.bucket.touch(msg.index, _now())

    async def rollback(self, msg: core.Message, delay: Any, next_t: Any, reason: Any) -> bool:
        core.check_message(msg, self.origin, "rollback")
        v.text("reason", reason, optional=True)
        now = _now()
        tries = msg.tries + 1
        not_before = core.rollback_time(now, delay, next_t, tries, self.options)
        b = msg.bucket
        max_tries = self.options.max_tries
        with self._mutex:
            if not core.is_current(msg):
                return False
            why = core.over_tried(tries, max_tries, rolled_back=True)
            if why is not None and b.state[msg.index] == core.RESERVED and not b.lost:
                b.tries[msg.index] = tries
                b.dying.append((msg.index, reason or why))
                self._stats["rolled_back"] += 1
                self._flush_wake.notify()
                return True
            ok = b.rollback(msg.index, not_before, now)
            if ok:
                self._stats["rolled_back"] += 1
                if b.state[msg.index] == core.READY:
                    again = b.ready_messages(now, max_tries)
                    b.queued += len(again)
                    self.ready.extend(again)
                    self._consumers.notify()
                if b.dying:
                    self._flush_wake.notify()
        return ok

    def pause(self, release: bool = False) -> None:
        self.releasing = self.releasing or release
        self.paused = True
        self._fetch_wake.notify()  # the fetcher sees it now (and its watcher stops reading)
        if release:
            self._flush_wake.notify()  # read-ahead goes back now, not a period later

    def resume(self) -> None:
        self.paused = self.releasing = False
        self._fetch_wake.notify()
        self._consumers.notify()
