"""The queue's decisions, with no I/O: options, bucket packing, claimed-bucket state,
update documents, lease and retry maths.

The sync and async shells (``_sync/``, ``_async/``) build a request with these,
make one driver call, and hand the answer back here.

Times are floats (seconds since the epoch) in memory and BSON datetimes in MongoDB.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId
from pymongo import DeleteOne, UpdateOne
from pymongo.write_concern import WriteConcern

from .. import _validate as v
from ..errors import ConfigurationError, DamagedBucket, DecodeError, PayloadTooLarge
from ._codec import decode_items
from ._damage import bucket_damage, check_items

# -- options ------------------------------------------------------------------

DEFAULT_BUCKET_MAX_SIZE = 1024
DEFAULT_BUCKET_MAX_BYTES = 8 * 1024 * 1024
#: MongoDB's document limit, less room for the bucket's own fields.
HARD_MAX_BYTES = 16 * 1024 * 1024 - 64 * 1024
DEFAULT_BUCKET_MAX_WAIT = 0.5
DEFAULT_STATE_FLUSH_PERIOD = 0.5
DEFAULT_LEASE = 30.0
DEFAULT_REJECT_DELTA_BASE = 10.0
DEFAULT_REJECT_DELTA_FACTOR = 10.0
DEFAULT_REJECT_TIMEOUT_GRACE = 10.0
DEFAULT_MATURE_GRANULARITY = 1.0
DEFAULT_PREFETCH = 1
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
DEFAULT_RETRY_BASE = 0.1
DEFAULT_RETRY_CAP = 5.0
DEFAULT_RETRY_BUDGET = 60.0
DEFAULT_DRAIN_TIMEOUT = 5.0
#: How long one MongoDB operation not bounded by another budget may wait for its answer
#: (claims, state flushes, index creation, size(), ...).
DEFAULT_OP_TIMEOUT = 10.0
DLQ_SUFFIX = ".dlq"

#: Bytes a bucket document needs besides its items binary (ids, counters, bitmaps).
BUCKET_OVERHEAD = 512
MAX_PREFETCH = 1024
MAX_TRIES = 1_000_000
#: Partitions a queue may have (claims, the index and a shard key all stay one range each).
MAX_PARTITIONS = 4096

#: Time options (seconds): the lowest value and whether it is excluded. Each is at most
#: ``MAX_OPTION_SECONDS`` (30 days).
_TIME_OPTIONS: dict[str, tuple[float, bool]] = {
    "bucket_max_wait": (0.0, False),
    "state_flush_period": (0.0, True),
    "lease": (0.0, True),
    "reject_delta_base": (0.0, False),
    "reject_delta_factor": (0.0, False),
    "reject_timeout_grace": (0.0, False),
    "mature_granularity": (0.0, True),
    "poll_interval": (0.0, True),
    "retry_base": (0.0, True),
    "retry_cap": (0.0, True),
    "retry_budget": (0.0, False),
    "drain_timeout": (0.0, False),
    "op_timeout": (0.0, True),
}


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Every queue option with its default (seconds for times, bytes for sizes).

    The names follow keuss where keuss has one (``lease`` is keuss's ``reserve_delay``).
    """

    bucket_max_size: int = DEFAULT_BUCKET_MAX_SIZE
    bucket_max_bytes: int = DEFAULT_BUCKET_MAX_BYTES
    bucket_max_wait: float = DEFAULT_BUCKET_MAX_WAIT
    state_flush_period: float = DEFAULT_STATE_FLUSH_PERIOD
    lease: float = DEFAULT_LEASE
    reject_delta_base: float = DEFAULT_REJECT_DELTA_BASE
    reject_delta_factor: float = DEFAULT_REJECT_DELTA_FACTOR
    reject_timeout_grace: float = DEFAULT_REJECT_TIMEOUT_GRACE
    mature_granularity: float = DEFAULT_MATURE_GRANULARITY
    prefetch: int = DEFAULT_PREFETCH
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_tries: int | None = None
    dead_letter_queue: str | None = None
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    pending_policy: str = "block"
    retry_base: float = DEFAULT_RETRY_BASE
    retry_cap: float = DEFAULT_RETRY_CAP
    retry_budget: float = DEFAULT_RETRY_BUDGET
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    op_timeout: float = DEFAULT_OP_TIMEOUT
    write_concern: WriteConcern | dict[str, Any] | None = None
    change_streams: bool | None = None
    hold_pushed: bool = False
    partitions: int = 1
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        # Every option's type, finiteness and range: the ranges are in OPTION_RANGES and
        # in the README's option table.
        v.count("bucket_max_size", self.bucket_max_size, lo=1, hi=65536, unit="items")
        v.count(
            "bucket_max_bytes", self.bucket_max_bytes, lo=1024, hi=HARD_MAX_BYTES, unit="bytes",
            note=" (MongoDB's 16 MiB document limit less room for the bucket's fields)",
        )  # fmt: skip
        for name, (lo, open_lo) in _TIME_OPTIONS.items():
            v.number(name, getattr(self, name), lo=lo, open_lo=open_lo)
        if self.lease < 3 * self.state_flush_period:
            raise ConfigurationError(
                f"lease ({self.lease} s) must be at least 3x state_flush_period "
                f"({self.state_flush_period} s) so leases are renewed before they run out."
            )
        v.count("prefetch", self.prefetch, lo=0, hi=MAX_PREFETCH, unit="buckets")
        if self.max_tries is not None:
            v.count("max_tries", self.max_tries, lo=1, hi=MAX_TRIES)
        if self.dead_letter_queue is not None:
            v.collection_name("dead_letter_queue", self.dead_letter_queue)
        v.count("max_pending_bytes", self.max_pending_bytes, lo=1024, unit="bytes")
        if self.max_pending_bytes < self.bucket_max_bytes:
            raise ConfigurationError(
                f"max_pending_bytes ({self.max_pending_bytes!r}) must be at least bucket_max_bytes "
                f"({self.bucket_max_bytes})."
            )
        v.choice("pending_policy", self.pending_policy, ("block", "raise"))
        v.write_concern(self.write_concern)
        v.flag("change_streams", self.change_streams, optional=True)
        v.flag("hold_pushed", self.hold_pushed)
        v.count(
            "partitions", self.partitions, lo=1, hi=MAX_PARTITIONS, unit="partitions",
            note=" (1: one claim range, today's layout; more: claims each search one partition)",
        )  # fmt: skip
        v.text("owner", self.owner)

    @classmethod
    def build(cls, **options: Any) -> QueueOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"Unknown queue option(s): {', '.join(unknown)}. Known options: {', '.join(sorted(known))}."
            )
        return cls(**options)

    def dead_letter_name(self, queue_name: str) -> str:
        """The dead-letter queue's name (``<name>.dlq`` unless ``dead_letter_queue``)."""
        return self.dead_letter_queue or queue_name + DLQ_SUFFIX

    def get_write_concern(self) -> WriteConcern | None:
        wc = self.write_concern
        return WriteConcern(**wc) if isinstance(wc, dict) else wc


def bulk_failed_indexes(exc: Any) -> set[int]:
    """The positions of the writes a ``BulkWriteError`` says failed."""
    return {int(e["index"]) for e in exc.details.get("writeErrors", []) if "index" in e}


def bulk_error_of(exc: Any, index: int) -> str:
    for e in exc.details.get("writeErrors", []):
        if e.get("index") == index:
            return str(e.get("errmsg") or e)
    return str(exc)


def split_write_errors(exc: Any) -> tuple[list[Any], set[Any]]:
    """A ``BulkWriteError`` of an insert: (ids that exist already, ids that failed otherwise).
    An existing id is an earlier attempt that landed, or for a stream, someone else's number."""
    errs = exc.details.get("writeErrors", [])
    dups = [e["op"]["_id"] for e in errs if e.get("code") == 11000]
    failed = {e["op"]["_id"] for e in errs if e.get("code") != 11000}
    return dups, failed


def check_dead_letter_name(name: str, opts: QueueOptions) -> str:
    """The dead-letter queue's name, checked when the queue opens (not at its first dead
    letter): a valid collection name that is not the queue's own."""
    dlq = v.collection_name("dead-letter queue name (name + '.dlq')", opts.dead_letter_name(name))
    if dlq == name:
        raise ConfigurationError(
            f"dead_letter_queue must differ from the queue's own name {name!r}: an item moved "
            "there would be delivered again."
        )
    return dlq


def open_options(name: Any, options: dict[str, Any]) -> tuple[QueueOptions, str]:
    """A queue's options and name, checked when it opens (its dead-letter name too)."""
    opts = QueueOptions.build(**options)
    name = check_name(name)
    check_dead_letter_name(name, opts)
    return opts, name


def check_max_items(max_items: Any) -> int:
    return v.count("max_items", max_items, lo=1, hi=1_000_000, unit="items")


def check_name(name: Any) -> str:
    """A queue name: a valid MongoDB collection name (it also names ``<name>.dlq``)."""
    return v.collection_name("queue name", name)


# -- time -----------------------------------------------------------------------


def to_datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def from_datetime(d: datetime) -> float:
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return d.timestamp()


def mature_time(now: float, delay: Any, mature: Any, *, mature_name: str = "mature") -> float:
    """When a pushed item may first be delivered ("not before"): ``delay`` seconds from
    ``now``, or ``mature`` (a datetime or seconds since the epoch). Both are checked here,
    at push time, so every item's time can become a BSON datetime."""
    if delay is not None and mature is not None:
        raise ConfigurationError(f"Give either delay or {mature_name}, not both.")
    if delay is not None:
        return now + v.delay(delay)
    if mature is not None:
        return v.timestamp(mature, mature_name)
    return now


def retry_delay(tries: int, opts: QueueOptions) -> float:
    """The default wait before a rolled-back item is delivered again (at most ``MAX_DELAY``)."""
    return min(opts.reject_delta_factor * tries + opts.reject_delta_base, v.MAX_DELAY)


def rollback_time(now: float, delay: Any, next_t: Any, tries: int, opts: QueueOptions) -> float:
    """When a rolled-back item may be delivered again: ``delay`` seconds from now, or
    ``next_t``, or by default :func:`retry_delay` (both arguments checked here)."""
    if delay is not None and next_t is not None:
        raise ConfigurationError("Give either delay or next_t, not both.")
    if next_t is not None:
        return v.timestamp(next_t, "next_t")
    if delay is None:
        return now + retry_delay(tries, opts)
    return now + v.delay(delay)


def check_push(headers: Any, durable: Any) -> dict[str, Any] | None:
    """The per-item arguments of a push besides the payload and its time."""
    v.flag("durable", durable)
    return v.headers(headers)


def check_message(msg: Any, origin: Any, what: str) -> Any:
    """``msg`` must be a :class:`Message` this queue object delivered (``origin`` is the
    queue object; a message's bucket remembers who claimed it)."""
    if not isinstance(msg, Message):
        raise ConfigurationError(
            f"{what} takes a Message returned by reserve() of this queue; got {msg!r}."
        )
    if getattr(msg.bucket, "origin", None) is not origin:
        raise ConfigurationError(
            f"{what}: message {msg.id} was delivered by another queue object; commit or roll "
            "it back on the queue object whose reserve() returned it."
        )
    return msg


def is_current(msg: Message) -> bool:
    """Whether ``msg`` is the item's latest delivery here: a rollback (counted in the
    bucket's ``tries``) ends a delivery, so a commit of the earlier Message is refused
    even when the item was served again at once."""
    return msg.tries == msg.bucket.tries.get(msg.index, 0)


def backoff(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    return rng() * min(cap, base * (2 ** min(attempt, 32)))


# -- item ids ---------------------------------------------------------------------


def item_id(bucket_id: ObjectId, index: int) -> str:
    return f"{bucket_id}.{index}"


def parse_item_id(value: Any) -> tuple[ObjectId, int]:
    """``'<24 hex digits>.<index>'`` (as in ``Receipt.id`` and ``Message.id``) split into the
    bucket id and a whole index from 0 to 65535 (written in plain decimal digits)."""
    try:
        bid, idx = value.rsplit(".", 1)
        if not idx.isdigit() or not idx.isascii() or (len(idx) > 1 and idx[0] == "0"):
            raise ValueError("bad index")
        index = int(idx)
        if index >= 65536:
            raise ValueError("index out of range")
        return ObjectId(bid), index
    except Exception as exc:
        raise ConfigurationError(
            f"{value!r} is not a bucketq item id (they look like '<24 hex digits>.<index>' with "
            "an index from 0 to 65535, as in Receipt.id and Message.id)."
        ) from exc


# -- push side: open buckets ----------------------------------------------------


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


def write_concern_unconfirmed(kind: str, name: str, exc: BaseException) -> BaseException:
    """The receipt error of items that were stored while the write concern was not
    confirmed (a ``WriteConcernError``, or a bulk write's ``writeConcernErrors``)."""
    from ..errors import WriteConcernNotConfirmed

    err = WriteConcernNotConfirmed(
        f"The item IS stored in {kind} {name!r}, but the server did not confirm the write "
        f"concern ({exc}). Do not push it again (that would store it twice); fix the write "
        "concern or the replica set."
    )
    err.__cause__ = exc
    return err


def bulk_write_concern_failed(exc: Any) -> bool:
    """Whether a ``BulkWriteError`` also reports write concern errors."""
    return bool(exc.details.get("writeConcernErrors"))


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


# -- consume side: claims and held buckets -------------------------------------------

CLAIM_SORT = [("mature", 1), ("_id", 1)]
#: The claim index of a partitioned queue: a claim is one equality on ``part`` and then
#: the same range and order as ``CLAIM_SORT``. (``mature_id`` stays: next_t() and the
#: queue-wide counts look across partitions.)
PART_CLAIM_INDEX = [("part", 1), ("mature", 1), ("_id", 1)]


def member_id(owner: str) -> str:
    """A queue object's own id (its producer's partition and its consumer's first one
    come from it): the owner (host:pid) and a fresh ObjectId, unique across objects."""
    return f"{owner}/{ObjectId()}"


def partition_of(key: Any, partitions: int) -> int:
    """The partition of a push ``key`` (or of a producer's id): a whole number picks
    ``key % partitions``; str and bytes are hashed (blake2b, the same in every process
    and Python version, unlike ``hash()``)."""
    if partitions == 1:
        return 0
    if isinstance(key, int):
        return key % partitions
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big") % partitions


def part_filter(part: int | None) -> dict[str, Any]:
    """The claim's partition term: none for an unpartitioned queue (None), else an
    equality. Partition 0 is stored without the field (``{"part": None}`` matches it), so
    buckets written before a queue was partitioned, or by a writer that knows nothing of
    partitions, belong to partition 0 and are claimed."""
    if part is None:
        return {}
    return {"part": part if part else None}


#: Buckets a consumer claims in a row from one partition before it moves on to the next
#: (fewer: more claims that find nothing when only some partitions have items, each
#: move costing up to K-1; more: a partition waits longer for a consumer busy elsewhere).
#: At 8, one producer's 100 buckets took 138 claims with K=4; at 32, about 110.
ROTATION_STAY = 32


class Rotation:
    """The order in which one consumer's claims visit the partitions: a round tries
    each partition once, from ``next``. A claim that finds a bucket keeps the consumer
    on that partition for up to ``stay`` buckets in a row, then moves it on, so every
    partition is visited and consumers that start at different partitions stay spread
    over them; a partition where a claim finds nothing is left at once (one claim)."""

    __slots__ = ("partitions", "next", "stay", "run")

    def __init__(self, start: int, partitions: int, stay: int = ROTATION_STAY) -> None:
        self.partitions = partitions
        self.next = start % partitions
        self.stay = stay
        self.run = 0  # buckets found in a row in ``next``

    def round(self) -> list[int]:
        """The partitions to try, in order, until one has a bucket."""
        k = self.partitions
        return [(self.next + i) % k for i in range(k)]

    def start_at(self, part: int) -> None:
        """The next round starts at ``part`` (an idle consumer saw a bucket there)."""
        if part != self.next:
            self.next, self.run = part % self.partitions, 0

    def found(self, part: int) -> None:
        """A claim in ``part`` found a bucket."""
        if part != self.next:
            self.next, self.run = part, 0
        self.run += 1
        if self.run >= self.stay:
            self.next, self.run = (part + 1) % self.partitions, 0


def partition_of_document(doc: dict[str, Any]) -> int:
    """A stored bucket's partition (no field, or null: partition 0)."""
    part = doc.get("part")
    return part if isinstance(part, int) and not isinstance(part, bool) and part > 0 else 0


def partitions_to_fold(found: Iterable[Any], partitions: int) -> dict[int, int | None]:
    """Partition numbers stored by a queue opened with more partitions than now, and
    where their buckets go (``p % partitions``; None: partition 0, stored without the
    field), so no bucket sits where no claim looks."""
    out: dict[int, int | None] = {}
    for p in found:
        if isinstance(p, int) and not isinstance(p, bool) and p >= partitions:
            out[p] = (p % partitions) or None
    return out


#: Change events that can make a bucket claimable: an insert, or a release (an update
#: that sets ``lease`` to null). Claims and state flushes (most updates) are filtered out
#: on the server, so a busy consumer's own writes do not come back to it as events.
WAKEUP_PIPELINE = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert"},
                {
                    "operationType": {"$in": ["update", "replace"]},
                    "updateDescription.updatedFields.lease": {"$type": "null"},
                },
            ]
        }
    },
    {"$project": {"operationType": 1}},
]
#: Fields a claim does not need back (the done bitmap etc. are small; keep them).
CLAIM_PROJECTION = None


def not_leased(dnow: datetime) -> dict[str, Any]:
    """The filter term of a document no consumer holds at ``dnow``: never leased, released,
    or its lease ran out. Every claim, size, next_t and remove() query uses this one."""
    return {"$or": [{"lease": None}, {"lease.until": {"$lte": dnow}}]}


def over_tried(tries: int, max_tries: int | None, *, rolled_back: bool = False) -> str | None:
    """Why an item goes to the dead-letter queue instead of being served (None: it does
    not): it was delivered (or, ``rolled_back``, given back) ``max_tries`` times."""
    if max_tries is None or tries < max_tries:
        return None
    how = "rolled back" if rolled_back else "delivered"
    return f"{how} {tries} times without a commit (max_tries={max_tries})"


def claimable_filter(now: float) -> dict[str, Any]:
    """Buckets a claim could take now, in any partition."""
    dnow = to_datetime(now)
    return {"mature": {"$lte": dnow}, **not_leased(dnow)}


def probe_requests(now: float, start: int) -> list[dict[str, Any]]:
    """The reads (not claims) an idle consumer of a partitioned queue makes to learn
    where a claimable bucket is: the first partition from ``start`` on that has one,
    else from partition 0 (each in partition order, on the index ``{part, mature,
    _id}``). Starting from its own place, not at the oldest bucket, keeps consumers
    spread: if all went to the oldest bucket's partition they would claim together."""
    flt = claimable_filter(now)
    if start == 0:
        return [flt]
    return [{**flt, "part": {"$gte": start}}, flt]


#: The order of the idle probe: the first partition with a claimable bucket.
PROBE_SORT = PART_CLAIM_INDEX


def claim_request(
    now: float, token: ObjectId, owner: str, lease: float, part: int | None = None
) -> tuple[dict, dict]:
    """Filter and update of the single atomic claim of a mature, unleased bucket (of
    partition ``part``; None: an unpartitioned queue)."""
    dnow = to_datetime(now)
    flt = {**part_filter(part), "mature": {"$lte": dnow}, **not_leased(dnow)}
    upd = {
        "$set": {"lease": {"tok": token, "owner": owner, "until": to_datetime(now + lease)}},
        "$inc": {"leases": 1},
    }
    return flt, upd


class Message:
    """One delivered item. ``tries`` counts earlier deliveries that did not end in a commit."""

    __slots__ = ("bucket", "index", "payload", "headers", "tries", "_mature")

    def __init__(
        self, bucket: Any, index: int, payload: Any, headers: dict | None, tries: int, mature: float
    ) -> None:
        self.bucket = bucket
        self.index = index
        self.payload = payload
        self.headers = headers
        self.tries = tries
        self._mature = mature

    @property
    def id(self) -> str:
        return item_id(self.bucket.id, self.index)

    @property
    def mature(self) -> datetime:
        return to_datetime(self._mature)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, tries={self.tries}, payload={self.payload!r})"


# Item states inside a held bucket.
READY, RESERVED, DONE, WAITING = 0, 1, 2, 3


class HeldBucket:
    """A claimed bucket's state in this process, changed in memory and flushed fenced.

    Per item: ``done`` bitmap (committed or dead-lettered), ``tries`` and ``next``
    (not-before time after a rollback), both sparse. ``dirty`` marks a change not
    yet flushed.
    """

    __slots__ = (
        "id", "token", "n", "mature", "done", "live", "tries", "next", "items", "state",
        "outstanding", "waiting", "dirty", "lost", "until", "takeover", "dying", "released",
        "queued", "handed", "handed_at", "held", "origin",
    )  # fmt: skip

    def __init__(self, doc: dict[str, Any], token: ObjectId, now: float, lease: float) -> None:
        """Raises :class:`~bucketq.errors.DamagedBucket` for a document that cannot be
        served (see ``_damage``); nothing else for any document with an ``_id``."""
        damage = bucket_damage(doc)
        if damage is not None:
            raise DamagedBucket(
                f"Bucket {doc['_id']} is damaged: {damage}.", reason=damage, bucket_id=doc["_id"]
            )
        self.id: ObjectId = doc["_id"]
        self.token = token
        self.n: int = doc["n"]
        self.mature = from_datetime(doc["mature"])
        raw_done = doc.get("done")
        self.done = bytearray(raw_done) if raw_done else bytearray((self.n + 7) // 8)
        self.live: int = doc.get("live", self.n)
        self.tries: dict[int, int] = {int(k): v for k, v in (doc.get("tries") or {}).items()}
        self.next: dict[int, float] = {
            int(k): from_datetime(v) for k, v in (doc.get("next") or {}).items()
        }
        self.items: list[dict[str, Any]] | None = None
        self.state: list[int] = []
        self.outstanding = 0  # reserved, not yet committed or rolled back
        self.waiting = 0  # rolled back with a not-before in the future
        self.dirty = False
        self.lost = False
        self.released = False
        self.until = now + lease
        # A claim of a bucket whose lease ran out: its holder died or stalled.
        self.takeover = doc.get("lease") is not None
        self.dying: list[tuple[int, str]] = []  # (index, reason) to dead-letter
        self.queued = 0  # messages waiting in this process's ready queue
        self.handed = 0  # messages handed to reserve() callers so far
        # When each item now RESERVED was handed to a reserve() caller (sparse).
        self.handed_at: dict[int, float] = {}
        # True while this process's queue holds it (reserve() checks this, not a dict
        # lookup by ObjectId, on every item); False once lost, released or deleted.
        self.held = True
        self.origin: Any = None  # the queue object that claimed it (set by the shell)
        self._load(doc["items"], now)

    def _load(self, blob: bytes, now: float) -> None:
        try:
            self.items = decode_items(blob)
            check_items(self.items, self.n, f"Bucket {self.id}")
        except DamagedBucket as exc:
            raise DamagedBucket(str(exc), reason=exc.reason, bucket_id=self.id) from exc
        except DecodeError as exc:
            raise DamagedBucket(
                f"Bucket {self.id} is damaged: {exc}", reason=str(exc), bucket_id=self.id
            ) from exc
        state = [READY] * self.n
        self.state = state
        done = self.done
        if not self.takeover and not self.next and done.count(0) == len(done):
            return  # a fresh bucket (the common case): every item is ready
        for i in range(self.n):
            if done[i >> 3] & (1 << (i & 7)):
                state[i] = DONE
            elif self.next.get(i, 0.0) > now:
                state[i] = WAITING
                self.waiting += 1
            elif self.takeover:
                # The previous holder may have delivered it: count that try.
                self.tries[i] = self.tries.get(i, 0) + 1
                self.dirty = True

    def reclaim(self, doc: dict[str, Any], token: ObjectId, now: float, lease: float) -> bool:
        """This process claimed a bucket it still holds: its lease ran out unrenewed (the
        server was away, or the process stalled). If nobody claimed the bucket in between
        (``doc``, the bucket as it was before the claim, still carries our token), the
        state held here is a superset of the stored one: keep it under the new token and
        return True. Otherwise what is held here is stale: return False."""
        if self.lost or self.released or (doc.get("lease") or {}).get("tok") != self.token:
            return False
        self.token = token
        self.until = now + lease
        self.dirty = True
        return True

    def is_done(self, i: int) -> bool:
        return bool(self.done[i >> 3] & (1 << (i & 7)))

    def ready_messages(self, now: float, max_tries: int | None) -> list[Message]:
        """Messages for every READY item (marks them RESERVED-to-be); over-tried items
        are queued for the dead-letter queue instead."""
        items = self.items
        assert items is not None
        tries = self.tries
        mature = self.mature
        state = self.state
        if not tries and state.count(READY) == len(state):
            # Nothing tried (max_tries >= 1), nothing done: a message per item, no checks.
            out = [Message(self, i, it["p"], it.get("h"), 0, mature) for i, it in enumerate(items)]
            self.state = [RESERVED] * len(state)
            self.outstanding += len(out)
            return out
        out = []
        for i, st in enumerate(state):
            if st != READY:
                continue
            t = tries.get(i, 0)
            why = over_tried(t, max_tries)
            if why is not None:
                self.state[i] = RESERVED
                self.outstanding += 1
                self.dying.append((i, why))
                continue
            it = items[i]
            self.state[i] = RESERVED
            out.append(Message(self, i, it["p"], it.get("h"), t, mature))
        self.outstanding += len(out)
        return out

    def due_waiting(self, now: float, max_tries: int | None) -> list[Message]:
        """Rolled-back items whose not-before has passed, as messages to serve again."""
        if not self.waiting:
            return []
        for i, st in enumerate(self.state):
            if st == WAITING and self.next.get(i, 0.0) <= now:
                self.state[i] = READY
                self.waiting -= 1
        return self.ready_messages(now, max_tries)

    def commit(self, i: int) -> bool:
        if self.lost or self.released or self.state[i] != RESERVED:
            return False
        self.state[i] = DONE
        self.done[i >> 3] |= 1 << (i & 7)
        self.live -= 1
        self.outstanding -= 1
        if self.next:
            self.next.pop(i, None)
        self.handed_at.pop(i, None)
        self.dirty = True
        return True

    def rollback(self, i: int, not_before: float, now: float) -> bool:
        if self.lost or self.released or self.state[i] != RESERVED:
            return False
        self.tries[i] = self.tries.get(i, 0) + 1
        self.outstanding -= 1
        self.handed_at.pop(i, None)
        self.dirty = True
        if not_before > now:
            self.state[i] = WAITING
            self.next[i] = not_before
            self.waiting += 1
        else:
            self.state[i] = READY
            self.next.pop(i, None)
        return True

    def dead(self, i: int) -> None:
        """The item is safely in the dead-letter queue: mark it consumed."""
        if self.state[i] != DONE:
            self.state[i] = DONE
            self.done[i >> 3] |= 1 << (i & 7)
            self.live -= 1
            self.outstanding -= 1
            self.next.pop(i, None)
            self.handed_at.pop(i, None)
            self.dirty = True

    def stalled_items(self, now: float, limit: float) -> list[int]:
        """Items handed out at least ``limit`` seconds ago and neither committed nor
        rolled back since (for auto-rollback): each item on its own clock."""
        dying = {d for d, _ in self.dying}
        return sorted(
            i
            for i, t in self.handed_at.items()
            if now - t >= limit and self.state[i] == RESERVED and i not in dying
        )

    def finished(self) -> bool:
        return self.live <= 0

    def idle(self) -> bool:
        """Nothing of it is being served here: only waiting (future) items are left."""
        return self.outstanding == 0 and READY not in self.state

    def next_mature(self) -> float:
        """When the rest of this bucket may be delivered again (for a release): its
        earliest pending item; an item never rolled back is due at the bucket's mature."""
        return min(
            (self.next.get(i, self.mature) for i, s in enumerate(self.state) if s != DONE),
            default=self.mature,
        )


def fenced_filter(b: HeldBucket) -> dict[str, Any]:
    return {"_id": b.id, "lease.tok": b.token}


def state_write(
    b: HeldBucket, now: float, lease: float, *, release: bool = False
) -> UpdateOne | DeleteOne:
    """The one fenced write that persists a held bucket's state.

    Finished buckets are deleted. Otherwise the done bitmap, live count, tries and
    not-before times are set and the lease renewed; a release clears the lease and
    sets the bucket's mature time to its earliest pending item.
    """
    if b.finished():
        return DeleteOne(fenced_filter(b))
    s: dict[str, Any] = {
        "done": bytes(b.done),
        "live": b.live,
        "tries": {str(k): v for k, v in b.tries.items()},
        "next": {str(k): to_datetime(v) for k, v in b.next.items() if b.state[k] != DONE},
    }
    if release:
        s["lease"] = None
        s["mature"] = to_datetime(b.next_mature())
    else:
        s["lease.until"] = to_datetime(now + lease)
    return UpdateOne(fenced_filter(b), {"$set": s})


def plan_flush(
    buckets: Iterable[HeldBucket], now: float, lease: float, *, release_all: bool = False
) -> tuple[list[tuple[HeldBucket, str, UpdateOne | DeleteOne]], list[tuple[HeldBucket, Exception]]]:
    """What the next state flush writes: for every held bucket that needs a write, its
    kind and its one fenced write, and it is marked clean; and the buckets whose state
    cannot be written (with why), which stay dirty and do not stop the others.

    ``"delete"``: every item is consumed (at the first flush after the last commit).
    ``"release"``: nothing of it is served here any more (only items waiting for a later
    not-before, none queued or dying), or ``release_all`` (drain). ``"update"``: changed
    since the last flush, or its lease is due for renewal. Lost buckets are skipped."""
    plan: list[tuple[HeldBucket, str, UpdateOne | DeleteOne]] = []
    unwritable: list[tuple[HeldBucket, Exception]] = []
    for b in buckets:
        if b.lost:
            continue
        if b.finished():
            kind = "delete"
        elif release_all or (b.idle() and b.queued == 0 and not b.dying):
            kind = "release"
        elif b.dirty or needs_renewal(b, now, lease):
            kind = "update"
        else:
            continue
        try:
            w = state_write(b, now, lease, release=kind == "release")
        except (ValueError, OverflowError, TypeError) as exc:
            unwritable.append((b, exc))
            continue
        plan.append((b, kind, w))
        b.dirty = False
    return plan, unwritable


def renew_write(b: HeldBucket, now: float, lease: float) -> UpdateOne:
    return UpdateOne(fenced_filter(b), {"$set": {"lease.until": to_datetime(now + lease)}})


def needs_renewal(b: HeldBucket, now: float, lease: float) -> bool:
    """Renew once a third of the lease is used, so two renewals can fail before it runs out."""
    return b.until - now < lease * 2 / 3


def serve_until(now: float, lease: float) -> float:
    """Hand out a held bucket's items only while its lease runs past this: a third of the
    lease is left for the commits to be flushed (which renews it) before another consumer
    may take the bucket over. A renewed lease always has more; a claim that came back
    late (a slow server) may have less, and then waits for the flusher's renewal."""
    return now + lease / 3


def dead_letter_headers(queue: str, msg_headers: Any, tries: int, reason: str, now: float) -> dict:
    """The dead letter's headers: the item's own (if they are a dict with string keys;
    anything else stored before headers were checked is kept as its repr) and why."""
    if isinstance(msg_headers, dict) and all(isinstance(k, str) for k in msg_headers):
        h = dict(msg_headers)
    elif msg_headers:
        h = {"x-original-headers": repr(msg_headers)}
    else:
        h = {}
    h.update(
        {
            "x-source-queue": queue,
            "x-dead-at": to_datetime(now),
            "x-tries": tries,
            "x-reason": reason,
        }
    )
    return h


def lost_after_flush(kind: str, token: ObjectId, doc: dict[str, Any] | None) -> bool:
    """Whether a fenced write that did not match lost the lease, judged from the bucket
    as it is now (``kind`` is "update", "release" or "delete")."""
    if doc is None:
        # Gone: our delete landed (or a new owner finished it); an update cannot vanish it.
        return kind == "update"
    lease = doc.get("lease")
    if lease is None:
        return kind != "release"
    return lease.get("tok") != token


def may_retry(exc: BaseException, elapsed: float, budget: float) -> bool:
    """Whether a failed write is tried again: a transient error, within the retry budget."""
    return elapsed < budget and is_transient(exc)


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying with backoff: the server is away or busy, not wrong."""
    from pymongo.errors import ConnectionFailure, OperationFailure, WTimeoutError

    if isinstance(exc, ConnectionFailure | WTimeoutError):
        return True
    if isinstance(exc, OperationFailure):
        return bool(
            exc.has_error_label("RetryableWriteError")
            or exc.has_error_label("TransientTransactionError")
            or exc.code in (6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436)
        )
    return False


# -- introspection queries ------------------------------------------------------------


def ready_filter(now: float) -> dict[str, Any]:
    dnow = to_datetime(now)
    return {"mature": {"$lte": dnow}, **not_leased(dnow)}


def sched_filter(now: float) -> dict[str, Any]:
    dnow = to_datetime(now)
    return {"mature": {"$gt": dnow}, **not_leased(dnow)}


def leased_filter(now: float) -> dict[str, Any]:
    return {"lease.until": {"$gt": to_datetime(now)}}


def live_sum_pipeline(flt: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"$match": flt}, {"$group": {"_id": None, "n": {"$sum": "$live"}}}]


def sum_result(rows: Iterable[dict[str, Any]]) -> int:
    for r in rows:
        return int(r.get("n") or 0)
    return 0


#: What ``Queue.drain()``/``close()`` report: buckets written and items NOT stored by
#: the call (as ``StreamQueue.close()`` reports), items served to reserve() while it
#: drained, buckets released and items released unserved.
DRAIN_REPORT = ("buckets_written", "push_failed", "served", "released_buckets", "released_items")


def new_stats() -> dict[str, int]:
    return dict.fromkeys(
        (
            "pushed", "buckets_written", "insert_retries", "push_failed", "reserved", "committed",
            "rolled_back", "dead_lettered", "lease_losses", "claims", "takeovers", "state_flushes",
            "released", "reclaims", "write_concern_unconfirmed", "dead_letter_failed",
            "state_flush_errors", "quarantined", "loop_errors", "held_on_write",
        ),
        0,
    )  # fmt: skip


# -- the per-element baseline: one document per item ---------------------------------


class ElementRef:
    """What a per-element message points at: its document and the claim's token."""

    __slots__ = ("id", "token", "lost", "released", "batch", "origin")

    def __init__(
        self, id: ObjectId, token: ObjectId | None = None, batch: Any = None, origin: Any = None
    ) -> None:
        self.id = id
        self.token = token
        self.lost = False
        self.released = False
        self.batch = batch
        self.origin = origin


def element_document(payload: Any, headers: dict | None, mature: float) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": ObjectId(),
        "mature": to_datetime(mature),
        "p": payload,
        "tries": 0,
        "lease": None,
    }
    if headers:
        doc["h"] = headers
    return doc


def element_rollback_update(not_before: float) -> dict[str, Any]:
    return {"$set": {"mature": to_datetime(not_before), "lease": None}, "$inc": {"tries": 1}}
