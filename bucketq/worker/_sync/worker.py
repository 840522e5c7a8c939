# GENERATED from bucketq/worker/_async/worker.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The worker's I/O shell: ``concurrency`` slots, each a loop that reserves, calls the
handler and commits or rolls back, and the control loop around them (time limits,
touches, the stop). Decisions live in ``..core``; how the handler is called and signals
are heard, in ``..calls``.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from functools import partial
from typing import Any

from ... import _validate as v
from ..._guard import LoopGuard
from ...bucket.concurrency import Mutex, Notifier, sleep
from ...bucket.concurrency import Worker as Background
from ...errors import ConfigurationError, QueueClosed
from .. import core
from ..calls import CANCELLED, COMMIT_REFUSED, FAILED, OK, Caller, Signals

log = logging.getLogger("bucketq.worker")

_monotonic = time.monotonic

#: How long a stopped worker waits for its idle slots to end after the drain (seconds,
#: all together): they return from reserve() at once.
JOIN_WAIT = 1.0


class Worker:
    """Runs ``handler`` on the items of ``queue`` (an :class:`~bucketq.Queue`) in
    ``concurrency`` slots until it is stopped; ``Queue.consume(handler, **options)``
    is ``Worker(queue, handler, **options).run()``.

    The handler gets a :class:`~bucketq.Message` (with ``batch``, a list of up to that
    many). Its return commits; an exception rolls back, delivered again after the queue's
    back-off (``reject_delta_factor * tries + reject_delta_base``) or the delay
    ``retry_for`` gives its class or ``Retry(delay)`` asks for; past the queue's
    ``max_tries`` the queue moves the item to its dead-letter queue. An async handler runs
    in its slot's task; a sync one in a thread of a pool of ``concurrency`` threads.

    A delivery gets ``time_limit`` seconds: its items are touched meanwhile (the queue's
    stall rule never takes them back while the handler runs), and when the limit passes
    they are rolled back as failed (``TimeLimitExceeded``): an async handler is cancelled,
    a sync one cannot be stopped (it runs on in its thread, which its slot waits for, and
    its result is ignored).

    SIGTERM or SIGINT (in the main thread), :meth:`stop` or ``max_items`` stop it: no new
    items, and the buckets read ahead go back at once; the items in hand get
    ``drain_timeout`` seconds to finish; then ``drain()`` releases what is left at once
    (no try counted). A second signal (or ``stop(now=True)``) releases what is held
    without waiting. :meth:`run` returns what it did. Options and their defaults:
    :class:`bucketq.worker.WorkerOptions`.
    """

    def __init__(self, queue: Any, handler: Callable[..., Any], **options: Any) -> None:
        self.queue = queue
        self.handler = core.check_handler(handler)
        self.options = opts = core.WorkerOptions.build(**options)
        self._caller = Caller(handler, opts.concurrency)
        self._slots = [core.Slot(i) for i in range(opts.concurrency)]
        self._control = core.Tally()  # the control loop's counters (time limits)
        self._stop = core.StopState()
        self._wake = Notifier()
        self._mutex = Mutex()
        # max_items: items taken, tickets asked for and not yet answered, slots ended.
        self._taken = self._pending = self._ended = 0
        self._drawn = itertools.count()
        self._signals = Signals()
        self._touch_every = core.touch_period(
            queue.options.lease, queue.options.reject_timeout_grace
        )
        self._loop_stats = {"loop_errors": 0}
        self._last_look = _monotonic()
        self._ran = False
        self._done = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.queue.name} {core.LEVELS[self._stop.level]}>"

    @property
    def is_async(self) -> bool:
        """Whether the handler is awaited (an ``async def``), not run in a thread."""
        return self._caller.is_async

    def stop(self, now: bool = False, *, reason: str | None = None) -> None:
        """Stop as a signal does: the items in hand finish within ``drain_timeout`` (with
        ``now``: none), the rest is released. Safe from any thread and from a signal
        handler; ``run()`` returns once done. ``reason`` is logged and reported."""
        default = "stop(now=True)" if now else "stop()"
        self._stop.request(core.ABORTING if now else core.STOPPING, reason or default)

    def run(self) -> dict[str, Any]:
        """Run until stopped; returns the counts of what it did (``stats()``), why it
        stopped (``reason``) and the queue's drain report (``drain``)."""
        if self._ran:
            raise ConfigurationError("A worker runs once; make a new one to run again.")
        self._ran = True
        q = self.queue
        installed = self.options.signals and self._signals.install(self._stop.signal)
        # before the slots start: a handler's first line comes after it
        log.info(
            "queue %s: worker started on database %s: %s, %s", q.name, q.db.name,
            getattr(self.handler, "__qualname__", self.handler),
            v.counted(len(self._slots), "async handler" if self.is_async else "sync handler"),
        )  # fmt: skip
        slots = [
            Background(
                f"bucketq-worker-{q.name}-{s.index}",
                partial(self._serve, s),
                LoopGuard(
                    f"worker {q.name}: handler slot {s.index}",
                    self._loop_stats,
                    log,
                    lock=self._mutex,
                ),  # fmt: skip
                lambda: self._done,
            )
            for s in self._slots
        ]
        drained: dict[str, int] | None = None
        try:
            self._watch(lambda: self._stop.level >= core.STOPPING)
            # nothing more is handed out or claimed, and what was read ahead goes back at once
            q.pause(release=True)
            deadline = _monotonic() + self._drain_timeout()
            self._watch(
                lambda: self._stop.level >= core.ABORTING or not core.in_hand(self._slots),
                deadline,
            )
            left = core.in_hand(self._slots)
            if left:
                log.warning(
                    "queue %s: %s still in hand: released now, to be delivered again",
                    q.name, v.counted(left, "delivery", "deliveries"),
                )  # fmt: skip
            drained = q.drain(timeout=0)
        finally:
            self._stop.end("run() failed")  # the slots end (after a failure, too)
            self._done = True
            if installed:
                self._signals.restore()
            end = _monotonic() + JOIN_WAIT
            for slot, w in zip(self._slots, slots, strict=True):
                if slot.current is None:  # one still in a handler was released: not waited for
                    w.join(max(0.0, end - _monotonic()))
            self._caller.close()
        report = self.stats()
        report["reason"] = self._stop.reason
        report["drain"] = drained
        log.info("queue %s: worker stopped (%s): %s", q.name, self._stop.reason,
                 core.summary(report))  # fmt: skip
        return report

    def _drain_timeout(self) -> float:
        t = self.options.drain_timeout
        return self.queue.options.drain_timeout if t is None else t

    # -- the control loop ---------------------------------------------------------------

    def _watch(self, done: Callable[[], bool], deadline: float | None = None) -> None:
        """Look after the slots until ``done()`` or ``deadline``: roll back deliveries
        past their time limit, touch running ones, say when the stop level changes."""
        while True:
            gen = self._wake.gen
            now = self._last_look = _monotonic()
            for slot, d in list(core.overdue(self._slots, now)):
                self._expire(slot, d)
            for msgs in core.touch_due(self._slots, now, self._touch_every):
                for m in core.messages(msgs):
                    self.queue.touch(m)
            if self.options.stop_when_stuck and core.stuck(self._slots, now):
                self._stop.request(core.STOPPING, core.STUCK_REASON)
            self._announce()
            if done() or (deadline is not None and now >= deadline):
                return
            wait = core.next_look(self._slots, now)
            if deadline is not None:
                wait = min(wait, deadline - now)
            self._wake.wait(gen, wait)

    def _announce(self) -> None:
        level = self._stop.news()
        if level == core.STOPPING:
            log.info(
                "queue %s: stopping (%s): no new items; %s", self.queue.name, self._stop.reason,
                core.drain_plan(core.in_hand(self._slots), self._drain_timeout()),
            )  # fmt: skip
        elif level == core.ABORTING:
            log.warning(
                "queue %s: stopping at once (%s): what is held is released now",
                self.queue.name, self._stop.reason,
            )  # fmt: skip

    def _expire(self, slot: core.Slot, d: core.Delivery) -> None:
        """Delivery ``d`` ran past its time limit: roll its items back as failed, and stop
        its handler where that can be done."""
        gen = d[3]
        msgs = core.messages(d[0])
        slot.expired = gen
        exc = core.TimeLimitExceeded(
            f"the handler ran past its time limit of {self.options.time_limit:g} s"
        )
        if self._give_back(msgs, exc, self._control, "timed_out"):
            self._caller.cancel(slot, gen)

    # -- the slots -----------------------------------------------------------------------

    def _tickets(self, n: int) -> int:
        """How many of ``n`` items a batch may take now (``max_items``): taken from what
        is left, pending until :meth:`_took` says how many it got."""
        limit = self.options.max_items
        if limit is None:
            return n
        with self._mutex:
            granted = max(0, min(n, limit - self._taken - self._pending))
            self._pending += granted
        return granted

    def _took(self, asked: int, got: int) -> None:
        if self.options.max_items is not None:
            with self._mutex:
                self._pending -= asked
                self._taken += got

    def _spent(self) -> bool:
        """No ticket is left nor pending: this slot ends; the last one to end stops the
        worker (every item taken was handled by then)."""
        limit = self.options.max_items
        with self._mutex:
            if self.options.batch is not None and (self._pending or self._taken < (limit or 0)):
                return False
            self._ended += 1
            if self._ended == len(self._slots):
                self._stopping(f"max_items ({limit}) handled")
            return True

    def _stopping(self, reason: str) -> None:
        """A slot stops the worker: the control loop hears it at once (a signal or
        ``stop()`` is seen at its next look, within ``CONTROL_PERIOD``)."""
        self._stop.request(core.STOPPING, reason)
        self._wake.notify()

    def _serve(self, slot: core.Slot) -> None:
        """One slot: reserve an item, call the handler, commit, until the worker stops.
        This is the worker's cost per item, so it is kept short: a handler the caller
        runs directly (async here, sync in the twin) is called in place, and whatever is
        not a plain commit goes to :meth:`_settle`."""
        if self.options.batch is not None:
            return self._serve_batches(slot)
        q, stop, tally, hist = self.queue, self._stop, slot.tally, slot.tally.hist
        handler, caller = self.handler, self._caller
        direct, bounds = caller.direct, core.DURATION_BUCKETS
        fastest = bounds[0]  # most handlers of a busy worker land here: no bisect
        monotonic, drawn = _monotonic, self._drawn
        time_limit = math.inf if self.options.time_limit is None else self.options.time_limit
        limit = self.options.max_items
        caller.bind(slot)
        slot.current = None  # a slot started again after a failure holds nothing
        gen = slot.gen
        while not stop.level:  # RUNNING
            # max_items: a ticket is a number drawn (atomic); the slot past the last ends.
            if limit is not None and next(drawn) >= limit and self._spent():
                return
            try:
                m = q.reserve()
            except QueueClosed:
                return self._stopping("the queue was closed")
            if m is None:
                return self._stopping("the queue was drained")
            started = monotonic()
            gen = slot.gen = gen + 1
            slot.current = (m, started, started + time_limit, gen)
            if stop.level:
                # Taken as the stop began: left to drain(), which releases it, no try counted.
                slot.current = None
                return
            if direct:
                try:
                    value = handler(m)
                    kind = OK
                except asyncio.CancelledError as exc:
                    kind, value = caller.cancelled(slot, gen, exc)
                except Exception as exc:  # noqa: BLE001 - the handler's failure, settled below
                    kind, value = FAILED, exc
            else:
                kind, value = caller.call(slot, gen, m)
            slot.current = None
            took = monotonic() - started
            hist[0 if took < fastest else bisect_left(bounds, took)] += 1
            tally.seconds += took
            if stop.level:
                self._wake.notify()  # the control loop waits for the items in hand
            if kind == OK and slot.expired != gen:
                if q.commit(m):
                    tally.committed += 1
                    continue
                kind = COMMIT_REFUSED
            self._settle(slot, gen, kind, value, [m])

    def _serve_batches(self, slot: core.Slot) -> None:
        """A slot with ``batch``: the handler gets a list, committed together."""
        q, stop, tally, batch = self.queue, self._stop, slot.tally, self.options.batch
        assert batch is not None
        time_limit = math.inf if self.options.time_limit is None else self.options.time_limit
        self._caller.bind(slot)
        slot.current = None
        while not stop.level:
            n = self._tickets(batch)
            if n == 0:
                if self._spent():
                    return
                sleep(core.CONTROL_PERIOD)  # others hold the last tickets
                continue
            msgs: list[Any] = []
            try:
                msgs = q.reserve_many(n)
            except QueueClosed:
                return self._stopping("the queue was closed")
            finally:
                self._took(n, len(msgs))
            if not msgs:
                return self._stopping("the queue was drained")
            started = _monotonic()
            gen = slot.gen = slot.gen + 1
            slot.current = (msgs, started, started + time_limit, gen)
            if stop.level:
                slot.current = None
                return
            kind, value = self._caller.call(slot, gen, msgs)
            slot.current = None
            tally.observe(_monotonic() - started)
            if stop.level:
                self._wake.notify()
            self._settle(slot, gen, kind, value, msgs)

    def _settle(self, slot: core.Slot, gen: int, kind: int, value: Any, msgs: list[Any]) -> None:
        """Whatever a delivery's end is besides one item committed: a batch's commit, a
        failure, a result after the time limit, a commit refused."""
        tally = slot.tally
        if kind == CANCELLED:  # at its time limit (counted then)
            return
        if slot.expired == gen:
            self._caller.forgive(slot)
            self._late(msgs, tally)
            return
        q = self.queue
        if kind == OK or kind == COMMIT_REFUSED:
            done = q.commit_many(msgs) if kind == OK else 0
            tally.committed += done
            if done < len(msgs):
                if slot.expired == gen:  # rolled back at its time limit meanwhile
                    self._late(msgs, tally)
                else:
                    self._lost(msgs, len(msgs) - done, tally, "commit")
            return
        back = self._give_back(msgs, value, tally, core.outcome_of(value))
        if back < len(msgs) and slot.expired != gen:
            self._lost(msgs, len(msgs) - back, tally, "rollback")

    def _give_back(
        self, msgs: list[Any], exc: BaseException, tally: core.Tally, outcome: str
    ) -> int:
        """Roll ``msgs`` back after ``exc`` (each with its delay), count and log it; how
        many were rolled back (the others were settled already, or are no longer held)."""
        q = self.queue
        reason = core.failure_reason(exc)
        back = dead_letters = 0
        delay: float | None = None
        for m in msgs:
            try:
                delay = core.failure_delay(exc, m.tries + 1, self.options.retry_for)
            except Exception as bad:  # noqa: BLE001 - retry_for failed: the queue's back-off
                log.error("queue %s: retry_for failed for %s (%r); using the queue's back-off",
                          q.name, type(exc).__name__, bad)  # fmt: skip
                delay = None
            if q.rollback(m, delay, reason=reason):
                back += 1
                # the queue's own rule: this rollback moved it to the dead-letter queue
                dead_letters += core.dead_after(m.tries + 1, q.options.max_tries)
        if back:
            tally.add(outcome, back - dead_letters)
            tally.add("dead_letter", dead_letters)
            tries = max(m.tries for m in msgs) + 1
            dead = core.dead_after(tries, q.options.max_tries)
            fmt, args, extra = core.failure_record(
                q.name, [m.id for m in msgs], tries, core.exception_name(exc),
                "dead_letter" if dead else outcome,
                None if dead else (q.options.retry_delay(tries) if delay is None else delay),
            )  # fmt: skip
            log.log(
                logging.ERROR if dead else logging.WARNING, fmt, *args, extra=extra,
                exc_info=exc if self.options.log_details else None,
            )  # fmt: skip
        return back

    def _late(self, msgs: list[Any], tally: core.Tally) -> None:
        tally.add("late", len(msgs))
        log.warning(
            "queue %s: item %s finished after its time limit; its result is ignored (it was "
            "rolled back and is delivered again)", self.queue.name, msgs[0].id,
            extra={"queue": self.queue.name, "items": [m.id for m in msgs], "outcome": "late"},
        )  # fmt: skip

    def _lost(self, msgs: list[Any], n: int, tally: core.Tally, what: str) -> None:
        tally.add("lost", n)
        log.warning(
            "queue %s: the %s of %s (%s) was refused: their bucket is no longer held here "
            "(its lease ran out or it was released at a stop); delivered again",
            self.queue.name, what, v.counted(n, "item"), msgs[0].id,
            extra={"queue": self.queue.name, "items": [m.id for m in msgs], "outcome": "lost"},
        )  # fmt: skip

    # -- introspection ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters since the worker started (items by outcome, handler seconds as a
        histogram over ``core.DURATION_BUCKETS``) and what it holds now. Cheap: no query."""
        now = _monotonic()
        s = core.tally_stats([sl.tally for sl in self._slots] + [self._control])
        s.update(
            queue=self.queue.name,
            state=core.LEVELS[self._stop.level],
            concurrency=len(self._slots),
            in_hand=core.in_hand(self._slots),
            stuck=core.stuck(self._slots, now),
            loop_errors=self._loop_stats["loop_errors"],
        )
        return s

    def health(self) -> dict[str, Any]:
        """``ok`` and ``status`` (why not), the stop state, and the queue's ``health()``:
        not ok when the control loop stopped looking, MongoDB does not answer, or every
        handler is stuck past its time limit. No query."""
        now = _monotonic()
        queue = self.queue.health()
        stuck = core.stuck(self._slots, now)
        age = now - self._last_look if self._ran and not self._done else 0.0
        ok, status = core.health(self._stop.level, len(self._slots), stuck, age, queue["ok"])
        return {"ok": ok, "status": status, "state": core.LEVELS[self._stop.level],
                "in_hand": core.in_hand(self._slots), "stuck": stuck, "queue": queue}  # fmt: skip
