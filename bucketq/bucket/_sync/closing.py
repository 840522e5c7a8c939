# GENERATED from bucketq/bucket/_async/closing.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""Closing at the end of an ``async with`` block, for every queue kind, stream and consumer.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

from typing import Any, Self


class Closing:
    """``with x:`` closes ``x`` when the block ends (queues, streams, consumers)."""

    def close(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
