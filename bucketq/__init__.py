"""bucketq: a durable queue on MongoDB that packs many items into one bucket document."""

from .errors import (
    BucketQError,
    ConfigurationError,
    DecodeError,
    Fenced,
    LeaseLost,
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

__version__ = "0.1.0"

__all__ = [
    "AsyncElementQueue",
    "AsyncQueue",
    "AsyncReceipt",
    "BucketQError",
    "ConfigurationError",
    "DecodeError",
    "ElementQueue",
    "Fenced",
    "LeaseLost",
    "Message",
    "PayloadError",
    "PayloadNotEncodable",
    "PayloadTooLarge",
    "PushFailed",
    "Queue",
    "QueueClosed",
    "QueueFull",
    "QueueOptions",
    "Receipt",
    "__version__",
]
