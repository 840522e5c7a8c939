"""Both flavours of a queue object's runtime (bounded calls, guarded loops), for the other queue kinds (stream mode)."""

from ._async.runtime import AsyncRuntime
from ._sync.runtime import Runtime

__all__ = ["AsyncRuntime", "Runtime"]
