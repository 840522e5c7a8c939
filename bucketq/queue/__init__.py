"""The bucket-packing queue and its per-element baseline, sync and async."""

from ..bucket import AsyncReceipt, QueueOptions, Receipt
from ._async.element import AsyncElementQueue
from ._async.queue import AsyncQueue
from ._core.messages import Message
from ._sync.element import ElementQueue
from ._sync.queue import Queue

__all__ = [
    "AsyncElementQueue",
    "AsyncQueue",
    "AsyncReceipt",
    "ElementQueue",
    "Message",
    "Queue",
    "QueueOptions",
    "Receipt",
]
