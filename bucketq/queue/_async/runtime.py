"""How one queue object runs its I/O (pymongo ``AsyncMongoClient``): its driver calls
bounded, with what they met recorded in its health, and its background loops guarded.

The bucket queue and the stream queue each own one and hand its ``bounded`` and
``worker`` to their components (the producer, the consumer).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..._guard import LoopGuard
from .. import _deadline as deadlines
from .._concurrency import AsyncWorker

_now = time.time


class AsyncRuntime:
    """``kind`` ("queue" or "stream") and ``name`` say whose calls and loops these are in
    messages; ``stats`` counts the loops' failures; a loop ends once ``is_closed()``."""

    def __init__(
        self,
        kind: str,
        name: str,
        stats: dict[str, int],
        is_closed: Callable[[], bool],
        log: logging.Logger,
    ) -> None:
        self.kind = kind
        self.name = name
        self.stats = stats
        self.is_closed = is_closed
        self._log = log
        self._health = deadlines.Health(f"{kind} {name}")

    def health(self) -> dict[str, Any]:
        """Whether MongoDB answers this object's operations, from what they met (no
        query): ``ok``, ``unreachable_since`` (epoch seconds; None while it answers),
        ``unreachable_for``, ``last_error`` and ``last_error_at`` (kept after recovery),
        ``last_answer_at``."""
        return self._health.report(_now())

    def bounded(self, seconds: float | None, what: str | None = None) -> Any:
        """The driver calls in the block get ``seconds`` to be answered; see
        ``_deadline.bounded`` (``what``: a public call, whose timeout is raised as
        OperationTimeout)."""
        return deadlines.bounded(seconds, self._health, what)

    def worker(self, role: str, fn: Any, stopped: Callable[[], bool] | None = None) -> AsyncWorker:
        """A background loop that survives what it does not handle (see
        ``bucketq._guard``); it ends once ``stopped()`` (by default: once closed)."""
        guard = LoopGuard(f"{self.kind} {self.name}: the {role}", self.stats, self._log)
        name = f"bucketq-{self.kind}-{role}-{self.name}"
        return AsyncWorker(name, fn, guard, stopped or self.is_closed)
