"""The push side: open buckets, how pushed items are packed into them and sealed, and
the documents their inserts write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bson import ObjectId

from ..errors import PayloadTooLarge
from .options import BUCKET_OVERHEAD, HARD_MAX_BYTES, QueueOptions
from .times import to_datetime


class OpenBucket:
    """Items buffered for one bucket insert. ``batch`` is the shell's completion handle."""

    __slots__ = (
        "id", "items", "nbytes", "mature", "opened", "slot", "part", "batch", "urgent", "error"
    )  # fmt: skip

    def __init__(self, slot: int | None, opened: float, batch: Any, part: int = 0) -> None:
        self.id = ObjectId()
        self.part = part
        self.items: list[bytes] = []
        self.nbytes = 0
        self.mature = 0.0
        self.opened = opened
        self.slot = slot
        self.batch = batch
        # A durable push waits on it: written at the writer's next turn, not at its age
        # limit. Pushes that arrive while the writer is busy join it (group commit).
        self.urgent = False
        # What its receipts report when this bucket alone failed (or was stored with its
        # write concern unconfirmed); None: the write's shared outcome.
        self.error: BaseException | None = None

    def __len__(self) -> int:
        return len(self.items)

    def document(self, *, seq: int | None = None) -> dict[str, Any]:
        """The bucket document for its single insert."""
        n = len(self.items)
        doc: dict[str, Any] = {
            "_id": self.id,
            "mature": to_datetime(self.mature),
            "n": n,
            "live": n,
            "items": b"".join(self.items),
            "leases": 0,
        }
        if self.part:  # partition 0 has no field: see part_filter
            if self.part < 0:  # OWN_PARTITION: its producer did not place it
                raise ValueError("the bucket was not placed in a partition")
            doc["part"] = self.part
        if seq is not None:
            doc["seq"] = seq
        return doc


def build_documents(
    buckets: list[OpenBucket], build: Callable[[OpenBucket], dict[str, Any]]
) -> tuple[dict[Any, dict[str, Any]], set[Any]]:
    """Each bucket's document, built on its own: a bucket whose document cannot be built
    fails alone (its ``error`` says why; its id is in the returned set), never the others
    of the same write."""
    docs: dict[Any, dict[str, Any]] = {}
    failed: set[Any] = set()
    for ob in buckets:
        try:
            docs[ob.id] = build(ob)
        except (ValueError, OverflowError, TypeError, OSError) as exc:
            from ..errors import PayloadError

            err = PayloadError(f"Bucket {ob.id} could not be built for its insert: {exc}")
            err.__cause__ = exc
            ob.error = err
            failed.add(ob.id)
    return docs, failed


def recovered_bucket(
    bucket_id: ObjectId, items: list[bytes], now: float, part: int = 0
) -> OpenBucket:
    """A sealed bucket of items recovered from a quarantined one, due now (in the
    re-queueing producer's partition ``part``)."""
    ob = OpenBucket(None, now, None, part)
    ob.id = bucket_id
    ob.items = list(items)
    ob.nbytes = sum(len(it) for it in items)
    ob.mature = now
    return ob


def open_key(mature: float, now: float, granularity: float, part: int) -> Any:
    """The open bucket an item joins: its mature slot (None: due now), and its partition
    when not 0 (a bucket holds one partition's items)."""
    slot = None if mature <= now else -int(-mature // granularity)
    return slot if not part else (slot, part)


class Packer:
    """Groups pushed items into open buckets by mature slot (and partition) and seals
    them by count, bytes or age.

    Items due now share one open bucket (slot ``None``); delayed items go to the bucket
    of their slot, ``ceil(mature / granularity)``, so a bucket's mature time (the latest
    of its items) is at most one slot past any of its items' own time.
    """

    def __init__(self, opts: QueueOptions, new_batch: Callable[[], Any]) -> None:
        self.max_size = opts.bucket_max_size
        self.max_item_bytes = opts.bucket_max_bytes - BUCKET_OVERHEAD
        self.max_wait = opts.bucket_max_wait
        self.granularity = opts.mature_granularity
        self.new_batch = new_batch
        self.open: dict[Any, OpenBucket] = {}

    def check_size(self, nbytes: int) -> None:
        if nbytes > self.max_item_bytes:
            raise PayloadTooLarge(
                f"The item is {nbytes} bytes encoded; a bucket holds at most {self.max_item_bytes} "
                f"bytes of items (bucket_max_bytes={self.max_item_bytes + BUCKET_OVERHEAD}). Store large "
                "blobs elsewhere (GridFS, object storage) and push a reference, or raise bucket_max_bytes "
                f"(up to {HARD_MAX_BYTES})."
            )

    def add(
        self, item: bytes, mature: float, now: float, part: int = 0
    ) -> tuple[OpenBucket, int, tuple[OpenBucket, ...]]:
        """Add an encoded item (to partition ``part``); returns (its bucket, its index, the
        buckets this add sealed, oldest first)."""
        nbytes = len(item)
        self.check_size(nbytes)
        slot = open_key(mature, now, self.granularity, part)
        sealed: tuple[OpenBucket, ...] = ()
        ob = self.open.get(slot)
        if ob is not None and ob.nbytes + nbytes > self.max_item_bytes:
            sealed = (self.open.pop(slot),)
            ob = None
        if ob is None:
            ob = self.open[slot] = OpenBucket(slot, now, self.new_batch(), part)
        index = len(ob.items)
        ob.items.append(item)
        ob.nbytes += nbytes
        if mature > ob.mature:
            ob.mature = mature
        if index + 1 >= self.max_size:
            del self.open[slot]
            sealed += (ob,)
        return ob, index, sealed

    def add_many(
        self, items: list[bytes], sizes: list[int], mature: float, now: float, part: int = 0
    ) -> tuple[list[tuple[OpenBucket, int, int]], list[OpenBucket]]:
        """Add encoded items of one mature time and partition (sizes checked by the
        caller), filling buckets in runs. Returns ((bucket, first index, count) per run,
        the buckets this sealed, oldest first)."""
        slot = open_key(mature, now, self.granularity, part)
        runs: list[tuple[OpenBucket, int, int]] = []
        sealed: list[OpenBucket] = []
        i, n = 0, len(items)
        while i < n:
            ob = self.open.get(slot)
            if ob is None:
                ob = self.open[slot] = OpenBucket(slot, now, self.new_batch(), part)
            start = len(ob.items)
            limit = min(n, i + self.max_size - start)
            nbytes, cap, j = ob.nbytes, self.max_item_bytes, i
            while j < limit and nbytes + sizes[j] <= cap:
                nbytes += sizes[j]
                j += 1
            if j > i:
                ob.items.extend(items[i:j])
                ob.nbytes = nbytes
                if mature > ob.mature:
                    ob.mature = mature
                runs.append((ob, start, j - i))
            if j < n or len(ob.items) >= self.max_size:  # full by count or bytes
                sealed.append(self.open.pop(slot))
            i = j
        return runs, sealed

    def take_due(self, now: float) -> list[OpenBucket]:
        """Seal and return the open buckets older than ``bucket_max_wait`` or urgent."""
        due = [ob for ob in self.open.values() if ob.urgent or now - ob.opened >= self.max_wait]
        for ob in due:
            del self.open[ob.slot]
        return due

    def take_all(self) -> list[OpenBucket]:
        out = list(self.open.values())
        self.open.clear()
        return out

    def next_due(self) -> float | None:
        """When the first open bucket is due: its age limit, or at once (its opening time)
        when urgent. None if none is open."""
        if not self.open:
            return None
        return min(
            ob.opened if ob.urgent else ob.opened + self.max_wait for ob in self.open.values()
        )
