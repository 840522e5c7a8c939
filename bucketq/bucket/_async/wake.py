"""Waking a waiting reader by change stream (pymongo ``AsyncMongoClient``).

One watcher serves both kinds of consumer: a stream consumer's ``next_batch`` and a
bucket queue's fetcher (whose "wait" is the time its claims come back empty). A
:class:`AsyncWakeWatcher` follows the change events of one collection (filtered on the
server by a pipeline: each queue kind's ``WAKEUP_PIPELINE``) and notifies a notifier
for each, while a reader waits: the reader reads ``gen`` before its read, then waits
on the notifier with its poll interval as the bound, so a change event (or a notify
from a local writer) ends the wait at once, and polling goes on wherever change
streams are unavailable.

- It runs in a guarded background loop (``bucketq._guard.LoopGuard``): a failure it does
  not expect is counted in ``stats["loop_errors"]`` and the loop goes on.
- It reads the change stream only while the reader waits (the stream stays open, the
  server keeps its place); after ``WATCH_IDLE_CLOSE`` seconds without a waiting reader
  it closes the stream and ends, and the reader's next wait starts it again.
- Each time it opens a change stream it notifies once: what was stored before the
  stream opened is then read by the reader's next read, so nothing falls between.
- A server without change streams (or a user without the right to open one:
  ``no_change_streams``) is met once: it counts ``stats["change_stream_fallbacks"]``,
  logs it, and leaves the reader polling. Other failures (the server away, a
  failover) are counted in ``stats["change_stream_errors"]`` and the stream is opened
  again after a back-off.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymongo.errors import InvalidOperation, PyMongoError

from ..._guard import backoff
from .. import writes
from ..concurrency import AsyncMutex, AsyncNotifier, AsyncWorker

_monotonic = time.monotonic


@dataclass(eq=False, kw_only=True)
class AsyncWakeWatcher:
    """Notifies ``wake`` on each change event of ``col`` that ``pipeline`` lets through,
    while a reader wants it (:meth:`want` before each wait, :meth:`done` after).
    ``stats`` is its owner's counters, which hold ``change_stream_events``,
    ``change_stream_errors`` and ``change_stream_fallbacks``."""

    col: Any
    pipeline: list[dict[str, Any]]
    wake: AsyncNotifier
    what: str
    stats: dict[str, int]
    logger: logging.Logger
    bounded: Callable[[float], Any]
    op_timeout: float
    #: The owner's factory of guarded loops: ``worker(role, fn, stopped)``.
    worker: Callable[..., AsyncWorker]
    #: True once the reader closed (or, for a stream consumer, was fenced).
    stopped: Callable[[], bool]
    #: change_streams=True: their absence is a warning.
    expected: bool = False
    wanted: bool = field(default=False, init=False)
    #: A loop owns the watch (in it, or restarting after a failure).
    running: bool = field(default=False, init=False)
    active: bool = field(default=False, init=False)  # inside the loop now
    #: The server has no change streams: never started again.
    polling: bool = field(default=False, init=False)
    live: bool = field(default=False, init=False)  # a change stream is open
    loop: AsyncWorker | None = field(default=None, init=False)  # the last loop started
    _want: AsyncNotifier = field(default_factory=AsyncNotifier, init=False, repr=False)
    _stop: AsyncNotifier = field(default_factory=AsyncNotifier, init=False, repr=False)
    _mutex: AsyncMutex = field(default_factory=AsyncMutex, init=False, repr=False)

    def want(self) -> None:
        """A reader is about to wait: have the change stream read (start the loop if
        none runs)."""
        with self._mutex:
            self.wanted = True
            start = not self.running and not self.polling and not self.stopped()
            if start:
                self.running = True
        if start:
            self.loop = self.worker("watcher", self._run, self.stopped)
        else:
            self._want.notify()

    def done(self) -> None:
        """The reader stopped waiting."""
        self.wanted = False

    def stop(self) -> None:
        """The reader closed (``stopped()`` says so from now on): end the loop."""
        self.done()
        self._want.notify()
        self._stop.notify()

    async def join(self) -> None:
        if self.loop is not None:
            # It may sit in a change-stream read for up to WATCH_AWAIT_MS: don't wait
            # for it (it ends when that read returns; the async task is cancelled).
            await self.loop.join(0)

    async def _run(self) -> None:
        self.active = True
        try:
            await self._watch()
        finally:
            self.active = False
            self.live = False

    def _idle_end(self) -> bool:
        """End the loop if no reader wants it (decided under the mutex, so a reader's
        ``want`` either sees the loop running or starts a new one)."""
        with self._mutex:
            if self.wanted and not self.stopped():
                return False
            self.running = False
            return True

    async def _watch(self) -> None:
        attempt = 0
        while True:
            if self._idle_end():
                return
            try:
                with self.bounded(self.op_timeout):
                    stream = await self.col.watch(
                        self.pipeline, max_await_time_ms=writes.WATCH_AWAIT_MS
                    )
            except InvalidOperation:  # the client was closed: nothing to watch any more
                with self._mutex:
                    self.running = False
                return
            except PyMongoError as exc:
                if writes.no_change_streams(exc):
                    with self._mutex:
                        self.polling = True
                        self.running = False
                    self.stats["change_stream_fallbacks"] += 1
                    self.logger.log(
                        logging.WARNING if self.expected else logging.INFO,
                        "%s: no change streams here (%s); the consumer polls instead "
                        "(counted in stats()['change_stream_fallbacks'])",
                        self.what,
                        exc,
                    )
                    return
                attempt = await self._failed("opening the change stream", exc, attempt)
                continue
            try:
                async with stream:
                    self.live = True
                    attempt = 0
                    # What was stored before the stream opened: have the reader read again.
                    self.wake.notify()
                    await self._follow(stream)
            except InvalidOperation:
                with self._mutex:
                    self.running = False
                return
            except PyMongoError as exc:
                attempt = await self._failed("the change stream", exc, attempt)
            finally:
                self.live = False

    async def _follow(self, stream: Any) -> None:
        """Read ``stream`` while the reader waits; return when it should be closed."""
        idle_since: float | None = None
        while not self.stopped():
            if not self.wanted:
                # Leave the stream unread (the server keeps its place) until the reader
                # waits again, or close it after WATCH_IDLE_CLOSE.
                now = _monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since >= writes.WATCH_IDLE_CLOSE:
                    return
                gen = self._want.gen
                if not self.wanted:
                    await self._want.wait(gen, 1.0)
                continue
            idle_since = None
            with self.bounded(self.op_timeout):
                change = await stream.try_next()
            if change is not None:
                self.stats["change_stream_events"] += 1
                self.wake.notify()
            elif not stream.alive:  # invalidated (the collection was dropped): open anew
                return

    async def _failed(self, where: str, exc: BaseException, attempt: int) -> int:
        """Count and log a failed change stream, wait a back-off, and return the attempt."""
        if self.stopped():
            return attempt
        attempt += 1
        self.stats["change_stream_errors"] += 1
        delay = backoff(attempt, 0.1, 5.0, full_jitter=True)
        self.logger.info(
            "%s: %s failed (%s); the consumer polls meanwhile, opening it again in %.2f s",
            self.what,
            where,
            exc,
            delay,
        )
        gen = self._stop.gen
        if not self.stopped():
            await self._stop.wait(gen, delay)  # stop() cuts it short
        return attempt
