"""The items every contender pushes, and the client's floor for them.

Payloads are made before any clock starts (making them is the user's cost, not the
queue's), as a pool of at most ``POOL_MAX`` distinct dicts per worker that is cycled
through when a worker pushes more: memory stays bounded at 1,000,000 items.
"""

from __future__ import annotations

import time
from itertools import cycle, islice
from typing import Any

import bson

#: Distinct payloads one worker keeps in memory (about 50 MB); more items reuse them.
POOL_MAX = 100_000
#: Payloads the floor is measured over (in every worker, before its clock starts).
FLOOR_ITEMS = 20_000


def payload(i: int) -> dict[str, Any]:
    """About 100 bytes as JSON, like a small log record; ``i`` is the item's number."""
    return {
        "i": i,
        "svc": "checkout",
        "level": "info",
        "msg": f"order {i:08d} paid",
        "user": f"u{i % 997:04d}",
    }


def payload_pool(start: int, count: int, cap: int = POOL_MAX) -> list[dict[str, Any]]:
    """The distinct payloads of items ``start .. start + count`` (at most ``cap`` of them)."""
    return [payload(i) for i in range(start, start + min(count, cap))]


def item_numbers(pool: list[dict[str, Any]], count: int) -> Any:
    """The item numbers a worker pushes when it cycles through ``pool`` for ``count`` items."""
    return (p["i"] for p in islice(cycle(pool), count))


def bson_floor_us(items: list[dict[str, Any]] | None = None, repeat: int = 3) -> float:
    """Client CPU per item of encoding each payload to BSON once and decoding it once, over
    ``items`` (default: 20,000 payloads); best of ``repeat``: a floor is a lower bound, and
    noise only adds."""
    items = items if items else payload_pool(0, FLOOR_ITEMS)
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for p in items:
            bson.decode(bson.encode(p))
        best = min(best, time.process_time() - t)
    return 1e6 * best / len(items)
