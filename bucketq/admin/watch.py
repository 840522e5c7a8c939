"""A background sampler of queue rows (``bucketq serve``: its metrics and the console's
charts): every ``interval`` seconds it reads the watched queues with
:class:`AsyncInspector` and keeps the last ``history`` samples of each.

What it samples: the names given (``"*"``: every queue and stream), and every queue and
stream while the console was viewed within :data:`VIEWED_FOR` seconds, so an idle
service reads nothing it was not told to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from pymongo import timeout as mongo_timeout
from pymongo.errors import PyMongoError

from .._guard import LoopGuard
from ..errors import BucketQError
from ._async.inspect import AsyncInspector
from ._core import QueueRow, Rates

log = logging.getLogger("bucketq.admin")

#: Seconds between two samples.
DEFAULT_INTERVAL = 2.0
#: Samples kept per queue (two minutes at the default interval).
DEFAULT_HISTORY = 60
#: Longest one sample may take (a server that does not answer is "down", not waited on).
READ_TIMEOUT = 10.0
#: Seconds after the console's last page during which every queue is sampled.
VIEWED_FOR = 60.0


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    total: int
    ready: int
    dead: int


def parse_watch(text: str) -> list[str] | None:
    """``BUCKETQ_WATCH_QUEUES``: ``""`` none, ``"*"`` every one (None), else a comma list."""
    text = text.strip()
    if text == "*":
        return None
    return [n.strip() for n in text.split(",") if n.strip()]


class QueueWatch:
    def __init__(
        self,
        db: Any,
        watched: list[str] | None,
        *,
        interval: float = DEFAULT_INTERVAL,
        history: int = DEFAULT_HISTORY,
    ) -> None:
        self.inspector = AsyncInspector(db)
        self.watched = watched
        self.interval = interval
        self.history: dict[str, deque[Sample]] = {}
        self.maxlen = history
        self.rows: dict[str, QueueRow] = {}
        self.ok: bool | None = None  # None until the first read
        self.viewed_at = float("-inf")
        self.stats: dict[str, int] = {"loop_errors": 0}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def viewed(self) -> None:
        """The console was shown: sample every queue for a while, starting now."""
        first = time.monotonic() - self.viewed_at > VIEWED_FOR
        self.viewed_at = time.monotonic()
        if first:
            self._wake.set()

    def _names(self) -> list[str] | None | bool:
        if self.watched is None or time.monotonic() - self.viewed_at < VIEWED_FOR:
            return None  # every queue
        return self.watched or False

    async def sample(self) -> None:
        names = self._names()
        if names is False:
            return
        try:
            with mongo_timeout(max(READ_TIMEOUT, self.interval)):
                rows = await self.inspector.queues(names if isinstance(names, list) else None)
        except (PyMongoError, BucketQError) as exc:
            if self.ok is not False:
                log.warning("reading queue sizes failed: %s", exc)
            self.ok = False
            return
        self.ok = True
        now = time.time()
        for r in rows:
            h = self.history.setdefault(r.name, deque(maxlen=self.maxlen))
            h.append(Sample(now, r.total, r.ready, r.dead))
        self.rows = {r.name: r for r in rows}

    def metric_rows(self) -> list[QueueRow] | None:
        """The rows ``bucketq.metrics`` exports: the watched queues (None: not read yet,
        or the last read failed)."""
        if self.watched == []:
            return []
        if self.ok is not True:
            return None
        if self.watched is None:
            return list(self.rows.values())
        return [self.rows[n] for n in self.watched if n in self.rows]

    def rates(self, name: str) -> Rates:
        h = self.history.get(name)
        if not h or len(h) < 2:
            return Rates()
        a, b = h[-2], h[-1]
        old = QueueRow(name, "", ready=a.ready, dead=a.dead, scheduled=a.total - a.ready)
        new = QueueRow(name, "", ready=b.ready, dead=b.dead, scheduled=b.total - b.ready)
        return Rates.between(old, new, b.t - a.t)

    def start(self) -> QueueWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        guard = LoopGuard("the queue watch", self.stats, log)
        while True:
            try:
                await self.sample()
            except Exception as exc:  # noqa: BLE001 - the guard logs and counts it
                self.ok = False
                await asyncio.sleep(guard.failed(exc))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
