"""The bucket document's fields every queue kind shares: item ids, the done bitmap, a
queue object's member id and the partition a key picks."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from bson import ObjectId

from ..errors import ConfigurationError

#: The order buckets are served in: the earliest mature first, then the oldest.
CLAIM_SORT = [("mature", 1), ("_id", 1)]


def not_leased(dnow: datetime) -> dict[str, Any]:
    """The filter term of a document no consumer holds at ``dnow``: never leased, released,
    or its lease ran out. Every claim, size, next_t and remove() query uses this one."""
    return {"$or": [{"lease": None}, {"lease.until": {"$lte": dnow}}]}


def member_id(owner: str) -> str:
    """A queue object's own id (its producer's partition and its consumer's first one
    come from it): the owner (host:pid) and a fresh ObjectId, unique across objects."""
    return f"{owner}/{ObjectId()}"


#: The collection that numbers the members of partitioned queues: one document per
#: queue, ``{_id: <queue name>, n: <members numbered so far>}``.
MEMBERS = "bucketq.members"

#: The partition of a push without a key while its queue object does not know its
#: member number yet: the producer puts such a bucket in its own partition when it
#: writes it (``member_request``).
OWN_PARTITION = -1


def member_request(queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Filter and update of the ``findAndModify`` (no upsert, document after) that gives
    a queue object of partitioned queue ``queue`` its member number: members of a queue
    are numbered 0, 1, 2, ... and member ``m`` takes partition ``m % partitions``, so
    objects opened together spread over distinct partitions (a hash of their ids, the
    fallback, leaves one partition in three without a producer at 4 of 4). Where it
    finds no document, ``MEMBERS_START`` (an upsert) makes one and it is sent again: an
    upserting ``findAndModify`` would number two first members the same on the embedded
    server, which answers both with no document."""
    return {"_id": queue}, {"$inc": {"n": 1}}


#: The update (upsert) that starts a queue's numbering where it has none.
MEMBERS_START = {"$setOnInsert": {"n": 0}}


def member_partition(after: dict[str, Any] | None, partitions: int) -> int | None:
    """The partition of the member numbered by the update that left ``after``; None
    where that is no numbering (no document, or ``n`` not a whole number)."""
    n = None if after is None else after.get("n")
    if not isinstance(n, int) or isinstance(n, bool):
        return None
    return (n - 1) % partitions


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


def is_consumed(done: bytes | bytearray | None, index: int) -> bool:
    """Whether item ``index`` is marked consumed in a bucket's ``done`` bitmap (bit
    ``index & 7`` of byte ``index >> 3``; a missing or short bitmap marks nothing)."""
    return (
        done is not None and index >> 3 < len(done) and bool(done[index >> 3] & (1 << (index & 7)))
    )


def done_bytes(n: int) -> int:
    """The length of the ``done`` bitmap of a bucket of ``n`` items: one bit per item."""
    return (n + 7) // 8


def done_bitmap(n: int, stored: bytes | None = None) -> bytearray:
    """A bucket's ``done`` bitmap of ``n`` items to change in memory: a copy of the
    ``stored`` one, else one with no item consumed (:func:`done_bytes` long)."""
    return bytearray(stored) if stored else bytearray(done_bytes(n))


def mark_consumed(done: bytearray, index: int) -> None:
    """Mark item ``index`` consumed in a ``done`` bitmap (see :func:`done_bitmap`)."""
    done[index >> 3] |= 1 << (index & 7)


def open_items(doc: dict[str, Any], n: int) -> list[int]:
    """The indexes of a stored bucket's ``n`` items that are not consumed yet."""
    done = doc.get("done")
    if not done:
        return list(range(n))
    return [i for i in range(n) if not is_consumed(done, i)]


def item_tries(doc: dict[str, Any], indexes: list[int]) -> list[int]:
    """How often each of a stored bucket's items at ``indexes`` was tried (rolled back)."""
    tries = doc.get("tries")
    if not tries:
        return [0] * len(indexes)
    return [int(tries.get(str(i), 0)) for i in indexes]


def item_mature(doc: dict[str, Any], indexes: list[int]) -> list[datetime | None]:
    """When each of a stored bucket's items at ``indexes`` is due: its own ``next`` time
    (set by a rollback with a delay), else the bucket's ``mature``."""
    mature = doc.get("mature")
    nxt = doc.get("next")
    if not nxt:
        return [mature] * len(indexes)
    return [nxt.get(str(i), mature) for i in indexes]


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
