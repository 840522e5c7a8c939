"""What one consumer holds: its claimed buckets, their messages ready in memory, its
workers, and the bookkeeping of holding and forgetting a bucket.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from bson import ObjectId

from ... import _validate as v
from ... import bucket
from ...bucket import AsyncQuarantine, AsyncRuntime, AsyncWakeWatcher
from ...bucket.concurrency import AsyncLock, AsyncMutex, AsyncNotifier, AsyncWorker
from .. import _core as core

log = logging.getLogger("bucketq.queue")


class AsyncConsumerState:
    """What one queue object holds and hands out: claimed buckets (``held``), their
    messages ready in memory (``ready``), and the workers that keep them.

    It composes its queue object's ``runtime`` (the queue's name and counters, whether
    it is closed, bounded driver calls, guarded background loops that end once it is
    closed), as the producer does. ``origin`` is the queue object (messages remember
    who delivered them); with ``partitions`` > 1 its claims start at ``origin.partition``
    (so that consumers of other objects start elsewhere); ``setup()`` creates the claim
    index; ``open_dead_letter_queue()`` opens the queue over-tried items move to.
    """

    def __init__(
        self,
        runtime: AsyncRuntime,
        options: bucket.QueueOptions,
        *,
        origin: Any,
        col: Any,
        mutex: AsyncMutex,
        quarantine: AsyncQuarantine,
        setup: Callable[[], Any],
        open_dead_letter_queue: Callable[[], Any],
    ) -> None:
        self._runtime = runtime
        self.name = runtime.name
        self._stats = runtime.stats
        self.options = options
        self.origin = origin
        self._col = col
        self._mutex = mutex
        self._quarantine = quarantine
        self._setup = setup
        self._open_dead_letter_queue = open_dead_letter_queue
        self._flush_lock = AsyncLock()
        self.ready: deque[core.Message] = deque()
        self.held: dict[ObjectId, core.HeldBucket] = {}
        self._consumers = AsyncNotifier()
        self._fetch_wake = AsyncNotifier()
        self._flush_wake = AsyncNotifier()
        # Set while claims come back empty: the fetcher waits, and the watcher reads for
        # it. Not at first: a partitioned queue's first claim is in its own partition,
        # where its own pushes went (one read, not a probe and then a claim).
        self._starved = False
        self._first_claim = True
        self._waiters = 0
        self._turn_in = 0  # items served before a reserve() lets other tasks run (SERVE_TURN)
        self._fetch_full = False  # the fetcher waits for room under prefetch
        self._last_reserve = 0.0
        self._next_local_mature: float | None = None
        # Buckets being inserted leased to this queue (see ``hold_pushed``).
        self._held_pushed: dict[ObjectId, tuple[dict[str, Any], ObjectId, float]] = {}
        self.paused = False
        # Paused with release=True: each held bucket goes back once nothing of it is
        # handed out (``core.plan_flush``).
        self.releasing = False
        self.draining = False
        self.fetcher: AsyncWorker | None = None
        self.flusher: AsyncWorker | None = None
        #: Wakes the fetcher on inserted or released buckets by change stream while its
        #: claims find nothing (None: change_streams=False).
        self.watcher: AsyncWakeWatcher | None = None
        if options.change_streams is not False:
            self.watcher = runtime.wake_watcher(
                col,
                core.WAKEUP_PIPELINE,
                self._fetch_wake,
                options.op_timeout,
                expected=options.change_streams is True,
            )
        self._dlq: Any = None
        # Partitioned: each claim searches one partition, in this consumer's rotation,
        # which starts at its queue object's own.
        self._rotation = (
            core.Rotation(origin.partition, options.partitions) if options.partitions > 1 else None
        )
        # The claim form (``core.claim_form``), known at the first claim; with
        # find_then_update, the candidates read and not yet tried, of one partition.
        self._claim_form: str | None = None
        self._candidates = core.Candidates()

    def _buffered_buckets(self) -> int:
        # Under the mutex: the flusher drops buckets from ``held`` meanwhile (in the sync
        # twin, a thread: iterating unguarded raised "dictionary changed size").
        with self._mutex:
            return sum(1 for b in self.held.values() if b.queued > 0)

    def _hold(self, b: core.HeldBucket, now: float) -> list[core.Message]:
        """Hold ``b`` here (claimed, or held pushed) and serve its ready items."""
        with self._mutex:
            msgs = b.ready_messages(now, self.options.max_tries)
            b.queued = len(msgs)
            self.held[b.id] = b
            self.ready.extend(msgs)
        if msgs:
            self._consumers.notify()
        return msgs

    def _lose(self, b: core.HeldBucket) -> None:
        """Another consumer holds ``b`` now: count the loss once and forget it (call with
        the mutex held)."""
        if not b.lost:
            b.lost = True
            self._stats["lease_losses"] += 1
            log.warning(
                "queue %s: lost the lease of bucket %s; dropping it", v.printable(self.name), b.id
            )
        self._drop(b)

    def _drop(self, b: core.HeldBucket) -> None:
        """Forget a bucket this process no longer holds (call with the mutex held)."""
        if self.held.get(b.id) is b:
            del self.held[b.id]
        b.held = False
