"""Both flavours of the change-stream watcher, for the other queue kinds (stream mode)."""

from ._async.wake import AsyncWakeWatcher
from ._sync.wake import WakeWatcher

__all__ = ["AsyncWakeWatcher", "WakeWatcher"]
