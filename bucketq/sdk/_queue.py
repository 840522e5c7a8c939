"""SafeQueue: the bounded in-memory queue between the caller's thread and the senders.

``add`` never waits for room: it returns False when the queue is full, and the caller
spills the record instead. Senders take batches; a batch that could not be sent goes
back through :meth:`SafeQueue.writeback_batch` into a separate writeback buffer that is
served first, so fill can exceed 100% while room is being made. A written-back batch
stays one unit: ``get_batch`` hands it out whole and alone, so it is sent again with the
same body (hence the same ``Idempotency-Key``). Only ``threading``.

``add`` runs in the application's thread on every log call, so it takes no lock: a
``collections.deque`` append is atomic under the interpreter lock, and only the
consumers (which pop under the lock) need one. The bound is checked before the append,
so producers racing in the same instant can pass it by one item each; the consumers are
woken only when the first item and a full batch arrive.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ._options import DEFAULT_BATCH_SIZE, DEFAULT_QUEUE_SIZE, DRAIN_START_PERCENT


class SafeQueue:
    """A bounded, thread-safe queue whose ``add`` never blocks.

    - ``add(item)`` -> True when queued, False when the queue holds ``maxsize`` items.
    - ``get(timeout)`` -> one item (writeback first), or None after ``timeout`` seconds
      (None: wait for ever; 0: do not wait).
    - ``get_batch(n, timeout=0, fill_wait=0)`` -> the oldest written-back batch (its first
      ``n`` items), else up to ``n`` queued items; waits up to ``timeout`` for the first
      one, then up to ``fill_wait`` for ``n``.
    - ``writeback_batch(items)`` -> the items that did not fit in the writeback buffer
      (``writeback_size`` items, default ``maxsize``); the rest are kept as one batch,
      served before anything else.
    - ``fill_percentage()`` -> (queued + writeback) / maxsize * 100; may exceed 100.
    - ``high`` is an Event (``high=``, else a new one) set once fill reaches
      ``high_water`` percent (the drain worker's signal); whoever handles it clears it.
    - ``added`` / ``refused``: how many ``add`` calls were accepted / refused.
    """

    def __init__(
        self,
        maxsize: int = DEFAULT_QUEUE_SIZE,
        *,
        writeback_size: int | None = None,
        high_water: float = DRAIN_START_PERCENT,
        notify_every: int = DEFAULT_BATCH_SIZE,
        high: threading.Event | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self._maxsize = maxsize
        self._wb_size = maxsize if writeback_size is None else writeback_size
        self._items: deque[Any] = deque()
        self._wb: deque[list[Any]] = deque()  # written-back batches, each kept whole
        self._wb_n = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._high_mark = max(1, int(maxsize * high_water / 100.0 + 0.999999))
        self._notify_every = max(1, notify_every)
        self.high = threading.Event() if high is None else high
        self._taken = 0  # items popped from _items (under the lock); added = taken + len
        self._refused_lock = threading.Lock()
        self.refused = 0
        #: set while someone flushes: batches are taken without waiting for them to fill
        self.urgent = False

    @property
    def maxsize(self) -> int:
        return self._maxsize

    def __len__(self) -> int:
        return len(self._items) + self._wb_n

    def fill_percentage(self) -> float:
        return (len(self._items) + self._wb_n) * 100.0 / self._maxsize

    @property
    def added(self) -> int:
        with self._lock:
            return self._taken + len(self._items)

    def add(self, item: Any) -> bool:
        items = self._items
        if len(items) >= self._maxsize:
            with self._refused_lock:
                self.refused += 1
            return False
        items.append(item)  # atomic; no lock shared with the consumers
        n = len(items)
        if n == 1 or n == self._notify_every:
            with self._cond:
                self._cond.notify_all()
        if n + self._wb_n >= self._high_mark and not self.high.is_set():
            self.high.set()
        return True

    def _ready(self) -> bool:
        return bool(self._items or self._wb)

    def get(self, timeout: float | None = None) -> Any:
        with self._cond:
            if not self._wait(self._ready, timeout):
                return None
            if self._wb:
                group = self._wb[0]
                item = group.pop(0)
                if not group:
                    self._wb.popleft()
                self._wb_n -= 1
                return item
            self._taken += 1
            return self._items.popleft()

    def _wait(self, ready: Any, timeout: float | None) -> bool:
        if ready():
            return True
        if timeout is not None and timeout <= 0:
            return False
        return self._cond.wait_for(ready, timeout)

    def get_batch(self, n: int, *, timeout: float = 0.0, fill_wait: float = 0.0) -> list[Any]:
        with self._cond:
            if not self._wait(self._ready, timeout):
                return []
            if self._wb:  # a written-back batch comes first, whole and alone
                group = self._wb.popleft()
                if len(group) > n:
                    self._wb.appendleft(group[n:])
                    group = group[:n]
                self._wb_n -= len(group)
                return group
            items = self._items
            if fill_wait > 0 and len(items) < n:
                deadline = time.monotonic() + fill_wait
                while len(items) < n and not self.urgent and not self._wb:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        break
            out: list[Any] = []
            while len(out) < n and items:
                out.append(items.popleft())
            self._taken += len(out)
            return out

    def writeback_batch(self, items: Iterable[Any]) -> list[Any]:
        """Put a batch back, as one unit, to be served first; return what did not fit."""
        items = list(items)
        with self._cond:
            room = max(0, self._wb_size - self._wb_n)
            kept, rest = items[:room], items[room:]
            if kept:
                self._wb.append(kept)
                self._wb_n += len(kept)
                self._cond.notify_all()
                if len(self._items) + self._wb_n >= self._high_mark:
                    self.high.set()
        return rest

    def take_all(self) -> list[Any]:
        """Everything queued (writeback first), removed; for shutdown."""
        with self._cond:
            out = [i for group in self._wb for i in group]
            self._wb.clear()
            self._wb_n = 0
            items = self._items
            n = len(out)
            while items:  # popped one by one: an add racing this is taken, never cleared away
                out.append(items.popleft())
            self._taken += len(out) - n
            return out

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()
