"""The one error boundary between pymongo and bucketq's public methods, with no I/O.

A driver error that leaves the I/O layer is translated here, always with
``raise ... from`` so the driver's error stays attached as ``__cause__``:

- ``ExecutionTimeout``, ``WTimeoutError``, ``NetworkTimeout`` (a deadline passed):
  :class:`OperationTimeout`
- no server selected, any other ``ConnectionFailure``: :class:`ServerUnavailable`
- any other ``PyMongoError``: :class:`OperationFailed`

All three are :class:`OperationFailed`. Public methods of the queue classes carry
:func:`boundary`; loops and retry code inside the I/O layer still see the driver's own
errors (to tell transient ones apart).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from pymongo.errors import (
    ConnectionFailure,
    ExecutionTimeout,
    NetworkTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
    WTimeoutError,
)

from .errors import BucketQError, OperationFailed, OperationTimeout, ServerUnavailable

__all__ = ["boundary", "translate", "translating"]

F = TypeVar("F", bound=Callable[..., Any])


def translate(exc: PyMongoError, what: str) -> BucketQError:
    """The bucketq error for a driver error raised while doing ``what``."""
    if not isinstance(exc, ServerSelectionTimeoutError) and (
        isinstance(exc, ExecutionTimeout | WTimeoutError | NetworkTimeout)
        or getattr(exc, "timeout", False)
    ):
        return OperationTimeout(
            f"MongoDB did not answer in time during {what}: {exc}. The operation may or may "
            "not have taken effect; retrying it is safe."
        )
    if isinstance(exc, ConnectionFailure):
        return ServerUnavailable(
            f"MongoDB could not be reached during {what}: {exc}. Check the URI and that the "
            "server is up; the queue goes on once it is back."
        )
    return OperationFailed(f"MongoDB refused {what}: {exc}")


@contextmanager
def translating(what: str) -> Iterator[None]:
    """``with translating("size()"):`` driver errors inside leave as bucketq errors."""
    try:
        yield
    except PyMongoError as exc:
        raise translate(exc, what) from exc


def boundary(what: str) -> Callable[[F], F]:
    """Decorate a public method (sync or async) so driver errors leave it translated."""

    def deco(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except PyMongoError as exc:
                    raise translate(exc, what) from exc

            return cast(F, awrapper)

        # try/except, not ``translating()``: a context manager adds its cost to every
        # call, and commit() of one item is a call per item.
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except PyMongoError as exc:
                raise translate(exc, what) from exc

        return cast(F, wrapper)

    return deco
