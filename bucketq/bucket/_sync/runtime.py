# GENERATED from bucketq/bucket/_async/runtime.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""How one queue object runs its I/O (pymongo ``MongoClient``): its driver calls
bounded, with what they met recorded in its health, and its background loops guarded.

The bucket queue and the stream queue each own one and hand it to their components
(the producer, the consumer), which call through it and start their loops and their
change-stream watchers from it.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..._guard import LoopGuard
from ..._validate import printable
from .. import deadline as deadlines
from ..concurrency import Notifier, Worker
from .wake import WakeWatcher

_now = time.time


@dataclass(eq=False)
class Runtime:
    """``kind`` ("queue" or "stream") and ``name`` say whose calls and loops these are in
    messages (``log`` gets the loops' failures); ``stats`` counts them; a loop ends once
    ``is_closed()``."""

    kind: str
    name: str
    stats: dict[str, int]
    is_closed: Callable[[], bool]
    log: logging.Logger
    _health: deadlines.Health = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._health = deadlines.Health(f"{self.kind} {printable(self.name)}")

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

    def worker(self, role: str, fn: Any, stopped: Callable[[], bool] | None = None) -> Worker:
        """A background loop that survives what it does not handle (see
        ``bucketq._guard``); it ends once ``stopped()`` (by default: once closed)."""
        guard = LoopGuard(f"{self.kind} {printable(self.name)}: the {role}", self.stats, self.log)
        name = f"bucketq-{self.kind}-{role}-{self.name}"
        return Worker(name, fn, guard, stopped or self.is_closed)

    def wake_watcher(
        self,
        col: Any,
        pipeline: list[dict[str, Any]],
        wake: Notifier,
        op_timeout: float,
        *,
        expected: bool,
        what: str | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> WakeWatcher:
        """A change-stream watcher (``wake.py``) of this object: it counts in ``stats``,
        logs to ``log``, bounds its calls and runs in one of its guarded loops, which
        ends once ``stopped()`` (by default: once closed). ``what`` names it in
        messages (by default: this object)."""
        return WakeWatcher(
            col=col,
            pipeline=pipeline,
            wake=wake,
            what=what or f"{self.kind} {printable(self.name)}",
            stats=self.stats,
            logger=self.log,
            bounded=self.bounded,
            op_timeout=op_timeout,
            worker=self.worker,
            stopped=stopped or self.is_closed,
            expected=expected,
        )
