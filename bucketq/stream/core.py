"""Ordered stream mode's decisions, with no I/O: options, documents, the in-order scan,
hole and stage timeouts, and the acknowledgement rules.

Layout (one collection per stream plus a metadata collection ``<name>.meta``)::

    <name>        {_id: seq, n, items: <binary>, w: <writer id>, at}   a written bucket
                  {_id: seq, hole: true, at}                         a closed hole (tombstone)
                  {_id: seq, ..., stg: {j, t}}                       a staged bucket (Spark writes),
                                                                     invisible until published
    <name>.meta   {_id: "stream", next, epoch, acked, incarnation}

``next`` is the last sequence number handed out (the counter), ``acked`` the last one
acknowledged, ``epoch`` the current consumer's fencing token, ``incarnation`` the id the
document was made with: a stream dropped and made again (or made on a fresh store) numbers
from the start again, and only its incarnation tells a position in the old one (a Spark
checkpoint's offset, a sink's stored seq) from the same number in the new one. A bucket's ``_id`` is its
sequence number, so the unique ``_id`` index is what makes a tombstone and a late real
bucket exclusive: whichever lands first wins, and the loser knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar

from bson import ObjectId

from .. import _validate as v
from ..bucket.codec import decode_items
from ..bucket.damage import check_items
from ..bucket.options import DEFAULT_POLL_INTERVAL, CommonOptions, QueueOptions
from ..bucket.packing import OpenBucket, Packer
from ..bucket.times import to_datetime
from ..errors import AckOutOfOrder, ConfigurationError, DamagedBucket, DecodeError

__all__ = [
    "AckOutOfOrder",
    "DEFAULT_HOLE_GRACE",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_STAGE_TIMEOUT",
    "DEFAULT_TOMBSTONE_TTL",
    "META_ID",
    "OPTIONS",
    "StreamBatch",
    "StreamOptions",
    "options_table",
]

#: How long a consumer waits on a sequence number that was handed out but whose bucket
#: is not there, before it closes the hole with a tombstone (seconds).
DEFAULT_HOLE_GRACE = 10.0
#: How long a staged (not yet published) bucket may block the stream before it is closed
#: like a hole. Spark publishes staged buckets when its job commits; this is the bound
#: for a driver that died in between.
DEFAULT_STAGE_TIMEOUT = 600.0
#: How long tombstones are kept after they are acknowledged, so a producer retrying an
#: insert for a closed number still collides with them and takes a new number.
DEFAULT_TOMBSTONE_TTL = 600.0
#: Buckets fetched per read by a consumer.
DEFAULT_READ_AHEAD = 8
MAX_READ_AHEAD = 10_000

#: Change events that can let a waiting consumer read on: an insert (a bucket, or a
#: tombstone that closes a hole), or an update that removes ``stg`` (staged buckets
#: published, or closed as holes). Acknowledged buckets' deletes are filtered out on
#: the server, and each event is cut down to its operation type.
WAKEUP_PIPELINE: list[dict[str, Any]] = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert"},
                {"operationType": "update", "updateDescription.removedFields": "stg"},
            ]
        }
    },
    {"$project": {"operationType": 1}},
]

META_ID = "stream"
META_SUFFIX = ".meta"
#: A staged bucket's ``mature`` in a bucket queue: never claimable until published.
STAGED_MATURE = datetime(3000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class StreamOptions(CommonOptions):
    """Every stream option with its default (seconds for times, bytes for sizes)."""

    KIND: ClassVar[str] = "stream"

    hole_grace: float = v.option(
        DEFAULT_HOLE_GRACE, v.number, open_lo=True,
        help="how long a consumer waits on a sequence number handed out but not written "
        "before it closes the hole with a tombstone",
    )  # fmt: skip
    stage_timeout: float = v.option(
        DEFAULT_STAGE_TIMEOUT, v.number, open_lo=True,
        help="how long a staged (not yet published) bucket, e.g. of a Spark job whose "
        "driver died, may block the stream before it is closed like a hole",
    )  # fmt: skip
    tombstone_ttl: float = v.option(
        DEFAULT_TOMBSTONE_TTL, v.number, open_lo=True,
        help="how long acknowledged tombstones are kept, so a producer still retrying an "
        "insert meets one (at least `retry_budget`)",
    )  # fmt: skip
    read_ahead: int = v.option(
        DEFAULT_READ_AHEAD, v.count, lo=1, hi=MAX_READ_AHEAD, unit="buckets",
        help="buckets fetched per read by a consumer",
    )  # fmt: skip
    #: The queue options of the stream's producer (packing and pushing).
    packer: QueueOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        CommonOptions.__post_init__(self)
        if self.tombstone_ttl < self.retry_budget:
            raise ConfigurationError(
                f"tombstone_ttl ({self.tombstone_ttl} s) must be at least retry_budget "
                f"({self.retry_budget} s), so a producer still retrying an insert meets the tombstone."
            )
        shared = {f.name: getattr(self, f.name) for f in fields(CommonOptions)}
        object.__setattr__(self, "packer", QueueOptions(**shared))

    @classmethod
    def build(cls, **options: Any) -> StreamOptions:
        if options.get("partitions", 1) != 1:
            raise ConfigurationError(
                f"partitions={options['partitions']!r}: a stream queue has one partition (its "
                "items are delivered in one order, to one consumer). For many consumers use "
                "a bucket queue, Queue(db, name, partitions=K)."
            )
        options.pop("partitions", None)
        return super(StreamOptions, cls).build(**options)


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """One bucket of a stream: ``seq, items = batch`` unpacks like a tuple.

    ``items`` are the payloads in push order, ``headers`` their headers (None where an
    item had none), ``written`` when the bucket was stored.
    """

    seq: int
    items: list[Any]
    headers: list[dict[str, Any] | None]
    written: datetime | None = None

    def __iter__(self):
        return iter((self.seq, self.items))

    def __len__(self) -> int:
        return 2


# -- documents -----------------------------------------------------------------------


def meta_name(name: str) -> str:
    return name + META_SUFFIX


def meta_filter() -> dict[str, Any]:
    return {"_id": META_ID}


def new_incarnation() -> str:
    """A stream's incarnation id (an ObjectId's text: it says when it was made)."""
    return str(ObjectId())


def meta_init() -> dict[str, Any]:
    init = {"next": 0, "epoch": 0, "acked": 0, "incarnation": new_incarnation()}
    return {"$setOnInsert": init}


def incarnation_request() -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) that gives a stream made before incarnation ids its own, once."""
    return {"_id": META_ID, "incarnation": {"$exists": False}}, {
        "$set": {"incarnation": new_incarnation()}
    }


def allocate_update(k: int) -> dict[str, Any]:
    """Take ``k`` consecutive sequence numbers (the counter document exists)."""
    return {"$inc": {"next": k}}


def allocated(meta: dict[str, Any], k: int) -> range:
    """The numbers an :func:`allocate_update` returning ``meta`` (after the update) took."""
    last = int(meta["next"])
    return range(last - k + 1, last + 1)


def open_update() -> dict[str, Any]:
    """Bump the epoch: every older consumer is fenced from this write on."""
    return {"$inc": {"epoch": 1}}


def ack_filter(epoch: int) -> dict[str, Any]:
    return {"_id": META_ID, "epoch": epoch}


def ack_update(seq: int) -> dict[str, Any]:
    return {"$max": {"acked": seq}}


def delete_acked_filter(seq: int, now: float, ttl: float) -> dict[str, Any]:
    """Acknowledged buckets; tombstones only once they are older than ``ttl``."""
    return {
        "_id": {"$lte": seq},
        "$or": [{"hole": {"$exists": False}}, {"at": {"$lt": to_datetime(now - ttl)}}],
    }


def bucket_document(
    seq: int, items: list[bytes], writer: ObjectId, now: float, stage: dict[str, Any] | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": seq,
        "n": len(items),
        "items": b"".join(items),
        "w": writer,
        "at": to_datetime(now),
    }
    if stage is not None:
        doc["stg"] = stage
    return doc


def pack(packer: QueueOptions, items: Iterable[bytes], now: float) -> Iterator[list[bytes]]:
    """Encoded items in order, grouped into buckets as a producer's ``push`` groups them
    (by ``bucket_max_size`` and ``bucket_max_bytes``; the queue's :class:`Packer`), for a
    writer that has all its items at hand (a Spark task). Raises
    :class:`~bucketq.errors.PayloadTooLarge` for an item no bucket can hold."""
    p = Packer(packer, lambda: None)
    for it in items:
        for ob in p.add(it, now, now)[2]:
            yield ob.items
    for ob in p.take_all():
        yield ob.items


def sealed(items: list[bytes], now: float) -> OpenBucket:
    """A bucket of already packed items, ready to be written."""
    ob = OpenBucket(None, now, None)
    ob.items = items
    ob.nbytes = sum(map(len, items))
    ob.mature = now
    return ob


def tombstone(seq: int, now: float) -> dict[str, Any]:
    return {"_id": seq, "hole": True, "at": to_datetime(now)}


def close_staged(
    seq: int, stage: dict[str, Any], now: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn a staged bucket that timed out into a tombstone (only if still staged as seen)."""
    return {"_id": seq, "stg": stage}, staged_to_tombstone(now)


def staged_to_tombstone(now: float) -> dict[str, Any]:
    """The update that turns staged buckets into tombstones (timed out, or the attempts
    a Spark commit does not publish): their numbers must not stay open."""
    return {
        "$set": {"hole": True, "at": to_datetime(now)},
        "$unset": {"stg": "", "items": "", "n": "", "w": ""},
    }


def publish_update() -> dict[str, Any]:
    """Make staged stream buckets visible to the consumer."""
    return {"$unset": {"stg": ""}}


def fenced_message(name: str, epoch: int, current: int | None) -> str:
    return (
        f"This consumer of stream {name!r} (epoch {epoch}) was fenced: a newer consumer "
        f"opened (epoch {current}). It may no longer read or acknowledge; stop it, and let the "
        "newer consumer go on."
    )


def is_tombstone(doc: dict[str, Any]) -> bool:
    return bool(doc.get("hole"))


def is_staged(doc: dict[str, Any]) -> bool:
    return "stg" in doc


def bucket_damage(doc: dict[str, Any]) -> str | None:
    """Why a stream bucket (not a tombstone, not staged) cannot be delivered (None: its
    fields are sound; the items binary is checked when decoded)."""
    n = doc.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return f"its item count n is {n!r}, not a whole number >= 1"
    if not isinstance(doc.get("items"), bytes):
        return f"its items field is {type(doc.get('items')).__name__}, not binary"
    at = doc.get("at")
    if at is not None and not isinstance(at, datetime):
        return f"its at field is {type(at).__name__}, not a date"
    return None


def damaged_message(name: str, seq: int, reason: str) -> str:
    return (
        f"Stream {name!r}: the bucket at seq {seq} is damaged ({reason}); it is not delivered "
        f"and the consumer does not go past it. Call consumer.quarantine({seq}) to set it aside "
        "in the quarantine collection and go on (`bucketq quarantine list|requeue|purge "
        "--stream` then shows it, re-queues what can be recovered at the end of the stream, "
        "or removes it)."
    )


def to_batch(doc: dict[str, Any], name: str = "") -> StreamBatch:
    """The bucket as delivered; raises :class:`DamagedBucket` (naming its seq) if it
    cannot be."""
    seq = int(doc["_id"])
    reason = bucket_damage(doc)
    if reason is None:
        try:
            items = decode_items(doc["items"])
            check_items(items, doc["n"], f"seq {seq}")
        except DamagedBucket as exc:
            reason = exc.reason
        except DecodeError as exc:
            reason = str(exc)
    if reason is not None:
        raise DamagedBucket(damaged_message(name, seq, reason), reason=reason, seq=seq)
    return StreamBatch(seq, [it["p"] for it in items], [it.get("h") for it in items], doc.get("at"))


def quarantined_tombstone(now: float) -> dict[str, Any]:
    """Turn a damaged bucket (kept in quarantine) into a tombstone the consumer passes."""
    return {
        "$set": {"hole": True, "at": to_datetime(now), "quarantined": True},
        "$unset": {"items": "", "n": "", "w": "", "stg": ""},
    }


# -- the in-order scan -----------------------------------------------------------------


@dataclass(slots=True)
class Scan:
    """What a read of ``_id > cursor`` (sorted) means for an in-order reader.

    ``ready`` are the documents that follow the cursor without a gap (buckets and
    tombstones); ``blocked`` is the next number when the run stopped before the end of
    what was read or of what was handed out: ``("missing", seq, None)`` for a hole,
    ``("staged", seq, doc)`` for a staged bucket.
    """

    ready: list[dict[str, Any]]
    blocked: tuple[str, int, dict[str, Any] | None] | None


def scan(cursor: int, docs: list[dict[str, Any]], allocated_through: int) -> Scan:
    ready: list[dict[str, Any]] = []
    expect = cursor + 1
    for d in docs:
        seq = d["_id"]
        if not isinstance(seq, int):
            continue
        if seq < expect:
            continue
        if seq > expect:
            return Scan(ready, ("missing", expect, None))
        if is_staged(d):
            return Scan(ready, ("staged", expect, d))
        ready.append(d)
        expect += 1
    if expect <= allocated_through:
        return Scan(ready, ("missing", expect, None))
    return Scan(ready, None)


class HoleClock:
    """When a blocked number has waited long enough to be closed.

    Time is this reader's own monotonic clock from the first time it saw the number
    blocked, so no clocks need to agree: a hole is closed at least ``grace`` after it
    was handed out, and a staged bucket at least ``stage_timeout`` after it was seen.
    """

    def __init__(self, grace: float, stage_timeout: float) -> None:
        self.grace = grace
        self.stage_timeout = stage_timeout
        self.seen: dict[tuple[str, int], float] = {}

    def due_in(self, kind: str, seq: int, now: float) -> float:
        """Seconds until the blocked number may be closed (<= 0: close it now)."""
        first = self.seen.setdefault((kind, seq), now)
        limit = self.grace if kind == "missing" else self.stage_timeout
        return first + limit - now

    def passed(self, cursor: int) -> None:
        for key in [k for k in self.seen if k[1] <= cursor]:
            del self.seen[key]


def ack_target(delivered: list[int], acked: int, seq: int, *, through: bool) -> int:
    """Check an ack against the delivered, unacknowledged numbers (oldest first) and
    return how many of them it acknowledges."""
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise AckOutOfOrder(f"seq must be a sequence number (an int); got {seq!r}.")
    if seq <= acked:
        return 0
    if not delivered:
        raise AckOutOfOrder(
            f"Nothing is delivered and unacknowledged, so seq {seq} cannot be acknowledged "
            f"(acknowledged through {acked}). Call next_batch() first."
        )
    if not through:
        if seq != delivered[0]:
            raise AckOutOfOrder(
                f"ack({seq}) is out of order: the next unacknowledged seq is {delivered[0]}. "
                "Acknowledge in order, or use ack_through(seq) to acknowledge several."
            )
        return 1
    if seq not in delivered:
        raise AckOutOfOrder(
            f"ack_through({seq}) names a seq that was not delivered; delivered and unacknowledged: "
            f"{delivered[0]}..{delivered[-1]}."
        )
    return delivered.index(seq) + 1


def check_resume(name: str, after: int | None, meta: dict[str, Any]) -> int:
    """Where a consumer starts: after ``after`` if given, else after the last ack."""
    acked = int(meta.get("acked", 0))
    if after is None:
        return acked
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise ConfigurationError(f"after must be a sequence number >= 0; got {after!r}.")
    if after < acked:
        raise ConfigurationError(
            f"Cannot resume stream {name!r} after seq {after}: it is acknowledged through {acked} and "
            "those buckets are deleted. Resume after a seq >= the last acknowledged one (a sink that "
            "stores its seq atomically with its data never falls behind the acknowledgements)."
        )
    if after > int(meta.get("next", 0)):
        raise ConfigurationError(
            f"Cannot resume stream {name!r} after seq {after}: only {meta.get('next', 0)} were ever "
            "handed out. Is this the right stream?"
        )
    return after


def idle_nap(idle: int, wait: float, poll_interval: float) -> float:
    """How long an idle ``next_batch`` waits before it reads again (a new bucket in this
    process, or a change event, wakes it sooner): doubling from 40 ms with each read
    that found nothing, at most ``poll_interval`` and at most ``wait`` (the time until a
    blocked number may be closed)."""
    return min(wait, 0.02 * 2 ** min(idle, 10), poll_interval)


#: The keyword options of ``StreamQueue(db, name, **options)`` that a bucket queue does
#: not have (the packing options are the queue's: ``bucket.options.OPTIONS``).
OPTIONS: tuple[v.Setting, ...] = tuple(
    s for s in v.settings(StreamOptions, keywords=True)
    if s.field not in {f.name for f in fields(CommonOptions)}
)  # fmt: skip


def options_table() -> str:
    """The stream's own options as the Markdown table in ``docs/stream.md``."""
    return v.settings_table(OPTIONS, first="Option", keywords=True)
