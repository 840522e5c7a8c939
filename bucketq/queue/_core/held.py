"""A claimed bucket's state in this process (``HeldBucket``) and the state flush:
which fenced write each held bucket needs, lease renewal, and a lost lease.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bson import ObjectId
from pymongo import DeleteOne, UpdateOne

from ...bucket.codec import decode_items
from ...bucket.damage import bucket_damage, check_items
from ...bucket.document import done_bitmap, is_consumed, mark_consumed
from ...bucket.times import from_datetime, to_datetime
from ...errors import DamagedBucket, DecodeError
from .messages import Message
from .redelivery import over_tried

#: Seconds the flusher, woken by a finished bucket (or an item to dead-letter), waits
#: for more before it writes: buckets a consumer finishes within it share one delete
#: command (a consumer of 1,024-item buckets finishes one every few milliseconds). A
#: commit with ``flush=True``, drain() and close() write at once.
FLUSH_GATHER = 0.02

#: Items a consumer is served from memory between two turns it gives the event loop
#: (async: such a reserve() never waits, and the fetcher's claim ahead, its request and
#: then its answer, would wait until the consumer ran dry). A claim starting makes the
#: next item give one at once, so its request goes out then.
SERVE_TURN = 64

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
        self.done = done_bitmap(self.n, doc.get("done"))
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
            if is_consumed(done, i):
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
        return is_consumed(self.done, i)

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
        mark_consumed(self.done, i)
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
            mark_consumed(self.done, i)
            self.live -= 1
            self.outstanding -= 1
            self.next.pop(i, None)
            self.handed_at.pop(i, None)
            self.dirty = True

    def touch(self, i: int, now: float) -> bool:
        """Restart the stall clock of item ``i`` (see ``stalled_items``): True if it is
        handed out here and neither committed nor rolled back."""
        if self.lost or not self.held or self.state[i] != RESERVED or i not in self.handed_at:
            return False
        self.handed_at[i] = now
        return True

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
    buckets: Iterable[HeldBucket],
    now: float,
    lease: float,
    *,
    release_all: bool = False,
    release_unhanded: bool = False,
) -> tuple[list[tuple[HeldBucket, str, UpdateOne | DeleteOne]], list[tuple[HeldBucket, Exception]]]:
    """What the next state flush writes: for every held bucket that needs a write, its
    kind and its one fenced write, and it is marked clean; and the buckets whose state
    cannot be written (with why), which stay dirty and do not stop the others.

    ``"delete"``: every item is consumed (at the first flush after the last commit).
    ``"release"``: nothing of it is served here any more (only items waiting for a later
    not-before, none queued or dying), or ``release_all`` (drain), or
    ``release_unhanded`` (paused with release) and none of its items is handed out: its
    queued items are served to nobody here. ``"update"``: changed since the last flush,
    or its lease is due for renewal. Lost buckets are skipped."""
    plan: list[tuple[HeldBucket, str, UpdateOne | DeleteOne]] = []
    unwritable: list[tuple[HeldBucket, Exception]] = []
    for b in buckets:
        if b.lost:
            continue
        if b.finished():
            kind = "delete"
        elif (
            release_all
            or (b.idle() and b.queued == 0 and not b.dying)
            or (release_unhanded and b.outstanding == b.queued and not b.dying)
        ):
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


def needs_renewal(b: HeldBucket, now: float, lease: float) -> bool:
    """Renew once a third of the lease is used, so two renewals can fail before it runs out."""
    return b.until - now < lease * 2 / 3


def serve_until(now: float, lease: float) -> float:
    """Hand out a held bucket's items only while its lease runs past this: a third of the
    lease is left for the commits to be flushed (which renews it) before another consumer
    may take the bucket over. A renewed lease always has more; a claim that came back
    late (a slow server) may have less, and then waits for the flusher's renewal."""
    return now + lease / 3


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
