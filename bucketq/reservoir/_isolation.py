"""Writing one kind's records of a flush to storage, and finding exactly which failed.

When the storage does not name the failing records, the write is halved and written
again until they stand alone, so a poison record never fails, nor dead-letters, its
neighbours. The flush consumer (``_flush_consumers``) settles what this returns: stored
records are acked, failed ones retried or dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ._metrics import BufferMetrics
from ._policy import (
    WriteOutcome,
    exception_outcome,
    interpret,
    split,
    storage_record,
)
from ._reservoir import STORAGE_METHOD
from ._transport import Delivery

log = logging.getLogger("bucketq.reservoir")


@dataclass(eq=False)
class RecordWriter:
    """Writes to ``storage`` (a :class:`~bucketq.reservoir.Reservoir`); ``retry`` is each
    kind's retry policy (a kind allowed one attempt is always isolated thoroughly);
    ``metrics`` and ``counts`` are the buffer's."""

    storage: Any
    retry: Mapping[str, Any]
    metrics: BufferMetrics
    counts: MutableMapping[str, int]

    @property
    def idempotent(self) -> bool:
        """The storage engine's: rewrites of a record with the same ``_id`` are no-ops."""
        return bool(getattr(self.storage, "idempotent", False))

    def records(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What storage gets: with each record's stable id as ``_id`` when the engine is
        idempotent (a rewrite is then a no-op), the records as they came otherwise."""
        if self.idempotent:
            return [storage_record(e) for e in entries]
        return [e["record"] for e in entries]

    async def _write(self, shard: int, kind: str, ds: list[Delivery]) -> WriteOutcome:
        records = self.records([d.entry for d in ds])
        t0 = time.perf_counter()
        try:
            outcome = interpret(
                len(records), await getattr(self.storage, STORAGE_METHOD[kind])(records)
            )
        except Exception as exc:  # noqa: BLE001 - any storage failure fails these records
            outcome = exception_outcome(len(records), exc)
        self.metrics.flush_duration.labels(kind, str(shard)).observe(
            (time.perf_counter() - t0) * 1000
        )
        self.counts["storage_writes"] += 1
        if not outcome.ok:
            log.warning(
                "shard %d: %d of %d %s records failed to store: %s",
                shard,
                outcome.failed,
                outcome.n,
                kind,
                outcome.reason,
            )
        return outcome

    async def write_kind(
        self, shard: int, kind: str, ds: list[Delivery]
    ) -> tuple[list[Delivery], list[tuple[Delivery, str]]]:
        # Records that failed before are suspects: find exactly which fail, however many
        # writes it takes; a first failure of fresh records may stop early at an outage.
        thorough = self.retry[kind].attempts <= 1 or any(
            int(d.entry.get("attempts") or 0) for d in ds
        )
        return await self._isolate(shard, kind, ds, await self._write(shard, kind, ds), thorough)

    async def _isolate(
        self, shard: int, kind: str, ds: list[Delivery], outcome: WriteOutcome, thorough: bool
    ) -> tuple[list[Delivery], list[tuple[Delivery, str]]]:
        """Which records of a write failed. When the storage names them, that is the
        answer; otherwise halve and write again until the failing records stand alone
        (the halves of a level run concurrently: about log2(n) rounds), so a poison
        record never fails, nor dead-letters, its neighbours. Not ``thorough`` (every
        record is on its first attempt): when a write and both its halves fail entirely,
        it looks like an outage and all fail without more writes; they come back as
        suspects and are isolated then, before any of them can reach the DLQ."""
        if outcome.ok:
            return ds, []
        reason = outcome.reason or "storage write failed"
        if outcome.failed_indices is not None:
            bad = outcome.failed_indices
            return [d for i, d in enumerate(ds) if i not in bad], [
                (ds[i], bad[i]) for i in sorted(bad)
            ]
        if len(ds) == 1:
            return [], [(ds[0], reason)]
        left, right = split(ds)
        lo, ro = await asyncio.gather(
            self._write(shard, kind, left), self._write(shard, kind, right)
        )
        if not thorough and outcome.total_failure and lo.total_failure and ro.total_failure:
            return [], [(d, reason) for d in ds]
        (sl, fl), (sr, fr) = await asyncio.gather(
            self._isolate(shard, kind, left, lo, thorough),
            self._isolate(shard, kind, right, ro, thorough),
        )
        return sl + sr, fl + fr
