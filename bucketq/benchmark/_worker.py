"""One benchmark worker process: a producer, then a consumer, of one contender.

The parent starts P of these (spawned: fresh interpreters, so the CPU each one measures
is its own). Each opens its queue and makes its payloads before any clock starts, then:

1. waits for all P at a barrier, pushes its share of N items and flushes until they are
   stored (push phase);
2. waits for all P again, reserves and commits until the workers' shared counter says N
   items are committed, and flushes its state (consume phase).

Per phase it measures wall time (system-wide monotonic clock), its process CPU time (all
threads) and the MongoDB commands it sent (pymongo command monitoring, registered
globally so the peers' own clients are counted too). Progress and the committed counts
live in shared memory, one slot per worker, so the harness costs a store per 1,024
pushes, a store per commit and a look at the sum now and then.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import traceback
from collections import Counter
from itertools import cycle, islice
from typing import Any

from pymongo import monitoring

from ._contenders import CONTENDERS
from ._stats import checksum, next_check, share
from ._workload import FLOOR_ITEMS, bson_floor_us, item_numbers, payload_pool

#: How long an idle consumer waits for an item before it looks at the shared counter.
POLL = 0.05
#: How long a worker waits at a barrier for the others (setup included).
BARRIER_TIMEOUT = 600.0
_STEP = 1024


class CommandCounter(monitoring.CommandListener):
    """Counts the commands this process sends, by name."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        with self._lock:
            self._counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            self._counts.clear()
        return out


def main(
    spec: dict[str, Any], idx: int, barrier: Any, pushed: Any, done: Any, results: Any
) -> None:
    """Entry point of a spawned worker; puts ("ok", idx, report) or ("error", idx, text)."""
    try:
        counter = CommandCounter()
        monitoring.register(counter)  # before any client exists
        contender = CONTENDERS[spec["contender"]]
        w = _Worker(spec, idx, barrier, pushed, done, counter)
        if contender.is_async:
            report = asyncio.run(w.run_async(contender))
        else:
            report = w.run_sync(contender)
        results.put(("ok", idx, report))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        tb = traceback.format_exc(limit=6)
        results.put(("error", idx, f"{type(exc).__name__}: {exc}\n{tb}"))


class _Worker:
    def __init__(
        self,
        spec: dict[str, Any],
        idx: int,
        barrier: Any,
        pushed: Any,
        done: Any,
        counter: CommandCounter,
    ):
        self.uri, self.db = spec["uri"], spec["db"]
        self.n, self.procs, self.idx = spec["n"], spec["procs"], idx
        self.barrier, self.pushed, self.done, self.counter = barrier, pushed, done, counter
        start, end = share(self.n, self.procs, idx)
        self.count = end - start
        self.pool = payload_pool(start, self.count)
        self.pushed_sum = checksum(item_numbers(self.pool, self.count))
        # The floor, in this process, now, on the same number of payloads in every worker
        # (a 500-item pool would sit in cache and look cheaper).
        self.floor_us = bson_floor_us(payload_pool(start, FLOOR_ITEMS))
        # The pool is the harness's memory, not the queue's: keep the cyclic garbage
        # collector from walking it during the measured phases.
        gc.collect()
        gc.freeze()
        self.r: dict[str, Any] = {}

    # -- the clock and the counter at phase boundaries
    def _begin(self, phase: str) -> None:
        self.barrier.wait(BARRIER_TIMEOUT)
        self.r[f"{phase}_start"] = time.monotonic()
        self._cpu = time.process_time()

    def _end(self, phase: str) -> None:
        self.r[f"{phase}_cpu_s"] = time.process_time() - self._cpu
        self.r[f"{phase}_end"] = time.monotonic()
        self.r[f"{phase}_commands"] = self.counter.take()

    def _report(self, consumed: tuple[int, int, int], close_s: float) -> dict[str, Any]:
        self.r.update(
            pushed=self.pushed_sum, consumed=consumed, close_s=close_s, floor_us=self.floor_us
        )
        return self.r

    def _committed(self, own: int) -> int:
        self.done[self.idx] = own
        return sum(self.done)

    # -- sync
    def run_sync(self, contender: Any) -> dict[str, Any]:
        h = contender.open(self.uri, self.db)
        self.r["setup_commands"] = self.counter.take()
        self._begin("push")
        push, items, slot = h.push, cycle(self.pool), self.pushed
        left = self.count
        while left:
            step = min(_STEP, left)
            for p in islice(items, step):
                push(p)
            left -= step
            slot[self.idx] = self.count - left
        h.flush()
        self._end("push")

        self._begin("consume")
        reserve, commit, done, idx = h.reserve, h.commit, self.done, self.idx
        n, procs = self.n, self.procs
        own = s1 = s2 = 0
        check_at = next_check(0, 0, n, procs)
        while True:
            m = reserve(POLL)
            if m is None:
                if self._committed(own) >= n:
                    break
                continue
            i = m.payload["i"]
            s1 += i
            s2 += i * i
            commit(m)
            own += 1
            done[idx] = own  # progress, seen by the parent (a store: the sum is read rarely)
            if own >= check_at:
                total = self._committed(own)
                if total >= n:
                    break
                check_at = next_check(own, total, n, procs)
        h.flush()
        self._committed(own)
        self._end("consume")
        t = time.monotonic()
        h.close()
        return self._report((own, s1, s2), time.monotonic() - t)

    # -- async: the same loop with awaits
    async def run_async(self, contender: Any) -> dict[str, Any]:
        h = await contender.open_async(self.uri, self.db)
        self.r["setup_commands"] = self.counter.take()
        self._begin("push")
        push, items, slot = h.push, cycle(self.pool), self.pushed
        left = self.count
        while left:
            step = min(_STEP, left)
            for p in islice(items, step):
                await push(p)
            left -= step
            slot[self.idx] = self.count - left
        await h.flush()
        self._end("push")

        self._begin("consume")
        reserve, commit, done, idx = h.reserve, h.commit, self.done, self.idx
        n, procs = self.n, self.procs
        own = s1 = s2 = 0
        check_at = next_check(0, 0, n, procs)
        while True:
            m = await reserve(POLL)
            if m is None:
                if self._committed(own) >= n:
                    break
                continue
            i = m.payload["i"]
            s1 += i
            s2 += i * i
            await commit(m)
            own += 1
            done[idx] = own  # progress, seen by the parent (a store: the sum is read rarely)
            if own >= check_at:
                total = self._committed(own)
                if total >= n:
                    break
                check_at = next_check(own, total, n, procs)
        await h.flush()
        self._committed(own)
        self._end("consume")
        t = time.monotonic()
        await h.close()
        return self._report((own, s1, s2), time.monotonic() - t)
