"""The operator's view of queues and streams: ``Inspector`` (pymongo ``Database``) and
``AsyncInspector`` (``AsyncDatabase``) list them with their counts, peek at items without
reserving them, and list, requeue or purge dead letters. ``bucketq queues``, the
Prometheus collector (``bucketq.metrics``) and the console use them."""

from ._async.inspect import AsyncInspector
from ._core import ItemView, QueueRow, Rates
from ._sync.inspect import Inspector

__all__ = ["AsyncInspector", "Inspector", "ItemView", "QueueRow", "Rates"]
