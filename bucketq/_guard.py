"""What a background loop does with a failure it did not expect, with no I/O.

Every background loop (a queue's fetcher, flusher, watcher and writer, the reservoir's
flush consumers) handles the failures it expects (the server away, a damaged bucket)
itself. Anything else is a bug or a surprise, and must not end the loop: a
:class:`LoopGuard` counts it (``stats["loop_errors"]``), logs it with its traceback
once per distinct failure (the same failure again is logged at debug level, so an
outage does not flood the log), and says how long to back off (bounded) before the
loop goes on. Only ``close()`` ends a loop.

:func:`backoff` is the one back-off every retry uses (inserts, claims, the change-stream
watcher, the reservoir's records, these loops).
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from contextlib import nullcontext
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

__all__ = ["DEFAULT_GUARD_BASE", "DEFAULT_GUARD_CAP", "LoopGuard", "backoff"]

#: The first back-off after an unexpected failure (seconds); it doubles on each one.
DEFAULT_GUARD_BASE = 0.1
#: The longest back-off (seconds).
DEFAULT_GUARD_CAP = 5.0
#: A loop that ran this long without failing starts its back-off from the base again.
RESET_AFTER = 60.0
#: Distinct failures remembered (to log each once).
_SEEN = 64


def backoff(
    attempt: int,
    base: float,
    cap: float,
    rng: Callable[[], float] = random.random,
    *,
    full_jitter: bool = False,
) -> float:
    """Seconds to wait after failed try ``attempt`` (1, 2, ...): ``base`` doubled per
    attempt, at most ``cap``, with jitter. Two rules, each for a reason: "equal" jitter
    (the default: half fixed, half random) never comes back sooner than half the delay, so
    a failed record or loop does not return at once; "full" jitter (``full_jitter``: uniform
    from 0) spreads many writers or consumers contending for one collection the most
    (bucket inserts, claims, change streams)."""
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 32))
    if full_jitter:
        return rng() * ceiling
    return ceiling / 2 + rng() * ceiling / 2


@dataclass(eq=False)
class LoopGuard:
    """One per loop. ``failed(exc)`` counts and logs ``exc`` and returns the back-off."""

    what: str
    stats: MutableMapping[str, int]
    log: logging.Logger
    _: KW_ONLY
    #: The key of ``stats`` that counts the failures.
    counter: str = "loop_errors"
    #: Held while counting, when ``stats`` is shared by threads.
    lock: Any = None
    base: float = DEFAULT_GUARD_BASE
    cap: float = DEFAULT_GUARD_CAP
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random
    attempt: int = field(default=0, init=False)
    _last: float = field(default=float("-inf"), init=False, repr=False)
    _seen: OrderedDict[tuple[str, str], None] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    def delay(self) -> float:
        """The back-off for the current attempt: half fixed, half jittered, at most ``cap``."""
        return backoff(self.attempt, self.base, self.cap, self.rng)

    def failed(self, exc: BaseException) -> float:
        now = self.clock()
        if now - self._last > RESET_AFTER:
            self.attempt = 0
        self._last = now
        self.attempt += 1
        with self.lock or nullcontext():
            self.stats[self.counter] = self.stats.get(self.counter, 0) + 1
        wait = self.delay()
        key = (type(exc).__qualname__, str(exc)[:200])
        if key in self._seen:
            self._seen.move_to_end(key)
            self.log.debug("%s failed again (%r); going on in %.2f s", self.what, exc, wait)
        else:
            self._seen[key] = None
            if len(self._seen) > _SEEN:
                self._seen.popitem(last=False)
            self.log.error(
                "%s failed unexpectedly; it goes on in %.2f s (counted in stats()[%r])",
                self.what,
                wait,
                self.counter,
                exc_info=exc,
            )
        return wait
