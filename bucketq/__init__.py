"""bucketq: a durable queue on MongoDB that packs many items into one bucket document."""

from .errors import (
    AckOutOfOrder,
    BucketQError,
    ConfigurationError,
    DecodeError,
    Fenced,
    LeaseLost,
    OperationTimeout,
    PayloadError,
    PayloadNotEncodable,
    PayloadTooLarge,
    PushFailed,
    QueueClosed,
    QueueFull,
)
from .queue import (
    AsyncElementQueue,
    AsyncQueue,
    AsyncReceipt,
    ElementQueue,
    Message,
    Queue,
    QueueOptions,
    Receipt,
)
from .stream import (
    AsyncStreamConsumer,
    AsyncStreamQueue,
    StreamBatch,
    StreamConsumer,
    StreamOptions,
    StreamQueue,
)

__version__ = "0.1.0"

__all__ = [
    "AckOutOfOrder",
    "AsyncElementQueue",
    "AsyncQueue",
    "AsyncReceipt",
    "AsyncStreamConsumer",
    "AsyncStreamQueue",
    "BucketQError",
    "ConfigurationError",
    "DecodeError",
    "ElementQueue",
    "Fenced",
    "LeaseLost",
    "Message",
    "OperationTimeout",
    "PayloadError",
    "PayloadNotEncodable",
    "PayloadTooLarge",
    "PushFailed",
    "Queue",
    "QueueClosed",
    "QueueFull",
    "QueueOptions",
    "Receipt",
    "StreamBatch",
    "StreamConsumer",
    "StreamOptions",
    "StreamQueue",
    "__version__",
]
