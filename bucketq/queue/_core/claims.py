"""Claims: the claim's filter, update and indexes, leases no one holds, partitions
and a consumer's rotation over them, and the change events that wake a consumer.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bson import ObjectId

from ...bucket.document import CLAIM_SORT, not_leased
from ...bucket.times import to_datetime

#: The claim index of a partitioned queue: a claim is one equality on ``part`` and then
#: the same range and order as ``CLAIM_SORT``. (``mature_id`` stays: next_t() and the
#: queue-wide counts look across partitions.)
PART_CLAIM_INDEX = [("part", 1), ("mature", 1), ("_id", 1)]


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
#: move costing a read; more: a partition waits longer for a consumer busy elsewhere).
ROTATION_STAY = 32


class Rotation:
    """The partition one consumer claims in next. A claim that finds a bucket keeps the
    consumer on that partition for up to ``stay`` buckets in a row, then moves it on, so
    every partition is visited and consumers that start at different partitions stay
    spread over them. Where a claim finds nothing, the consumer does not try the other
    partitions in turn (on a server without a claim index each empty claim scans): a
    read (``probe_requests``) tells it where a claimable bucket is, and it claims there
    (``start_at``). With ``find_then_update`` that read is the map read
    (``map_pipeline``), which counts the claimable buckets of every partition
    (``mapped``): the consumer picks one of them at random, weighted by those counts
    (``pick``), so consumers leaving a partition at once spread over the others in
    proportion to their backlog instead of all moving to the same one, and picks again
    from the map, without reading, when its partition runs dry (``dry``)."""

    __slots__ = ("partitions", "next", "stay", "run", "known", "_random")

    def __init__(self, start: int, partitions: int, stay: int = ROTATION_STAY) -> None:
        self.partitions = partitions
        self.next = start % partitions
        self.stay = stay
        self.run = 0  # buckets found in a row in ``next``
        #: Claimable buckets per partition at the last map read, less the partitions
        #: found dry since (None: no map).
        self.known: dict[int, int] | None = None
        self._random = random.Random()

    def start_at(self, part: int) -> None:
        """Claim in ``part`` next (a read saw a claimable bucket there)."""
        part %= self.partitions
        if part != self.next:
            self.next, self.run = part, 0

    def found(self, part: int) -> None:
        """A claim in ``part`` found a bucket. After ``stay`` in a row the consumer moves
        to the next partition the map knows, else to the next one (the map is then
        stale: a claim that finds nothing there reads it again)."""
        self.start_at(part)
        self.run += 1
        if self.run >= self.stay:
            others = sorted(p for p in self.known or () if p != part)
            if others:
                other = next((p for p in others if p > part), others[0])
            else:
                other, self.known = (part + 1) % self.partitions, None
            self.next, self.run = other, 0

    def mapped(self, counts: dict[int, int]) -> None:
        """A map read counted ``counts[p]`` claimable buckets in partition ``p``."""
        self.known = {p % self.partitions: n for p, n in counts.items() if n > 0}

    def dry(self, part: int) -> None:
        """A claim in ``part`` found nothing."""
        if self.known is not None:
            self.known.pop(part, None)

    def pick(self) -> int | None:
        """A partition the map knows claimable buckets in, at random, weighted by their
        number; None if it knows none."""
        if not self.known:
            return None
        parts = list(self.known)
        return self._random.choices(parts, weights=[self.known[p] for p in parts])[0]


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
WAKEUP_PIPELINE: list[dict[str, Any]] = [
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


def probe_requests(now: float, start: int) -> list[dict[str, Any]]:
    """The reads (not claims) a consumer of a partitioned queue claiming with
    ``find_and_modify`` makes to learn where a claimable bucket is, when it is idle or
    its partition has none (``find_then_update`` reads the map: ``map_pipeline``): the
    first partition
    from ``start`` on that has one, else the first from partition 0 (each read in
    partition order, on the index ``{part, mature, _id}``; the lease term without a
    ``$or``, as the candidate find's, which the embedded server would plan as a scan).
    The first read is from partition 0: when it finds nothing (an idle consumer's usual
    poll) or a partition from ``start`` on, it is the answer, in one read; the second
    (from ``start`` on) is read only when the first found a partition before ``start``
    (``probe_done``). Starting from its own place, not at the oldest bucket, keeps
    consumers spread: if all went to the oldest bucket's partition they would claim
    together."""
    flt = candidate_request(now, None)
    if start == 0:
        return [flt]
    return [flt, {**flt, "part": {"$gte": start}}]


def probe_done(found_part: int | None, start: int) -> bool:
    """Whether a probe read that found ``found_part`` (None: nothing) answers the probe
    from ``start``: nothing claimable anywhere, or a partition from ``start`` on."""
    return found_part is None or found_part >= start


def map_pipeline(now: float) -> list[dict[str, Any]]:
    """The map read of ``find_then_update``: an aggregation counting the buckets a claim
    could take at ``now`` in every partition (``$group`` on ``part``: null is partition
    0, stored without the field). The embedded server scans for it as it does for
    ``probe_requests``' reads (no partition equality), but it is one read where those
    are one or two, it returns no buckets, and it names every partition, so a consumer
    whose partition runs dry claims in another one named without reading again."""
    return [
        {"$match": candidate_request(now, None)},
        {"$group": {"_id": "$part", "n": {"$sum": 1}}},
    ]


def mapped_counts(groups: Iterable[dict[str, Any]]) -> dict[int, int]:
    """The map read's groups as claimable buckets per partition."""
    out: dict[int, int] = {}
    for g in groups:
        part = partition_of_document({"part": g.get("_id")})
        out[part] = out.get(part, 0) + int(g.get("n") or 0)
    return out


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


# -- the two claim forms ----------------------------------------------------------------
#
# ``find_and_modify``: one ``findAndModify`` (``claim_request``) finds the first
# claimable bucket in claim order and leases it, atomically. On mongod that is one
# index walk. The embedded server (SecantusDB) plans ``findAndModify`` as a scan of
# every stored bucket whatever the filter (each decoded, matched and sorted), and so it
# plans any filter with a top-level ``$or`` (the ``not_leased`` term) the same way.
# An ``update`` on ``{_id, lease: null}`` is narrowed by the index, and a ``find`` of one
# partition's head does less work with the lease term written as ``unleased`` below
# than with the ``$or``.
#
# ``find_then_update``: a ``find`` of the first ``CANDIDATES`` claimable buckets of the
# partition in claim order (newest first for a consumer that lost a race there:
# ``Candidates``; ``candidate_request``: no ``$or``, so the server narrows by the
# index), whole documents; the consumer tries them in that order, each with one
# conditional ``update_one`` (``conditional_claim``) that matches only while the bucket
# is exactly as read (``FENCE_FIELDS`` and its ``lease``: every writer of a bucket, a
# claim, a holder's flush or release, ``remove()``, an operator's requeue, changes one
# of them) and writes the same lease as ``claim_request``. The first that matches is
# ours, and the document read is the bucket as it was before the claim, as
# ``findAndModify`` returns it; 0 matched means someone changed or took it since the
# find: try the next. Candidates not tried stay for the next claims in that partition,
# so one find serves up to ``CANDIDATES`` claims.

#: Claim forms: ``auto`` picks by server (``claim_form``).
CLAIM_FORMS = ("auto", "find_and_modify", "find_then_update")

#: Buckets a candidate find returns at most, kept for the next claims.
CANDIDATES = 8

#: Candidate finds one claim makes at most (each after a race lost) before it gives up
#: on that partition for now.
CLAIM_FINDS = 3

#: The stored fields a conditional claim requires unchanged since its find, besides
#: ``lease`` (what a served bucket is made of; ``items`` is written once, at insert).
FENCE_FIELDS = ("leases", "live", "done", "mature", "tries", "next")


#: The order of the candidate find of a consumer that lost a race in its partition
#: since its last find: newest first (``CLAIM_SORT`` reversed).
NEWEST_FIRST = [(field, -1) for field, _ in CLAIM_SORT]


#: Where in its partition a consumer's candidate finds read (``Candidates.end``): the
#: oldest buckets (claim order), the newest, or a window past the oldest
#: (``MIDDLE_SKIP``).
OLDEST, NEWEST, MIDDLE = 0, 1, 2

#: The window of a find from the middle starts this many buckets past the oldest (a
#: fresh draw at each find).
MIDDLE_SKIP = (CANDIDATES, 4 * CANDIDATES)


class Candidates:
    """The buckets of one partition a candidate find read and this consumer has not
    tried yet, in the order it tries them, and where in the partition it reads
    (``end``). A consumer alone in a partition reads and takes them in claim order
    (the oldest first). A lost race (the conditional claim matched nothing: another
    consumer took that bucket since the find) means another consumer claims from
    that end of the partition: the list is stale, so it is dropped, and the loser's
    next finds read elsewhere while it stays in the partition: the newest buckets
    first after a race lost at the oldest, a window from ``MIDDLE_SKIP`` buckets past
    the oldest after one lost at the newest (a third consumer), the oldest again after
    one lost there. So two consumers of one partition claim from its two ends, each
    from its own list, a third from its middle, and they meet (each meeting costs an
    update) when the partition is nearly empty. A consumer goes back to claim order
    when a find comes back short (the partition is nearly empty: the ends meet anyway)
    and in every partition it moves to, so claim order holds for a consumer alone in
    its partition (and one that lost a race there reads elsewhere in it until the
    rotation moves it on: at most ``ROTATION_STAY`` buckets)."""

    __slots__ = ("part", "docs", "end", "_random")

    def __init__(self) -> None:
        self.part: int | None = None
        self.docs: deque[dict[str, Any]] = deque()
        self.end = OLDEST
        self._random = random.Random()

    def of(self, part: int | None) -> deque[dict[str, Any]]:
        """The candidates left for a claim in ``part`` (none if they are another's)."""
        if part != self.part:
            self.part, self.end = part, OLDEST
            self.docs.clear()
        return self.docs

    def order(self) -> list[tuple[str, int]]:
        """The sort of the next candidate find: newest first, else claim order."""
        return NEWEST_FIRST if self.end == NEWEST else CLAIM_SORT

    def skip(self) -> int:
        """How many buckets past the oldest the next candidate find starts (0 but from
        the middle)."""
        return self._random.randrange(*MIDDLE_SKIP) if self.end == MIDDLE else 0

    def fill(self, docs: Iterable[dict[str, Any]]) -> None:
        """A fresh find of this partition read ``docs`` (in ``order()``, from ``skip()``,
        at most ``CANDIDATES``)."""
        self.docs.clear()
        self.docs.extend(docs)
        if len(self.docs) < CANDIDATES:
            self.end = OLDEST

    def take(self) -> dict[str, Any]:
        """The next candidate to try (there is one)."""
        return self.docs.popleft()

    def lost(self) -> None:
        """The candidate just taken was claimed or changed by someone else: another
        consumer claims from where this list was read. It is stale: the next find
        reads elsewhere (``end``)."""
        self.end = (NEWEST, MIDDLE, OLDEST)[self.end]  # the next place along
        self.docs.clear()


def claim_form(option: str, build_info: dict[str, Any]) -> str:
    """The claim form a queue uses: the ``claim`` option unless ``auto``; ``auto`` picks
    ``find_then_update`` on the embedded server (its ``buildInfo`` names
    ``secantusVersion``), whose ``findAndModify`` scans every bucket, and the single
    ``findAndModify`` elsewhere (mongod walks the claim index for it)."""
    if option != "auto":
        return option
    return "find_then_update" if "secantusVersion" in build_info else "find_and_modify"


def unleased(dnow: datetime) -> dict[str, Any]:
    """``not_leased`` without a ``$or``: no lease (so no ``lease.until``), or one that ran
    out by ``dnow``."""
    return {"lease.until": {"$not": {"$gt": dnow}}}


def candidate_request(now: float, part: int | None) -> dict[str, Any]:
    """The filter of a candidate find: buckets of partition ``part`` (None: any) a claim
    could take at ``now``, to be sorted by ``CLAIM_SORT``."""
    dnow = to_datetime(now)
    return {**part_filter(part), "mature": {"$lte": dnow}, **unleased(dnow)}


def conditional_claim(
    doc: dict[str, Any], token: ObjectId, owner: str, now: float, lease: float
) -> tuple[dict, dict]:
    """Filter and update of the claim of one candidate ``doc`` (as the find read it): it
    matches only while the stored bucket still has the lease and ``FENCE_FIELDS`` read
    (a missing field matches as missing), all equalities, so the server finds it by
    ``_id``. It was claimable when read and is unchanged, so it is claimable now."""
    flt: dict[str, Any] = {"_id": doc["_id"], "lease": doc.get("lease")}
    for f in FENCE_FIELDS:
        flt[f] = doc.get(f)
    _, upd = claim_request(now, token, owner, lease)
    return flt, upd
