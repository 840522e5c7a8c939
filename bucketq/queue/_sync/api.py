# GENERATED from bucketq/queue/_async/api.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""What the bucket queue and the per-element queue share: opening, the push and
rollback arguments and their checks, creating indexes once per process, ``pop()`` and
``async with``, written once. A queue class says how it stores and takes back items
(``_push``, ``_push_many``, ``_rollback``) and which partition a ``key`` picks
(``_partition_for``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ... import _validate as v
from ... import bucket
from ...bucket import Closing
from ...bucket.codec import collection
from ...bucket.concurrency import (
    STARTUP_DONE,
    Receipt,
    Startup,
    startup_key,
    used_after_fork,
)
from ...bucket.db import check_database
from .. import _core as core
from .sizes import Sizes

_now = time.time


class QueueApi(Sizes, Closing):
    """Base of the two queue classes; see the module docstring."""

    #: Set in a child process forked after the queue opened: it may not be used there.
    _forked: bool = False

    def __init__(self, db: Any, name: str, options: dict[str, Any]) -> None:
        opts, name = bucket.open_options(name, options)
        self.options, self.name = opts, name
        self.db = check_database(db)
        self._col = collection(db, name, opts.write_concern_for(db))
        self._stats = core.new_stats()
        self._closed = False
        self._setup_done = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.db.name}.{self.name}>"

    # What each queue class defines (see the module docstring):
    #: () -> None: raise if pushes are no longer taken (closed, draining, or forked).
    _check_open: Callable[[], None]
    #: (key) -> the partition a push's ``key`` picks (checked).
    _partition_for: Callable[[Any], int]
    #: (payload, checked headers, at, now, part, durable) -> its receipt: store or
    #: buffer one item due at ``at``.
    _push: Callable[..., Any]
    #: (payloads, checked headers, at or None for now, durable, part) -> their receipts.
    _push_many: Callable[..., Any]
    #: (msg, delay, next_t, reason) -> whether it was given back.
    _rollback: Callable[..., Any]
    #: The public reserve() and commit(), which pop() calls.
    reserve: Callable[..., Any]
    commit: Callable[..., Any]

    def _once(self, what: str, timeout: float, create: Callable[[], Any]) -> None:
        """``create()`` (the indexes ``what``) once per collection and process,
        never alongside other start-up work (see ``Startup``)."""
        key = startup_key(self._col, what)
        with Startup(timeout):
            if key not in STARTUP_DONE:
                create()
                STARTUP_DONE.add(key)

    def _check_not_forked(self) -> None:
        """Raise in a child process forked after the queue opened (the parent owns it)."""
        if self._forked:
            raise used_after_fork(self)

    def push(
        self,
        payload: Any,
        *,
        delay: float | None = None,
        mature: Any = None,
        headers: dict[str, Any] | None = None,
        durable: bool = False,
        key: Any = None,
    ) -> Receipt:
        """Push one item and return its receipt, resolved once the item is stored (the
        bucket queue buffers it; ``durable=True`` returns once stored). ``key`` (str,
        bytes or int) picks its partition; by default the producer's own."""
        self._check_open()
        part = self._partition_for(key)
        # No headers, not durable (the common push) needs no check: skip two calls.
        if headers is not None or durable is not False:
            headers = bucket.check_push(headers, durable)
        now = _now()
        at = (
            bucket.mature_time(now, delay, mature)
            if delay is not None or mature is not None
            else now
        )
        return self._push(payload, headers, at, now, part, durable)

    def push_many(
        self,
        payloads: Iterable[Any],
        *,
        delay: float | None = None,
        mature: Any = None,
        headers: dict[str, Any] | None = None,
        durable: bool = False,
        key: Any = None,
    ) -> list[Receipt]:
        """Push several items (to one partition: ``key``'s, by default the producer's);
        all are encoded first, so one bad item stores none of them."""
        self._check_open()
        part = self._partition_for(key)
        payloads = v.payloads(payloads)
        headers = bucket.check_push(headers, durable)
        at = (
            bucket.mature_time(_now(), delay, mature)
            if delay is not None or mature is not None
            else None
        )
        return self._push_many(payloads, headers, at, durable, part)

    def rollback(
        self,
        msg: core.Message,
        delay: float | None = None,
        *,
        next_t: Any = None,
        reason: str | None = None,
    ) -> bool:
        """Give the item back: delivered again not before ``delay`` seconds (or ``next_t``),
        by default ``reject_delta_factor * tries + reject_delta_base``; past ``max_tries``
        it goes to the dead-letter queue instead. False if the item is no longer held
        here (its lease was lost or released) or ``msg`` was committed or rolled back
        already."""
        self._check_not_forked()
        return self._rollback(msg, delay, next_t, reason)

    def pop(self, timeout: float | None = None) -> core.Message | None:
        """Reserve and commit in one step (at-most-once for this consumer)."""
        msg = self.reserve(timeout)
        if msg is not None:
            self.commit(msg)
        return msg
