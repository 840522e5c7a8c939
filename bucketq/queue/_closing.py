"""Both flavours of closing at the end of a ``with`` block, for the other queue kinds
(stream mode) to compose."""

from ._async.api import AsyncClosing
from ._sync.api import Closing

__all__ = ["AsyncClosing", "Closing"]
