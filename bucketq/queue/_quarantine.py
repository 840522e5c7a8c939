"""Both flavours of the quarantine collection, for the other queue kinds (stream mode)."""

from ._async.quarantine import AsyncQuarantine
from ._sync.quarantine import Quarantine

__all__ = ["AsyncQuarantine", "Quarantine"]
