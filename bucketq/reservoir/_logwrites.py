"""The log store's writes: each record stored once, however often it is written.

A write groups records by project and group (``_logbuckets.group_of``) and inserts
each group's records as the next *links* of the group's buckets (numbered in the
bucket's ``_id``): a link another write took already is read and the records go on in
the next one, and a record found in a link already counts as stored. Each bucket's
slot markers are inserted with it (the reads find the seconds that have buckets through
them); a bucket whose insert had no answer is inserted again, as it was, before its
group is written again.

:class:`LogWrites` is the base of :class:`~bucketq.reservoir.LogStore` (``_logstore``):
it holds the collections, and what this process remembers of links and markers.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import bson
from pymongo import ASCENDING
from pymongo.errors import BulkWriteError, PyMongoError

from ..bucket.deadline import Health, bounded
from ..bucket.options import DEFAULT_OP_TIMEOUT
from ..bucket.writes import durable_write_concern
from . import _logbuckets as lb
from ._logbuckets import Packed

log = logging.getLogger("bucketq.reservoir.logs")

#: MongoDB's duplicate-key error code.
DUPLICATE_KEY = 11000
#: The largest document MongoDB stores, and what a bucket keeps for its summary.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
SUMMARY_ROOM = 64 * 1024
#: Rounds of "insert, find links taken, go on" one write makes before it gives up on
#: the records left (other writers keep taking the same group's next link).
WRITE_ROUNDS = 8
#: Links of one group read per query when a write or a record's detail looks them up.
LINKS_PER_READ = 16
#: Groups whose links this process remembers (their record ids), and ids in all.
CHAIN_GROUPS = 256
CHAIN_IDS = 200_000
#: Buckets whose insert had no answer, kept to be inserted again (same ``_id``, same
#: records) before their group is written again: a late landing cannot then add a copy.
DOUBT_MAX = 1024
#: Slot markers this process knows are stored (not inserted again).
KNOWN_MARKERS = 100_000


class _MarkersNotStored(Exception):
    pass


@dataclass(slots=True)
class _Chain:
    """What this process knows of a group's links: the next free one and the record ids
    of the links it wrote or read."""

    next: int = 0
    ids: dict[int, frozenset[str]] = field(default_factory=dict)

    def stored(self, rid: str) -> bool:
        return any(rid in s for s in self.ids.values())

    def size(self) -> int:
        return sum(len(s) for s in self.ids.values())


class LogWrites:
    """What one store holds, and its writes; the arguments are
    :class:`~bucketq.reservoir.LogStore`'s."""

    def __init__(
        self,
        db: Any,
        *,
        name: str = "log_buckets",
        legacy: str = "logs",
        write_concern: Mapping[str, Any] | None = None,
        op_timeout: float | None = DEFAULT_OP_TIMEOUT,
        health: Health | None = None,
        retention_days: float | Callable[[str], float | None] | None = lb.DEFAULT_RETENTION_DAYS,
        max_records: int = lb.DEFAULT_BUCKET_RECORDS,
        max_bytes: int = lb.DEFAULT_BUCKET_BYTES,
    ) -> None:
        wc = durable_write_concern(
            None if write_concern is None else dict(write_concern),
            getattr(db, "write_concern", None),
        )
        self.buckets = db.get_collection(name, codec_options=lb.CODEC, write_concern=wc)
        self.legacy = db.get_collection(legacy, codec_options=lb.CODEC, write_concern=wc)
        self.db = db
        self.op_timeout = op_timeout
        self._health = health
        self._retention = retention_days
        self.max_records = max_records
        self.max_bytes = min(max_bytes, MAX_DOCUMENT_BYTES - SUMMARY_ROOM)
        self._chains: OrderedDict[tuple[str, str], _Chain] = OrderedDict()
        self._doubt: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        #: Markers known stored, and the expiry each is known to have at least.
        self._markers: OrderedDict[str, datetime] = OrderedDict()

    def _bounded(self, what: str | None = None) -> Any:
        return bounded(self.op_timeout, self._health, what)

    def retention(self, project: str) -> float | None:
        """Days ``project``'s records are kept (None: forever)."""
        r = self._retention
        return r(project) if callable(r) else r

    async def create_indexes(self) -> None:
        """The indexes every read relies on; each costs one entry per bucket (``tr``: one
        per trace id of the bucket)."""
        await self.buckets.create_index([("p", ASCENDING), ("t1", ASCENDING)], name="project_t1")
        await self.buckets.create_index([("tr", ASCENDING), ("p", ASCENDING)], name="trace")
        # MongoDB deletes a bucket once its expiry passed (the TTL monitor); :meth:`expire`
        # does it too, for servers without one.
        await self.buckets.create_index([("x", ASCENDING)], name="expire", expireAfterSeconds=0)

    # -- writes ---------------------------------------------------------------------------

    async def write(
        self, docs: Sequence[dict[str, Any]], positions: Sequence[int]
    ) -> list[dict[str, Any]]:
        """Store log documents (``log_document``'s, with a string ``_id`` and a
        ``project_id``); returns ``{"index": <position>, "error": why}`` for each one not
        stored. A record whose ``_id`` is stored already (by an earlier write however
        grouped) counts as stored and is not stored again."""
        errors: dict[int, str] = {}
        groups: dict[tuple[str, str], dict[str, Packed]] = defaultdict(dict)
        aliases: dict[str, list[int]] = defaultdict(list)  # one id twice in one call
        for doc, pos in zip(docs, positions, strict=True):
            doc = dict(doc)
            project = doc.pop("project_id")
            rid = doc["_id"]
            try:
                raw = bson.encode(doc)
            except RecursionError:
                errors[pos] = "the record nests too deeply (or contains itself)"
                continue
            except Exception as exc:  # noqa: BLE001 - any encoding failure is this record's
                errors[pos] = f"the record cannot be stored as BSON: {exc}"
                continue
            if len(raw) > self.max_bytes:
                errors[pos] = (f"the record is {len(raw)} bytes as BSON; a log record may take "
                               f"at most {self.max_bytes}")  # fmt: skip
                continue
            grp = groups[(project, lb.group_of(rid))]
            if rid in grp:
                aliases[rid].append(pos)
            else:
                grp[rid] = Packed(doc, raw, pos)
        failed = await self._store_groups(groups)
        errors.update(failed)
        for rid, extra in aliases.items():
            first = next(g[rid].index for g in groups.values() if rid in g)
            for pos in extra:
                if first in errors:
                    errors[pos] = errors[first]
        return [{"index": i, "error": e} for i, e in sorted(errors.items())]

    async def _store_groups(
        self, groups: dict[tuple[str, str], dict[str, Packed]]
    ) -> dict[int, str]:
        errors: dict[int, str] = {}
        pending = {k: dict(v) for k, v in groups.items() if v}
        for _ in range(WRITE_ROUNDS):
            if not pending:
                return errors
            await self._settle_doubts(list(pending))
            batch: list[tuple[tuple[str, str], int, dict[str, Any], list[Packed]]] = []
            for key, recs in pending.items():
                chain = self._chain(key)
                for rid in [r for r in recs if chain.stored(r)]:
                    del recs[rid]  # stored by an earlier write
                project, group = key
                for link in lb.split_links(list(recs.values()), max_records=self.max_records,
                                           max_bytes=self.max_bytes):  # fmt: skip
                    k = chain.next
                    chain.next += 1
                    days = self.retention(project)
                    expire = lb.MAX_TIME if days is None else lb.expiry(link[-1].time, days)
                    doc = lb.bucket_document(project, group, k, link, expire)
                    batch.append((key, k, doc, link))
            if not batch:
                return errors
            retry: dict[tuple[str, str], dict[str, Packed]] = defaultdict(dict)
            markers = self._new_markers([(key[0], d["t1"], d["x"]) for key, _, d, _ in batch])
            outcome = await self._insert([*markers.values(), *(d for _, _, d, _ in batch)])
            missing = await self._markers_settled(markers, outcome)
            for key, k, doc, link in batch:
                why = outcome.get(doc["_id"])
                if why is None and any(
                    m in missing for m, _, _ in lb.markers_of(key[0], doc["t1"])
                ):
                    # Stored but not findable yet: its records are written again (and
                    # found stored then, which inserts the markers again).
                    why = "unanswered:a slot marker of the bucket was not stored"
                chain = self._chain(key)
                if why is None:
                    chain.ids[k] = frozenset(r.id for r in link)
                elif why == "taken":
                    # Another write has this link: learn the group's links and go on.
                    self._chains.pop(key, None)
                    retry[key].update({r.id: r for r in link})
                elif why.startswith("unanswered:"):
                    self._chains.pop(key, None)
                    self._remember_doubt(key, doc)
                    for r in link:
                        errors[r.index] = why.removeprefix("unanswered:")
                else:
                    for r in link:
                        errors[r.index] = why
            for key in list(retry):
                try:
                    await self._learn(key)
                except (PyMongoError, _MarkersNotStored) as exc:
                    for r in retry.pop(key).values():
                        errors[r.index] = f"{type(exc).__name__}: {exc}"
            pending = dict(retry)
            self._trim_chains()
        for recs in pending.values():
            for r in recs.values():
                errors[r.index] = ("other writes kept taking this record's next bucket; "
                                   "it was not stored (write it again)")  # fmt: skip
        return errors

    def _chain(self, key: tuple[str, str]) -> _Chain:
        chain = self._chains.get(key)
        if chain is None:
            # Never seen here: its links start at 0. If another write made some, the
            # insert of link 0 finds it taken, and the links are read then.
            chain = self._chains[key] = _Chain()
        else:
            self._chains.move_to_end(key)
        return chain

    def _trim_chains(self) -> None:
        while len(self._chains) > CHAIN_GROUPS or (
            len(self._chains) > 1 and sum(c.size() for c in self._chains.values()) > CHAIN_IDS
        ):
            self._chains.popitem(last=False)

    async def _learn(self, key: tuple[str, str]) -> None:
        """Read a group's links (their record ids) until a read finds none, and make sure
        their slot markers are stored (a bucket stored by a write that failed after it
        must be findable once its records count as stored)."""
        project, group = key
        chain = _Chain()
        start = 0
        times = []
        while True:
            ids = [lb.bucket_id(project, group, k) for k in range(start, start + LINKS_PER_READ)]
            with self._bounded():
                found = await self.buckets.find(
                    {"_id": {"$in": ids}}, {"b": 1, "t1": 1, "x": 1}
                ).to_list(None)
            for d in found:
                k = lb.link_of(d["_id"])
                chain.ids[k] = frozenset(lb.record_ids(d))
                chain.next = max(chain.next, k + 1)
                if isinstance(d.get("t1"), datetime):
                    times.append((project, d["t1"], d.get("x") or lb.MAX_TIME))
            if not found:
                break
            start += LINKS_PER_READ
        markers = self._new_markers(times)
        if markers and await self._markers_settled(
            markers, await self._insert(list(markers.values()))
        ):
            raise _MarkersNotStored("slot markers of stored buckets were not stored")
        self._chains[key] = chain

    def _new_markers(
        self, buckets: Sequence[tuple[str, datetime, datetime]]
    ) -> dict[str, dict[str, Any]]:
        """The marker documents these buckets (project, newest record, expiry) need: each
        slot's marker, living at least as long as any bucket of the slot, unless this
        process knows it is stored with such an expiry already."""
        out: dict[str, dict[str, Any]] = {}
        for project, t1, expire in buckets:
            days = self.retention(project)
            for mid, level, n in lb.markers_of(project, t1):
                x = max(lb.marker_expiry(level, n, days), expire)
                known = self._markers.get(mid)
                if known is not None and known >= x:
                    continue
                if mid not in out or out[mid]["x"] < x:
                    out[mid] = {"_id": mid, "x": x}
        return out

    async def _markers_settled(
        self, markers: dict[str, dict[str, Any]], outcome: dict[str, str]
    ) -> set[str]:
        """After an insert of ``markers``: those found there already (another process's,
        or this one's with a shorter life) get their expiry raised (one ``$max`` update
        each, in one command); remember the ones stored; return the ids of the others."""
        from pymongo import UpdateOne

        missing = set()
        taken = []
        for mid, doc in markers.items():
            why = outcome.get(mid)
            if why is None:
                self._markers[mid] = doc["x"]
            elif why == "taken":
                taken.append(doc)
            else:
                missing.add(mid)
        if taken:
            try:
                with self._bounded():
                    await self.buckets.bulk_write(
                        [UpdateOne({"_id": d["_id"]}, {"$max": {"x": d["x"]}}) for d in taken],
                        ordered=False,
                    )
                for d in taken:
                    self._markers[d["_id"]] = d["x"]
            except PyMongoError as exc:
                log.warning("raising the expiry of %d slot markers failed: %s", len(taken), exc)
                missing.update(d["_id"] for d in taken)
        while len(self._markers) > KNOWN_MARKERS:
            self._markers.popitem(last=False)
        return missing

    async def insert_buckets(self, docs: Sequence[dict[str, Any]]) -> None:
        """Insert bucket documents built elsewhere (``bucket_document``: a benchmark
        building a large project, a bulk import) with their slot markers, in one
        unordered insert; raises when any was not stored (one already there is)."""
        markers = self._new_markers([(d["p"], d["t1"], d.get("x") or lb.MAX_TIME) for d in docs])
        outcome = await self._insert([*markers.values(), *docs])
        missing = await self._markers_settled(markers, outcome)
        bad = {k: v for k, v in outcome.items() if v != "taken" and k not in markers}
        bad.update({m: "its expiry could not be raised" for m in missing})
        if bad:
            raise RuntimeError(f"{len(bad)} documents were not stored: {next(iter(bad.values()))}")

    async def _insert(self, docs: list[dict[str, Any]]) -> dict[str, str]:
        """One unordered insert; for each bucket not stored, why: ``"taken"`` (its ``_id``
        exists), ``"unanswered:<why>"`` (no answer: it may have been stored), else the
        server's reason."""
        out: dict[str, str] = {}
        try:
            with self._bounded():
                await self.buckets.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            for e in exc.details.get("writeErrors", []):
                bid = docs[e["index"]]["_id"]
                out[bid] = (
                    "taken"
                    if e.get("code") == DUPLICATE_KEY
                    else str(e.get("errmsg", "write error"))
                )
            if exc.details.get("writeConcernErrors"):
                for d in docs:
                    out.setdefault(d["_id"], "unanswered:the write concern was not confirmed")
        except PyMongoError as exc:
            for d in docs:
                out[d["_id"]] = f"unanswered:{type(exc).__name__}: {exc}"
        return out

    def _remember_doubt(self, key: tuple[str, str], doc: dict[str, Any]) -> None:
        self._doubt.setdefault(key, []).append(doc)
        while sum(len(v) for v in self._doubt.values()) > DOUBT_MAX:
            old, docs = self._doubt.popitem(last=False)
            log.warning("forgetting %d unanswered bucket inserts of group %s", len(docs), old)

    async def _settle_doubts(self, keys: list[tuple[str, str]]) -> None:
        """Insert again, as they were, the buckets of these groups whose insert had no
        answer: stored now, or found there already (a landing later fails on the key)."""
        docs = [d for k in keys for d in self._doubt.get(k, ())]
        if not docs:
            return
        outcome = await self._insert(docs)
        for k in keys:
            left = [
                d
                for d in self._doubt.get(k, ())
                if outcome.get(d["_id"], "").startswith("unanswered:")
            ]
            if left:
                self._doubt[k] = left
            else:
                self._doubt.pop(k, None)
            # Its links are read at its next insert's "taken" (link 0 is there now).
            self._chains.pop(k, None)
