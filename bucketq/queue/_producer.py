"""Both flavours of the shared push side, for the other queue kinds (stream mode) to build on."""

from ._async.producer import AsyncProducer
from ._sync.producer import Producer

__all__ = ["AsyncProducer", "Producer"]
