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
from collections.abc import Callable
from typing import Any

#: Long enough for the embedded server on a loaded machine; a passing test never waits it.
DEFAULT_TIMEOUT = 30.0
DEFAULT_INTERVAL = 0.02

_NOTHING = object()


def _fail(what: str, predicate: Any, timeout: float, last: Any, error: BaseException | None):
    seen = f"; last error: {error!r}" if error is not None else f"; last value: {last!r}"
    raise AssertionError(
        f"timed out after {timeout:g} s waiting for {what or getattr(predicate, '__name__', predicate)}"
        f"{'' if last is _NOTHING and error is None else seen}"
    )


def eventually(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy
    (returned) or ``timeout`` seconds pass (AssertionError). Exceptions of the types in
    ``ignore`` count as "not yet" (a server that is restarting, say)."""
    deadline = time.monotonic() + timeout
    last: Any = _NOTHING
    error: BaseException | None = None
    while True:
        try:
            last, error = predicate(), None
        except ignore as exc:
            error = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            _fail(what, predicate, timeout, last, error)
        time.sleep(interval)


async def eventually_async(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """:func:`eventually` for async tests: ``predicate`` may return an awaitable, which is
    awaited; the loop sleeps with ``asyncio.sleep`` so background tasks run meanwhile."""
    deadline = time.monotonic() + timeout
    last: Any = _NOTHING
    error: BaseException | None = None
    while True:
        try:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
            error = None
        except ignore as exc:
            error = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            _fail(what, predicate, timeout, last, error)
        await asyncio.sleep(interval)
