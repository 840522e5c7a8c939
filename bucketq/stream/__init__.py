"""Ordered stream mode: gapless sequence numbers per bucket, one fenced consumer,
in-order acknowledgements (exactly-once with a sink that stores the seq).

The sync and async flavours load on first use (PEP 562): a process that uses one (a
Spark Python worker uses the sync one) does not import the other."""

from typing import TYPE_CHECKING

from .. import _lazy
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


__all__ = [
    "AckOutOfOrder",
    "AsyncStreamConsumer",
    "AsyncStreamQueue",
    "StreamBatch",
    "StreamConsumer",
    "StreamOptions",
    "StreamQueue",
]

__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, __all__)
