"""What a background loop does with a failure it did not expect, with no I/O.

Every background loop (a queue's fetcher, flusher, watcher and writer, the reservoir's
flush consumers) handles the failures it expects (the server away, a damaged bucket)
itself. Anything else is a bug or a surprise, and must not end the loop: a
:class:`LoopGuard` counts it (``stats["loop_errors"]``), logs it with its traceback
once per distinct failure (the same failure again is logged at debug level, so an
outage does not flood the log), and says how long to back off (bounded) before the
loop goes on. Only ``close()`` ends a loop.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from dataclasses import KW_ONLY, dataclass, field

__all__ = ["DEFAULT_GUARD_BASE", "DEFAULT_GUARD_CAP", "LoopGuard"]

#: The first back-off after an unexpected failure (seconds); it doubles on each one.
DEFAULT_GUARD_BASE = 0.1
#: The longest back-off (seconds).
DEFAULT_GUARD_CAP = 5.0
#: A loop that ran this long without failing starts its back-off from the base again.
RESET_AFTER = 60.0
#: Distinct failures remembered (to log each once).
_SEEN = 64


@dataclass(eq=False)
class LoopGuard:
    """One per loop. ``failed(exc)`` counts and logs ``exc`` and returns the back-off."""

    what: str
    stats: MutableMapping[str, int]
    log: logging.Logger
    _: KW_ONLY
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
        d = min(self.cap, self.base * 2 ** min(self.attempt - 1, 30))
        return d / 2 + self.rng() * d / 2

    def failed(self, exc: BaseException) -> float:
        now = self.clock()
        if now - self._last > RESET_AFTER:
            self.attempt = 0
        self._last = now
        self.attempt += 1
        self.stats["loop_errors"] = self.stats.get("loop_errors", 0) + 1
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
                "%s failed unexpectedly; it goes on in %.2f s (counted in stats()['loop_errors'])",
                self.what,
                wait,
                exc_info=exc,
            )
        return wait
