"""The entry point of one benchmark worker process (see ``_worker``): it counts
the process's MongoDB commands, builds its :class:`~bucketq.benchmark._worker.Worker`,
runs the contender's flavour of the loop (``_async/loop.py`` or its sync twin) and puts
the report, or the error, on the parent's queue."""

from __future__ import annotations

import asyncio
import traceback
from functools import partial
from typing import Any

from pymongo import monitoring

from ._async.loop import run as run_async
from ._contenders import CONTENDERS
from ._sync.loop import run as run_sync
from ._worker import CommandCounter, Worker


def main(
    spec: dict[str, Any], idx: int, barrier: Any, pushed: Any, done: Any, results: Any
) -> None:
    """Entry point of a worker; puts ("ok", idx, report) or ("error", idx, text)."""
    try:
        counter = CommandCounter()
        monitoring.register(counter)  # before any client exists
        contender = CONTENDERS[spec["contender"]]
        w = Worker(spec, idx, barrier, pushed, done, counter, contender.per_call)
        options = spec.get("queue_options") or {}
        if contender.is_async:
            report = asyncio.run(run_async(w, partial(contender.open_async, **options)))
        else:
            report = run_sync(w, partial(contender.open, **options))
        results.put(("ok", idx, report))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        tb = traceback.format_exc(limit=6)
        results.put(("error", idx, f"{type(exc).__name__}: {exc}\n{tb}"))
