"""Both flavours of the push side, for the other queue kinds (stream mode) to compose."""

from ._async.producer import AsyncProducer
from ._sync.producer import Producer

__all__ = ["AsyncProducer", "Producer"]
