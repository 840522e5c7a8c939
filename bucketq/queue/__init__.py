"""The bucket-packing queue and its per-element baseline, sync and async."""

from ..bucket import AsyncReceipt, QueueOptions, Receipt
from ._async.dead_letters import AsyncDeadLetters
from ._async.element import AsyncElementQueue
from ._async.queue import AsyncQueue
from ._core.messages import Message
from ._sync.dead_letters import DeadLetters
from ._sync.element import ElementQueue
from ._sync.queue import Queue

__all__ = [
    "AsyncDeadLetters",
    "AsyncElementQueue",
    "AsyncQueue",
    "AsyncReceipt",
    "DeadLetters",
    "ElementQueue",
    "Message",
    "Queue",
    "QueueOptions",
    "Receipt",
]
