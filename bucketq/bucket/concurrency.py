"""The few concurrency primitives the queue shells use, in an async and a sync flavour
with the same names less the ``Async`` prefix, so ``scripts/unasync.py`` can turn the
async shell into the sync one by renaming alone.

Async flavour: one event loop, so memory-only critical sections need no lock
(:class:`AsyncMutex` is a no-op); background work runs as tasks.
Sync flavour: threads, so :class:`Mutex` is a real lock; background work runs in
daemon threads.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from .._guard import LoopGuard
from ..errors import PushFailed, QueueClosed, WriteConcernNotConfirmed
from .deadline import StartupBusy
from .document import item_id

log = logging.getLogger("bucketq.queue")

# -- async flavour -------------------------------------------------------------------


class AsyncMutex:
    """Guards memory-only sections (no await inside): nothing to do on one event loop."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


AsyncLock = asyncio.Lock


class AsyncNotifier:
    """Wake-ups that cannot be lost: read ``gen`` before checking the condition, then
    ``await wait(gen, timeout)`` returns at once if a notify came in between."""

    __slots__ = ("gen", "_event")

    def __init__(self) -> None:
        self.gen = 0
        self._event: asyncio.Event | None = None

    def notify(self) -> None:
        self.gen += 1
        ev = self._event
        if ev is not None:
            self._event = None
            ev.set()

    async def wait(self, gen: int, timeout: float | None) -> None:
        if gen != self.gen or (timeout is not None and timeout <= 0):
            return
        ev = self._event
        if ev is None:
            ev = self._event = asyncio.Event()
        try:
            if timeout is None:
                await ev.wait()
            else:
                await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass


class AsyncBatch:
    """Completion of one bucket insert, shared by the receipts of its items."""

    __slots__ = ("_event", "error", "_done")

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._done = False

    def resolve(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done = True
        if self._event is not None:
            self._event.set()

    def done(self) -> bool:
        return self._done

    async def wait(self, timeout: float | None = None) -> bool:
        if not self._done:
            if self._event is None:
                self._event = asyncio.Event()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return False
        if self.error is not None:
            raise receipt_error(self.error)
        return True


def receipt_error(error: BaseException) -> PushFailed:
    """What a receipt raises for its bucket's outcome: a fresh exception per wait, so
    receipts sharing a bucket do not share one traceback."""
    new: PushFailed
    if isinstance(error, WriteConcernNotConfirmed):  # stored: say so
        new = WriteConcernNotConfirmed(str(error))
        new.__cause__ = error.__cause__
    else:
        new = PushFailed(f"The item was NOT stored: {error}")
        new.__cause__ = error
    return new


class _Receipt:
    """What both flavours of receipt are: an item (``index``) of a bucket whose batch
    resolves once the bucket is stored (or failed)."""

    __slots__ = ("_bucket", "index")

    def __init__(self, bucket: Any, index: int) -> None:
        self._bucket = bucket
        self.index = index

    @property
    def id(self) -> str:
        return item_id(self._bucket.id, self.index)

    def done(self) -> bool:
        return self._bucket.batch.done()

    def __repr__(self) -> str:
        return f"<Receipt {self.id} {'stored' if self.done() else 'pending'}>"


class AsyncReceipt(_Receipt):
    """Returned by push: ``await receipt`` (or ``await receipt.wait(timeout)``) returns
    once the item's bucket is in MongoDB under the queue's write concern, and raises
    :class:`~bucketq.errors.PushFailed` if it never got there."""

    __slots__ = ()

    async def wait(self, timeout: float | None = None) -> bool:
        """True once stored; False if ``timeout`` passed first."""
        return await self._bucket.batch.wait(timeout)

    def __await__(self) -> Generator[Any, None, bool]:
        return self.wait().__await__()


class AsyncWorker:
    """A background task running a loop until it returns. With a ``guard``, a failure
    the loop did not handle is counted and logged there, and the loop is started again
    after the guard's back-off, unless ``stopped()`` (the queue closed) says not to."""

    def __init__(
        self,
        name: str,
        fn: Callable[[], Coroutine[Any, Any, None]],
        guard: LoopGuard | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        self.guard = guard
        # A fresh context: a task inherits its creator's context variables, and a
        # pymongo.timeout() block around the first push would otherwise bound every
        # call the worker ever makes by that block's deadline.
        self._task = asyncio.get_running_loop().create_task(
            self._run(fn, guard, stopped), name=name, context=contextvars.Context()
        )

    @staticmethod
    async def _run(
        fn: Callable[[], Coroutine[Any, Any, None]],
        guard: LoopGuard | None,
        stopped: Callable[[], bool],
    ) -> None:
        while True:
            try:
                await fn()
                return
            except Exception as exc:  # the guard counts and logs it; go on
                if guard is None or stopped():
                    raise
                await asyncio.sleep(guard.failed(exc))
                if stopped():
                    return

    async def join(self, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
        except asyncio.CancelledError:
            pass


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def async_pass_turn() -> None:
    """Let the event loop run the other tasks once: a caller that never waits (a
    reserve() served from memory) would otherwise keep them from running until it does."""
    await asyncio.sleep(0)


def async_register_exit(obj: Any) -> None:
    """Async queues cannot be flushed from atexit: close them with ``async with``."""
    watch_fork(obj)


# -- start-up work: once per collection and process, never two at once ---------------

#: Held while a shell creates a collection or an index. One lock for the whole process
#: (sync and async shells alike): two concurrent creations stall the embedded server.
_STARTUP_LOCK = threading.Lock()
#: What start-up work is done in this process: (server addresses, db, collection, what).
STARTUP_DONE: set[tuple[Any, ...]] = set()


def startup_key(col: Any, what: str) -> tuple[Any, ...]:
    """The key of one piece of start-up work on collection ``col`` (no I/O)."""
    client = col.database.client
    try:
        servers = tuple(sorted(client.topology_description.server_descriptions()))
    except Exception:  # noqa: BLE001 - a client we cannot describe: key by identity
        servers = (id(client),)
    return (servers, col.database.name, col.name, what)


def _busy(timeout: float) -> StartupBusy:
    return StartupBusy(f"other start-up work held the start-up lock for {timeout:.1f} s")


class AsyncStartup:
    """``async with AsyncStartup(timeout):`` around start-up work: waits (without
    blocking the event loop) at most ``timeout`` seconds for the process-wide start-up
    lock, else raises :class:`StartupBusy`."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    async def __aenter__(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not _STARTUP_LOCK.acquire(blocking=False):
            if time.monotonic() >= deadline:
                raise _busy(self.timeout)
            await asyncio.sleep(0.005)

    async def __aexit__(self, *exc: object) -> None:
        _STARTUP_LOCK.release()


# -- sync flavour --------------------------------------------------------------------

Mutex = threading.Lock
Lock = threading.Lock


class Notifier:
    __slots__ = ("gen", "_cond")

    def __init__(self) -> None:
        self.gen = 0
        self._cond = threading.Condition(threading.Lock())

    def notify(self) -> None:
        with self._cond:
            self.gen += 1
            self._cond.notify_all()

    def wait(self, gen: int, timeout: float | None) -> None:
        if gen != self.gen or (timeout is not None and timeout <= 0):
            return
        with self._cond:
            if gen == self.gen:
                self._cond.wait(timeout)


class Batch:
    __slots__ = ("_event", "error")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.error: BaseException | None = None

    def resolve(self, error: BaseException | None = None) -> None:
        self.error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._event.wait(timeout):
            return False
        if self.error is not None:
            raise receipt_error(self.error)
        return True


class Receipt(_Receipt):
    """Returned by push: ``receipt.wait(timeout)`` returns True once the item's bucket is
    in MongoDB under the queue's write concern (False if ``timeout`` passed first), and
    raises :class:`~bucketq.errors.PushFailed` if it never got there."""

    __slots__ = ()

    def wait(self, timeout: float | None = None) -> bool:
        return self._bucket.batch.wait(timeout)


class Worker:
    def __init__(
        self,
        name: str,
        fn: Callable[[], None],
        guard: LoopGuard | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        self.guard = guard
        self._thread = threading.Thread(
            target=self._run, args=(fn, guard, stopped), name=name, daemon=True
        )
        self._thread.start()

    @staticmethod
    def _run(fn: Callable[[], None], guard: LoopGuard | None, stopped: Callable[[], bool]) -> None:
        while True:
            try:
                fn()
                return
            except Exception as exc:  # the guard counts and logs it; go on
                if guard is None or stopped():
                    raise
                time.sleep(guard.failed(exc))
                if stopped():
                    return

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def pass_turn() -> None:
    """Threads take turns without being asked."""


class Startup:
    """``with Startup(timeout):`` around start-up work: the process-wide start-up lock,
    waited for at most ``timeout`` seconds (else :class:`StartupBusy`)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def __enter__(self) -> None:
        if not _STARTUP_LOCK.acquire(timeout=self.timeout):
            raise _busy(self.timeout)

    def __exit__(self, *exc: object) -> None:
        _STARTUP_LOCK.release()


_open_queues: weakref.WeakSet[Any] = weakref.WeakSet()


def register_exit(obj: Any) -> None:
    """Flush sync queues at interpreter exit, so buffered pushes are not lost."""
    watch_fork(obj)
    _open_queues.add(obj)


# -- os.fork() ----------------------------------------------------------------------
# A forked child inherits a queue's memory (buffered pushes, read-ahead items, held
# leases) but not its background threads or tasks: using it there would hang (flush
# waits for a writer that does not exist) or deliver items the parent delivers too.
# So every queue is marked in the child, and its methods raise used_after_fork().

_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_fork(obj: Any) -> None:
    obj._forked = False
    obj._pid = os.getpid()
    _watched.add(obj)


def used_after_fork(obj: Any) -> QueueClosed:
    return QueueClosed(
        f"{type(obj).__name__} {getattr(obj, 'name', '')!r} was opened in process "
        f"{getattr(obj, '_pid', '?')} before os.fork(); this process ({os.getpid()}) is the "
        "child and cannot use it (its background threads and connections stay with the "
        "parent, which still owns its buffered and reserved items). Open a new MongoClient "
        "and a new queue in the child."
    )


def _after_fork_in_child() -> None:
    for q in list(_watched):
        q._forked = True
        q._closed = True
    # Nothing to flush at the child's exit: what is buffered is the parent's.
    _open_queues.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_open_queues() -> None:
    for q in list(_open_queues):
        try:
            q.close()
        except Exception:  # exiting anyway; say what was lost
            log.exception("closing queue %r at exit failed", getattr(q, "name", q))
