"""How the worker calls its handler and hears signals, in an async and a sync flavour with
the same names less ``Async`` (as in ``bucketq.bucket.concurrency``), so
``scripts/unasync.py`` turns the async worker into the sync one by renaming alone.

- :class:`AsyncCaller` (``AsyncQueue.consume``): an async handler is awaited in its
  slot's task, and a time limit cancels it there; a sync handler runs in a daemon thread
  of a pool of ``concurrency`` threads (a thread cannot be stopped: its result is
  ignored once its time limit passed).
- :class:`Caller` (``Queue.consume``): a sync handler runs in its slot's own thread; an
  async handler runs on one event loop in a thread of its own, and a time limit cancels it.

Each ``call`` returns ``(OK, result)``, ``(FAILED, exception)`` or ``(CANCELLED, None)``.
A caller is ``direct`` when its flavour calls the handler in the slot itself (an async
handler of an async worker, a sync one of a sync worker): the worker then calls it in
place, its cheapest path, and asks :meth:`AsyncCaller.cancelled` about a cancellation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

from .core import Slot
from .handlers import is_async

OK, FAILED, CANCELLED = 0, 1, 2
#: What the worker makes of an OK whose commit was refused.
COMMIT_REFUSED = 3

#: The signals that stop a worker (a second one stops it at once).
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class DaemonThreads:
    """A pool of ``size`` daemon threads, started as needed. Daemon threads, unlike
    ``ThreadPoolExecutor``'s, do not hold up the interpreter's exit: a sync handler stuck
    past its time limit cannot keep a stopped worker's process alive."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._idle == 0 and len(self._threads) < self._size:
                t = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()
            else:
                self._idle -= 1
        self._jobs.put((fut, fn, arg))
        return fut

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, arg = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(arg))
                except BaseException as exc:  # noqa: BLE001 - the handler's, handed to its slot
                    fut.set_exception(exc)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Idle threads end; busy ones end after their call (they are not waited for)."""
        for _ in self._threads:
            self._jobs.put(None)


# -- async flavour -------------------------------------------------------------------


class AsyncCaller:
    def __init__(self, handler: Callable[..., Any], concurrency: int) -> None:
        self.handler = handler
        self.is_async = is_async(handler)
        self._threads = None if self.is_async else DaemonThreads(concurrency, "bucketq-handler")

    @property
    def direct(self) -> bool:
        return self._threads is None

    def bind(self, slot: Slot) -> None:
        """Called in the slot's own task, once: its handler is cancelled through it."""
        slot.task = asyncio.current_task()

    def cancelled(self, slot: Slot, gen: int, exc: BaseException) -> tuple[int, Any]:
        """A ``CancelledError`` left an async handler: the handler's own (FAILED), ours
        at its time limit (CANCELLED), or the slot's task is being cancelled (raised)."""
        task = slot.task
        if task is None or task.cancelling() == 0:
            return FAILED, exc
        if slot.expired == gen and task.uncancel() == 0:
            return CANCELLED, None
        raise exc

    def forgive(self, slot: Slot) -> None:
        """A handler past its time limit returned after all: if it swallowed our
        cancellation, its task's count of cancellations goes back."""
        if slot.task is not None and slot.task.cancelling():
            slot.task.uncancel()

    async def call(self, slot: Slot, gen: int, arg: Any) -> tuple[int, Any]:
        try:
            if self._threads is None:
                return OK, await self.handler(arg)
            return OK, await asyncio.wrap_future(self._threads.submit(self.handler, arg))
        except asyncio.CancelledError as exc:
            if self._threads is not None:  # a thread's future: the slot is being cancelled
                raise
            return self.cancelled(slot, gen, exc)
        except Exception as exc:  # noqa: BLE001 - the handler's failure: the worker settles it
            return FAILED, exc

    def cancel(self, slot: Slot, gen: int) -> None:
        """Stop delivery ``gen``'s handler where that can be done: an async one is
        cancelled (it sees ``CancelledError`` where it awaits); a thread runs on."""
        d = slot.current
        if self._threads is None and slot.task is not None and d is not None and d[3] == gen:
            slot.task.cancel()

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()


class AsyncSignals:
    """While installed (from the main thread, where signals arrive), SIGTERM and SIGINT
    call ``on_signal(name)`` on the running event loop."""

    def __init__(self) -> None:
        self._saved: dict[signal.Signals, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, on_signal: Callable[[str], None]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        self._loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            self._saved[sig] = signal.getsignal(sig)
            self._loop.add_signal_handler(sig, on_signal, sig.name)
        return True

    def restore(self) -> None:
        for sig, old in self._saved.items():
            if self._loop is not None:
                self._loop.remove_signal_handler(sig)
            if old is not None:
                signal.signal(sig, old)
        self._saved.clear()


# -- sync flavour --------------------------------------------------------------------


class _LoopThread:
    """An event loop running in a daemon thread of its own, for async handlers of a sync
    worker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="bucketq-handler-loop", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class Caller:
    def __init__(self, handler: Callable[..., Any], concurrency: int) -> None:
        self.handler = handler
        self.is_async = is_async(handler)
        self._loop = _LoopThread() if self.is_async else None

    @property
    def direct(self) -> bool:
        return self._loop is None

    def bind(self, slot: Slot) -> None:
        """Nothing to remember: an async handler is cancelled through its future."""

    def cancelled(self, slot: Slot, gen: int, exc: BaseException) -> tuple[int, Any]:
        """A sync handler raised ``asyncio.CancelledError`` itself: a failure."""
        return FAILED, exc

    def forgive(self, slot: Slot) -> None:
        """Nothing to undo: a thread was never cancelled."""

    def call(self, slot: Slot, gen: int, arg: Any) -> tuple[int, Any]:
        try:
            if self._loop is None:
                return OK, self.handler(arg)
            fut = asyncio.run_coroutine_threadsafe(self.handler(arg), self._loop.loop)
            slot.future = (gen, fut)
            return OK, fut.result()
        except concurrent.futures.CancelledError as exc:
            return (CANCELLED, None) if slot.expired == gen else (FAILED, exc)
        except Exception as exc:  # noqa: BLE001 - the handler's failure: the worker settles it
            return FAILED, exc

    def cancel(self, slot: Slot, gen: int) -> None:
        f = slot.future
        if f is not None and f[0] == gen:
            f[1].cancel()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


class Signals:
    """While installed (from the main thread), SIGTERM and SIGINT call ``on_signal(name)``
    in the main thread; it must only set state (the thread may hold any lock then)."""

    def __init__(self) -> None:
        self._saved: dict[signal.Signals, Any] = {}

    def install(self, on_signal: Callable[[str], None]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            self._saved[sig] = signal.signal(sig, lambda s, _f: on_signal(signal.Signals(s).name))
        return True

    def restore(self) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._saved.clear()
