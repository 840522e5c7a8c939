"""Closing at the end of an ``async with`` block, for every queue kind, stream and consumer.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

from typing import Any, Self


class AsyncClosing:
    """``async with x:`` closes ``x`` when the block ends (queues, streams, consumers)."""

    async def close(self) -> Any:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
