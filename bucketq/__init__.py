"""bucketq: a durable queue on MongoDB that packs many items into one bucket document."""

from typing import TYPE_CHECKING, Any

from . import _lazy
from .errors import (
    AckOutOfOrder,
    BucketQError,
    CircuitOpen,
    ConfigurationError,
    DamagedBucket,
    DecodeError,
    EmbeddedServerError,
    Fenced,
    LeaseLost,
    MissingDependency,
    NotSupported,
    OperationFailed,
    OperationTimeout,
    Overloaded,
    PayloadError,
    PayloadNotEncodable,
    PayloadTooLarge,
    PushFailed,
    QueueClosed,
    QueueFull,
    ServerUnavailable,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
    WriteConcernNotConfirmed,
)

# The queue kinds load on first use (PEP 562), so ``import bucketq.sdk`` or a Spark
# Python worker's ``import bucketq.spark`` loads only what it uses.
_LAZY = {
    "AsyncElementQueue": ".queue",
    "AsyncQueue": ".queue",
    "AsyncReceipt": ".queue",
    "ElementQueue": ".queue",
    "Message": ".queue",
    "Queue": ".queue",
    "QueueOptions": ".queue",
    "Receipt": ".queue",
    "AsyncStreamConsumer": ".stream",
    "AsyncStreamQueue": ".stream",
    "StreamBatch": ".stream",
    "StreamConsumer": ".stream",
    "StreamOptions": ".stream",
    "StreamQueue": ".stream",
}

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from ._version import version

        return version()
    return _load(name)


__all__ = [
    "AckOutOfOrder",
    "AsyncElementQueue",
    "AsyncQueue",
    "AsyncReceipt",
    "AsyncStreamConsumer",
    "AsyncStreamQueue",
    "BucketQError",
    "CircuitOpen",
    "ConfigurationError",
    "DamagedBucket",
    "DecodeError",
    "ElementQueue",
    "EmbeddedServerError",
    "Fenced",
    "LeaseLost",
    "Message",
    "MissingDependency",
    "NotSupported",
    "OperationFailed",
    "OperationTimeout",
    "Overloaded",
    "PayloadError",
    "PayloadNotEncodable",
    "PayloadTooLarge",
    "PushFailed",
    "Queue",
    "QueueClosed",
    "QueueFull",
    "QueueOptions",
    "Receipt",
    "ServerUnavailable",
    "StreamBatch",
    "StreamConsumer",
    "StreamOptions",
    "StreamQueue",
    "TransportError",
    "TransportTimeout",
    "TransportUnavailable",
    "WriteConcernNotConfirmed",
    "__version__",
]

_load, __dir__ = _lazy.attributes(__name__, _LAZY, __all__)
