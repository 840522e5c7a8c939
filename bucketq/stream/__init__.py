"""Ordered stream mode: gapless sequence numbers per bucket, one fenced consumer,
in-order acknowledgements (exactly-once with a sink that stores the seq).

The sync and async flavours load on first use (PEP 562): a process that uses one (a
Spark Python worker uses the sync one) does not import the other."""

import importlib
from typing import TYPE_CHECKING, Any

from .core import AckOutOfOrder, StreamBatch, StreamOptions

_LAZY = {
    "AsyncStreamConsumer": "._async.stream",
    "AsyncStreamQueue": "._async.stream",
    "StreamConsumer": "._sync.stream",
    "StreamQueue": "._sync.stream",
}

if TYPE_CHECKING:
    from ._async.stream import AsyncStreamConsumer, AsyncStreamQueue
    from ._sync.stream import StreamConsumer, StreamQueue


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AckOutOfOrder",
    "AsyncStreamConsumer",
    "AsyncStreamQueue",
    "StreamBatch",
    "StreamConsumer",
    "StreamOptions",
    "StreamQueue",
]
