"""The consumer's dead letters: over-tried items moved to the dead-letter queue.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ... import _validate as v
from ... import bucket
from ...errors import BucketQError, PushFailed, WriteConcernNotConfirmed
from .. import _core as core
from .consumer_state import AsyncConsumerState

log = logging.getLogger("bucketq.queue")

_now = time.time


class AsyncDeadLettering(AsyncConsumerState):
    """Moves over-tried items to the dead-letter queue (the state flush calls it)."""

    async def _dead_letter(self) -> None:
        """Move over-tried items to the dead-letter queue: insert there first (durably),
        then mark them consumed here, so the worst case is a duplicate, never a loss."""
        dying = [
            (b, i, reason) for b in list(self.held.values()) if not b.lost for i, reason in b.dying
        ]
        if not dying:
            return
        if self._dlq is None:
            self._dlq = self._open_dead_letter_queue()
        now = _now()
        # Each item on its own: one that cannot be moved (its data, or its insert failed)
        # stays in this queue, rolled back, and never holds up the others.
        pushed: list[tuple[core.HeldBucket, int, Any]] = []
        failed: list[tuple[core.HeldBucket, int, BaseException]] = []
        for b, i, reason in dying:
            it = b.items[i] if b.items is not None else {}
            try:
                headers = core.dead_letter_headers(
                    self.name, it.get("h"), b.tries.get(i, 0), reason, now
                )
                pushed.append((b, i, await self._dlq.push(it.get("p"), headers=headers)))
            except BucketQError as exc:
                failed.append((b, i, exc))
        await self._dlq._producer.flush()
        moved = []
        for b, i, r in pushed:
            try:
                await r.wait()
                moved.append((b, i))
            except WriteConcernNotConfirmed:
                moved.append((b, i))  # stored there: do not keep a second copy here
            except PushFailed as exc:
                failed.append((b, i, exc))
        with self._mutex:
            for b, i in moved:
                b.dead(i)
                self._stats["dead_lettered"] += 1
            for b, i, why in failed:
                self._stats["dead_letter_failed"] += 1
                log.error(
                    "queue %s: item %s could not be moved to the dead-letter queue (%s); it "
                    "stays here and is tried again later",
                    v.printable(self.name), bucket.item_id(b.id, i), why,
                )  # fmt: skip
                if b.state[i] == core.RESERVED and not b.lost:
                    b.rollback(i, now + core.retry_delay(b.tries.get(i, 0), self.options), now)
            done = {(b.id, i) for b, i in moved} | {(b.id, i) for b, i, _ in failed}
            for b in {id(b): b for b, _, _ in dying}.values():
                b.dying = [d for d in b.dying if (b.id, d[0]) not in done]
