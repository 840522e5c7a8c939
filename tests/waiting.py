"""Wait for conditions, not for time.

``eventually(predicate)`` calls ``predicate`` until it returns something truthy and
returns that value; at the deadline it fails the test with what it was waiting for
and the last value seen. ``eventually_async`` is its twin for coroutines: its
predicate may be a plain function or return an awaitable. Neither is a timing
assertion: the timeout is a generous bound on real background work, and a test
passes as soon as the condition holds.

Import them from any test (``tests/`` is on ``sys.path``; ``tests/conftest.py``
re-exports them)::

    from waiting import eventually, eventually_async
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Long enough for the embedded server on a loaded machine; a passing test never waits it.
DEFAULT_TIMEOUT = 30.0
#: Without an ``interval``, the first pauses are short (a condition that holds soon is
#: seen soon) and each is half again as long as the one before, up to the longest: a
#: wait of seconds asks its server (an HTTP request, a query, a log file read) a few
#: times a second instead of fifty, CPU that the other tests of the run need.
FIRST_INTERVAL = 0.02
LONGEST_INTERVAL = 0.1

_NOTHING = object()


class _Waiting:
    """The state of one wait, shared by both flavours: the deadline, the last value and
    error seen, and the failure at the deadline."""

    def __init__(
        self, predicate: Any, timeout: float, interval: float | None, what: str, ignore: tuple
    ) -> None:
        self.predicate, self.timeout = predicate, timeout
        self.fixed = interval is not None
        self.interval = interval if interval is not None else FIRST_INTERVAL
        self.what, self.ignore = what, ignore
        self.deadline = time.monotonic() + timeout
        self.last: Any = _NOTHING
        self.error: BaseException | None = None

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """One call of the predicate: an exception of the ``ignore`` types is "not yet"."""
        try:
            yield
            self.error = None
        except self.ignore as exc:
            self.error = exc

    def done(self) -> bool:
        """True once the last call returned something truthy; fails the test at the deadline."""
        if self.error is None and self.last:
            return True
        if time.monotonic() >= self.deadline:
            seen = (
                f"; last error: {self.error!r}"
                if self.error is not None
                else f"; last value: {self.last!r}"
            )
            name = self.what or getattr(self.predicate, "__name__", self.predicate)
            raise AssertionError(
                f"timed out after {self.timeout:g} s waiting for {name}"
                f"{'' if self.last is _NOTHING and self.error is None else seen}"
            )
        return False

    def pause(self) -> float:
        """The pause before the next call: ``interval`` when given, else growing."""
        pause = self.interval
        if not self.fixed:
            self.interval = min(self.interval * 1.5, LONGEST_INTERVAL)
        return pause


def eventually(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float | None = None,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``predicate`` every ``interval`` seconds (by default: pauses growing from
    :data:`FIRST_INTERVAL` to :data:`LONGEST_INTERVAL`) until it returns something truthy
    (returned) or ``timeout`` seconds pass (AssertionError). Exceptions of the types in
    ``ignore`` count as "not yet" (a server that is restarting, say)."""
    w = _Waiting(predicate, timeout, interval, what, ignore)
    while True:
        with w.attempt():
            w.last = predicate()
        if w.done():
            return w.last
        time.sleep(w.pause())


async def eventually_async(*args: Any, **kwargs: Any) -> Any:
    """:func:`eventually` for async tests, with its arguments: ``predicate`` may return an
    awaitable, which is awaited; the loop sleeps with ``asyncio.sleep`` so background
    tasks run meanwhile."""
    bound = inspect.signature(eventually).bind(*args, **kwargs)
    bound.apply_defaults()
    w = _Waiting(**bound.arguments)
    while True:
        with w.attempt():
            last = w.predicate()
            w.last = (await last) if inspect.isawaitable(last) else last
        if w.done():
            return w.last
        await asyncio.sleep(w.pause())
