"""The buffer's circuit breaker, with no I/O and an injectable clock.

::

    CLOSED ──pending > threshold, or flush failures (rule below) reach the threshold──▶ OPEN
    OPEN ──cooldown passed──▶ HALF_OPEN
    HALF_OPEN ──a flush succeeds──▶ CLOSED
    HALF_OPEN ──a flush fails, or pending > threshold──▶ OPEN

While it is OPEN, ingests bypass the buffer and go straight to storage.

What counts as a failure is one flush (one batch of a shard, all its kinds together)
in which any record's storage write failed, or which raised; one flush counts once,
however many kinds or records failed. Enqueue refusals and dequeue errors are transport
trouble, not flush failures (a refused enqueue already goes straight to storage).
Two rules (``BREAKER_RULE``):

- ``consecutive`` (the seed's, the default): it opens when ``failure_threshold``
  flushes in a row failed; a flush in which every record was stored resets the count.
- ``window``: it opens when more than ``failure_threshold`` flushes failed within the
  last ``window`` seconds; successes do not reset the count.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _validate as v

log = logging.getLogger("bucketq.reservoir")

CLOSED = 0
OPEN = 1
HALF_OPEN = 2
STATE_NAMES = {CLOSED: "closed", OPEN: "open", HALF_OPEN: "half-open"}
RULES = ("consecutive", "window")

Listener = Callable[[int, int, str], None]


@dataclass(kw_only=True, eq=False)
class CircuitBreaker:
    """Opens on ``pending > pending_threshold`` or on flush failures by ``rule``
    (``"consecutive"``: ``failure_threshold`` failed flushes in a row; ``"window"``: more
    than ``failure_threshold`` within the last ``window`` seconds); half-opens
    ``cooldown`` seconds later.

    ``clock`` returns seconds (monotonic by default). Listeners get ``(old, new, reason)``
    on every change; one that raises is logged and the others still run.
    """

    pending_threshold: int = v.option(check=v.count, lo=1)
    failure_threshold: int = v.option(check=v.count, lo=1)
    cooldown: float = v.option(check=v.number, lo=0.0, hi=None)
    window: float = v.option(check=v.number, lo=0.0, hi=None, open_lo=True)
    clock: Callable[[], float] = time.monotonic
    rule: str = v.option("consecutive", v.choice, options=RULES)
    consecutive_failures: int = field(default=0, init=False)
    reason: str = field(default="", init=False)
    listeners: list[Listener] = field(default_factory=list, init=False)
    _state: int = field(default=CLOSED, init=False)
    _opened_at: float = field(default=0.0, init=False)
    _failures: deque[float] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        v.check_options(self)

    @property
    def state(self) -> int:
        """The state as of now, read without changing anything (an open breaker whose
        cooldown passed reads as half-open; it moves there, telling the listeners, on
        the next ``allow()`` or ``record_*()``)."""
        if self._state == OPEN and self.clock() >= self._opened_at + self.cooldown:
            return HALF_OPEN
        return self._state

    def _advance(self) -> int:
        """Move an open breaker whose cooldown passed to half-open; the state after."""
        if self._state == OPEN and self.clock() >= self._opened_at + self.cooldown:
            self._set(HALF_OPEN, "cooldown passed")
        return self._state

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    def allow(self) -> bool:
        """True when ingests may use the buffer (closed or half-open)."""
        return self._advance() != OPEN

    def retry_after(self) -> float:
        """Seconds until an open breaker half-opens (0 when it is not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.cooldown - self.clock())

    def failures_in_window(self) -> int:
        self._prune()
        return len(self._failures)

    def record_pending(self, pending: int) -> None:
        if pending > self.pending_threshold and self._advance() != OPEN:
            self._open(f"{pending} records pending (threshold {self.pending_threshold})")

    def record_failure(self, count: int = 1) -> None:
        """``count`` failed flushes."""
        now = self.clock()
        self._failures.extend([now] * count)
        self._prune()
        self.consecutive_failures += count
        state = self._advance()
        if state == HALF_OPEN:
            self._open("a flush failed while half-open")
        elif state != CLOSED:
            return
        elif self.rule == "consecutive":
            if self.consecutive_failures >= self.failure_threshold:
                self._open(f"{self.consecutive_failures} flushes failed in a row "
                           f"(threshold {self.failure_threshold})")  # fmt: skip
        elif len(self._failures) > self.failure_threshold:
            self._open(
                f"{len(self._failures)} flush failures in {self.window:g} s (threshold {self.failure_threshold})"
            )

    def record_success(self) -> None:
        """A flush in which every record was stored."""
        self.consecutive_failures = 0
        if self._advance() == HALF_OPEN:
            self._failures.clear()
            self._set(CLOSED, "a flush succeeded while half-open")

    def _prune(self) -> None:
        edge = self.clock() - self.window
        while self._failures and self._failures[0] <= edge:
            self._failures.popleft()

    def _open(self, reason: str) -> None:
        self._opened_at = self.clock()
        self._set(OPEN, reason)

    def _set(self, new: int, reason: str) -> None:
        old, self._state = self._state, new
        self.reason = reason
        if old != new:
            for fn in self.listeners:
                try:
                    fn(old, new, reason)
                except Exception:  # an observer never changes the breaker's course
                    log.exception("breaker listener %r failed", fn)
