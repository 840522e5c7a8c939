"""Deadlines for every MongoDB operation bucketq issues, and what a shell learns from them.

pymongo waits forever for an answer by default (no socket timeout), so a server that
keeps the connection open and stops answering (frozen, partitioned, stuck) would hang
a push, a flush or a background loop. Every driver call of the shells runs inside
:func:`bounded`, pymongo's client-side operation timeout (``pymongo.timeout``) with a
budget worked out here from the caller's options; it applies per call, on the caller's
own client, without touching the client's settings.

The arithmetic and :class:`Health` are pure; :func:`bounded` only enters
``pymongo.timeout`` (a context variable, no I/O) and records what happened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .._validate import one_line
from ..errors import OperationTimeout

log = logging.getLogger("bucketq.queue")


class StartupBusy(TimeoutError):
    """Other start-up work held the start-up lock for longer than the caller's budget."""

    timeout = True  # as pymongo's timeout errors: worth another try within the budget


#: The least time one attempt of a write is given, even when its budget is spent (a
#: ``retry_budget`` of 0 means "one attempt, no retries", not "no attempt").
MIN_ATTEMPT_TIMEOUT = 0.5


def write_deadline(opened: Iterable[float], max_wait: float, retry_budget: float) -> float:
    """When a write of buckets opened at ``opened`` (epoch seconds) gives up: the oldest
    bucket's age limit plus ``retry_budget``. Every receipt so gets at least its whole
    budget counted from its push, and at most ``max_wait`` more, however long the bucket
    waited behind an earlier write."""
    return min(opened) + max_wait + retry_budget


def attempt_timeout(deadline: float, now: float) -> float:
    """Seconds the next attempt may take: what is left of the budget, at least
    :data:`MIN_ATTEMPT_TIMEOUT`."""
    return max(deadline - now, MIN_ATTEMPT_TIMEOUT)


def may_retry(deadline: float, now: float) -> bool:
    """Is there budget left for another attempt?"""
    return now < deadline


def backoff_within(delay: float, deadline: float, now: float) -> float:
    """A retry's backoff, never past the deadline."""
    return max(0.0, min(delay, deadline - now))


def call_timeout(op_timeout: float, deadline: float | None, now: float) -> float:
    """Seconds one driver call of a waiting read (``reserve``, ``next_batch``) may take:
    ``op_timeout``, and no longer than what is left until the caller's ``deadline``
    (None: no timeout), at least :data:`MIN_ATTEMPT_TIMEOUT`."""
    return op_timeout if deadline is None else min(op_timeout, attempt_timeout(deadline, now))


def wait_within(wait: float, deadline: float | None, now: float) -> float | None:
    """A waiting read's pause before it reads again, cut to what is left until the
    caller's ``deadline`` (None: no timeout); None once the deadline has passed."""
    if deadline is None:
        return wait
    left = deadline - now
    return None if left <= 0 else min(wait, left)


def state_flush_timeout(op_timeout: float, lease: float) -> float:
    """How long a state flush (which renews leases) may take: ``op_timeout``, and at most
    half a lease, so an unanswered renewal is given up while the lease still runs; the
    bucket's items are not handed out once a third of its lease is left (the renewal
    counts as failed), and the next flush tries again."""
    return min(op_timeout, lease / 2)


def is_unanswered(exc: BaseException) -> bool:
    """The server could not be reached, or did not answer in time (as opposed to an
    answer that reports an error)."""
    from pymongo.errors import ConnectionFailure, ExecutionTimeout, WTimeoutError

    if isinstance(exc, ConnectionFailure | ExecutionTimeout):
        return True
    if isinstance(exc, WTimeoutError):
        return False  # the server answered: the write concern was not confirmed in time
    return bool(getattr(exc, "timeout", False))


def failure_level(exc: BaseException) -> int:
    """The log level of one failed call retried by a background loop: debug when the
    server is unreachable or silent (its :class:`Health` says so once per outage, so an
    outage is not a line per try), warning for an answer that reports an error."""
    return logging.DEBUG if is_unanswered(exc) else logging.WARNING


#: Socket-level bounds of the clients bucketq builds itself (the CLI, the Spark source,
#: the reservoir's factory), in milliseconds: no single network read waits longer,
#: whatever the call (a cursor's whole lifetime is not bounded, only each round trip).
CLIENT_TIMEOUTS_MS = {
    "connectTimeoutMS": 10_000,
    "socketTimeoutMS": 60_000,
    "serverSelectionTimeoutMS": 30_000,
    "waitQueueTimeoutMS": 60_000,
}


def client_timeouts(uri: str | None) -> dict[str, Any]:
    """The :data:`CLIENT_TIMEOUTS_MS` that ``uri`` does not set itself (a URI's own
    options win)."""
    given = (uri or "").lower()
    return {k: v for k, v in CLIENT_TIMEOUTS_MS.items() if k.lower() + "=" not in given}


class Health:
    """Since when the server has not answered, and the last error. Cleared by the next
    answer (an error the server reports is an answer)."""

    __slots__ = ("unreachable_since", "last_error", "last_error_at", "last_answer_at", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self.unreachable_since: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_answer_at: float | None = None

    def answered(self, now: float) -> None:
        if self.unreachable_since is not None:
            log.info(
                "%s: MongoDB answers again after %.1f s", self._what, now - self.unreachable_since
            )
            self.unreachable_since = None
        self.last_answer_at = now

    def failed(self, exc: BaseException, now: float) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.last_error_at = now
        if self.unreachable_since is None:
            self.unreachable_since = now
            # One line per outage (the driver's topology dump cut off); the failures
            # during it are the callers' to log at debug level.
            log.warning("%s: MongoDB is unreachable or not answering: %s (one line when it "
                        "answers again)", self._what, one_line(exc))  # fmt: skip

    def report(self, now: float) -> dict[str, Any]:
        """``ok``; ``unreachable_since`` (epoch seconds, None while the server answers) and
        ``unreachable_for`` (seconds); ``last_error`` and ``last_error_at`` (kept after
        recovery); ``last_answer_at``."""
        since = self.unreachable_since
        return {
            "ok": since is None,
            "unreachable_since": since,
            "unreachable_for": None if since is None else max(0.0, now - since),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_answer_at": self.last_answer_at,
        }


@contextmanager
def bounded(
    seconds: float | None, health: Health | None = None, what: str | None = None
) -> Iterator[None]:
    """Run the driver calls of the block under a ``seconds`` deadline (nested deadlines
    keep the earlier one; None: only the deadlines inside the block). Records in
    ``health`` whether the server answered. With ``what`` (a public call), a driver
    error leaves translated by ``bucketq._driver.translate`` (a deadline that passed:
    :class:`~bucketq.errors.OperationTimeout`), ``from`` the driver's error; without it
    the driver's error goes up unchanged, for the caller's retry logic. Only a block
    with a deadline of its own counts as an answer when it ends well (a block without
    one may have made no call at all)."""
    import pymongo
    from pymongo.errors import PyMongoError

    try:
        if seconds is None:
            yield
        else:
            with pymongo.timeout(seconds):
                yield
    except PyMongoError as exc:
        unanswered = is_unanswered(exc)
        if health is not None:
            if unanswered:
                health.failed(exc, time.time())
            else:
                health.answered(time.time())
        if what is not None:
            from .._driver import translate

            raise translate(exc, what) from exc
        raise
    except StartupBusy as exc:
        if what is not None:
            raise OperationTimeout(f"{what}: {exc}; retry later.") from exc
        raise
    else:
        if health is not None and seconds is not None:
            health.answered(time.time())
