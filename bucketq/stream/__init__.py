"""Ordered stream mode: gapless sequence numbers per bucket, one fenced consumer,
in-order acknowledgements (exactly-once with a sink that stores the seq)."""

from ._async.stream import AsyncStreamConsumer, AsyncStreamQueue
from ._sync.stream import StreamConsumer, StreamQueue
from .core import AckOutOfOrder, StreamBatch, StreamOptions

__all__ = [
    "AckOutOfOrder",
    "AsyncStreamConsumer",
    "AsyncStreamQueue",
    "StreamBatch",
    "StreamConsumer",
    "StreamOptions",
    "StreamQueue",
]
