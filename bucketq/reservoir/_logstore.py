"""The log store: log records packed into bucket documents with summaries (the rules are
in ``_logbuckets``), the writes that store each record once, and the reads that cost
what their page costs.

Every query here is bounded on the embedded server too, which reads every document an
index range (or the whole collection, without one) selects before it sorts and limits:
so no query leans on ``sort`` + ``limit``. A page finds the newest seconds that have
buckets through slot markers (point lookups by ``_id``, see ``_logbuckets``) and reads the
buckets of a few of those seconds at a time (an index range on ``p, t1`` that holds just
them); a trace reads the buckets whose summary names it (an index on ``tr``); a record's
detail reads its group's links by ``_id``. Retention deletes whole buckets.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from pymongo import ASCENDING, WriteConcern
from pymongo.errors import BulkWriteError, PyMongoError

from ..bucket.deadline import Health, bounded
from ..bucket.options import DEFAULT_OP_TIMEOUT
from ..bucket.writes import durable_write_concern
from . import _logbuckets as lb
from ._logbuckets import LogAggregate, LogCount, LogFilter, LogPage, Packed, PageBudget

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
#: Marked seconds one window reads at most: one find's reply stays small, so other
#: projects' writes get the store between a large read's finds.
WINDOW_SECONDS = 16
#: Buckets a count reads at most (then it is a lower bound, and says so), and an
#: aggregation (then it covers the newest part of its range, and says how far).
COUNT_BUCKETS = 1000
AGGREGATE_BUCKETS = 5000
#: Slot markers this process knows are stored (not inserted again).
KNOWN_MARKERS = 100_000
#: Summary fields a read that does not unpack asks for.
SUMMARY_FIELDS = {"b": 0}


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


class LogStore:
    """Log records of every project in one collection of bucket documents (``name``).

    Writes: :meth:`write`. Reads, each bounded by its page or its budget: :meth:`page`,
    :meth:`record`, :meth:`trace`, :meth:`count`, :meth:`aggregate`. Retention:
    :meth:`expire`. A store written by an earlier release (one document per record in
    ``legacy``) is converted by :meth:`convert_legacy`.

    ``write_concern`` is every bucket insert's (default: the database's with ``j: true``
    added, ``bucketq.bucket.writes.durable_write_concern``: acknowledged once in the
    journal). ``retention_days`` is how long a project's records are kept
    (a number for every project, or a function of the project; None: kept forever).
    """

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

    # -- reads ----------------------------------------------------------------------------

    async def _find(self, flt: dict[str, Any], projection: Any = None) -> list[dict[str, Any]]:
        with self._bounded("reading logs"):
            return await self.buckets.find(flt, projection).to_list(None)

    async def _probe(self, project: str, level: int, slots: Sequence[int]) -> list[int]:
        """Which of these slots of ``level`` have a marker, newest first."""
        ids = {lb.marker_id(project, level, n): n for n in slots}
        with self._bounded("reading logs"):
            found = await self.buckets.find({"_id": {"$in": list(ids)}}, {"_id": 1}).to_list(None)
        return sorted((ids[d["_id"]] for d in found if d["_id"] in ids), reverse=True)

    async def _marked_seconds(self, project: str, bound: int, floor: int) -> list[int]:
        """The marked seconds (newest first) of the newest group of ``FANOUT`` seconds that
        has any before second ``bound`` (exclusive) and from ``floor`` on; [] when none.
        First the seconds beside ``bound`` (one probe: a read going on through dense data),
        else from the top level down, the newest marked slot's children each time: a
        probe of at most ``FANOUT`` ids a level."""
        if bound - 1 <= lb.seconds(datetime.now(UTC)) + 86400:
            top = bound - 1
            first = max(top - top % lb.FANOUT, floor)
            if top >= first:
                found = await self._probe(project, 0, range(top, first - 1, -1))
                if found:
                    return found
        return await self._newest(project, lb.TOP_LEVEL, bound, floor, None)

    async def _newest(
        self, project: str, level: int, bound: int, floor: int, parent: int | None
    ) -> list[int]:
        size = lb.slot_size(level)
        top = (bound - 1) // size
        low = floor // size
        if parent is not None:
            top = min(top, parent * lb.FANOUT + lb.FANOUT - 1)
            low = max(low, parent * lb.FANOUT)
        if top < low:
            return []
        found = await self._probe(project, level, range(top, low - 1, -1))
        if level == 0:
            return [x for x in found if floor <= x < bound]
        for n in found:  # the newest first; an older one only if its children are gone
            seconds = await self._newest(project, level - 1, min(bound, (n + 1) * size), floor, n)
            if seconds:
                return seconds
        return []

    async def _windows(
        self, project: str, flt: LogFilter, projection: Any, budget: PageBudget, *, first: int = 1
    ) -> Any:
        """The buckets of ``project`` that may hold records ``flt`` keeps, newest first, a
        window at a time: yields ``(lo, buckets)``; every bucket whose newest record is at
        or after ``lo`` has been yielded by then. A window holds the buckets of ``first``
        marked seconds, each next one of twice as many (up to :data:`WINDOW_SECONDS`): a
        page that its first second fills reads no more, a rare filter widens quickly."""
        upper = flt.upper
        hi = (
            lb.MAX_TIME
            if upper is None
            else lb.plus(upper, lb.BUCKET_SPAN + timedelta(microseconds=1))
        )
        floor = lb.seconds(flt.since) if flt.since is not None else lb.seconds(lb.MIN_TIME)
        bound = lb.seconds(hi) + 1
        pending: list[int] = []
        k = first
        while True:
            if not pending:
                pending = await self._marked_seconds(project, bound, floor)
                if not pending:
                    return
            take, pending = pending[:k], pending[k:]
            k = min(2 * k, WINDOW_SECONDS)
            lo = lb.at_second(take[-1])
            top = min(hi, lb.at_second(take[0] + 1))
            found = await self._find({"p": project, "t1": {"$gte": lo, "$lt": top}}, projection)
            budget.read_buckets += len(found)
            yield lo, [d for d in found if flt.bucket_may_match(d)]
            hi, bound = lo, take[-1]

    async def page(
        self,
        project: str,
        flt: LogFilter | None = None,
        *,
        limit: int = 100,
        max_bytes: int = 4 * 1024 * 1024,
        budget: PageBudget | None = None,
    ) -> LogPage:
        """The newest ``limit`` records of ``project`` that ``flt`` keeps (newest first),
        no more than ``max_bytes`` of them (the first whatever its size). Reads the
        buckets of one time window after another until the page is certain; stops early,
        with ``complete=False`` and a ``next_before`` that goes on, when ``budget`` is
        spent (a rare filter or ``q`` over a large project)."""
        flt = flt or LogFilter()
        budget = budget or PageBudget()
        found: list[tuple[tuple[datetime, str], int, dict[str, Any]]] = []
        boundary: datetime | None = None
        reached_floor = True
        async for lo, buckets in self._windows(project, flt, None, budget):
            boundary = lo
            for d in buckets:
                recs, decoded = lb.unpack_matching(d, flt)
                budget.read_records += decoded
                each = len(d.get("b") or b"") // max(1, int(d.get("n") or 1))
                found.extend((lb.sort_key(r), each, r) for r in recs if flt.keeps(r))
                # A bucket's unpacking at a time: the event loop serves others (the
                # ingest of every project) between buckets, not after the whole page.
                await asyncio.sleep(0)
            if sum(1 for key, _, _ in found if key[0] >= lo) > limit or budget.spent:
                reached_floor = False
                break
        found.sort(key=lambda x: x[0], reverse=True)
        certain = (
            found
            if reached_floor or boundary is None
            else [x for x in found if x[0][0] >= boundary]
        )
        page: list[dict[str, Any]] = []
        size = 0
        for _key, each, r in certain:
            if len(page) == limit or (page and size + each > max_bytes):
                break
            page.append(r)
            size += each
        nxt: tuple[datetime, str] | None = None
        complete = True
        if len(page) < len(certain):  # cut by its size (or bytes): the next page follows it
            nxt = lb.sort_key(page[-1])
        elif not reached_floor and boundary is not None:
            # The budget ran out before the page filled: go on below what was read.
            nxt = (boundary, "")
            complete = False
        return LogPage(page, nxt, complete, budget.read_buckets, budget.read_records)

    async def record(self, project: str | None, record_id: str) -> dict[str, Any] | None:
        """The record ``record_id`` (of ``project``; None: any, through the old layout
        only), reading its group's links by ``_id``, at most ``LINKS_PER_READ`` a query."""
        if project is not None:
            group = lb.group_of(record_id)
            start = 0
            while start < 64 * LINKS_PER_READ:
                ids = [
                    lb.bucket_id(project, group, k) for k in range(start, start + LINKS_PER_READ)
                ]
                found = await self._find({"_id": {"$in": ids}})
                for d in found:
                    for r in lb.unpack(d):
                        if r.get("_id") == record_id:
                            return r
                if not found:
                    break
                start += LINKS_PER_READ
        with self._bounded("reading a log record"):
            doc: dict[str, Any] | None = await self.legacy.find_one({"_id": record_id})
        if doc is not None and project is not None and doc.get("project_id") != project:
            return None
        return doc

    async def trace(
        self, project: str, trace_id: str, *, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """The records of ``project`` with ``trace_id``, oldest first, at most ``limit``:
        the buckets whose summary names the trace (the ``tr`` index), unpacked."""
        found = await self._find({"tr": trace_id, "p": project})
        recs = [r for d in found for r in lb.unpack(d) if r.get("trace_id") == trace_id]
        recs.sort(key=lb.sort_key)
        return recs[:limit]

    async def count(
        self, project: str, flt: LogFilter | None = None, *, budget: PageBudget | None = None
    ) -> LogCount:
        """How many records of ``project`` ``flt`` keeps: from bucket summaries, unpacking
        only the buckets at the time range's edges (and every bucket read, with ``q``).
        ``exact`` is False when ``budget`` (default :data:`COUNT_BUCKETS` buckets) ran out
        first: the count is then a lower bound."""
        flt = flt or LogFilter()
        budget = budget or PageBudget(buckets=COUNT_BUCKETS, records=200_000)
        n = 0
        exact = True
        projection = None if flt.q else SUMMARY_FIELDS
        async for _lo, buckets in self._windows(
            project, flt, projection, budget, first=WINDOW_SECONDS
        ):
            for d in buckets:
                t0, t1 = d.get("t0"), d.get("t1")
                inside = (flt.since is None or (isinstance(t0, datetime) and t0 >= flt.since)) and (
                    flt.upper is None or (isinstance(t1, datetime) and t1 < flt.upper)
                )
                if inside and not flt.q:
                    n += flt.matching_count(d)
                    continue
                if "b" not in d:
                    d = (await self._find({"_id": d["_id"]}))[0] if d.get("_id") else d
                recs, decoded = lb.unpack_matching(d, flt)
                budget.read_records += decoded
                n += sum(1 for r in recs if flt.keeps(r))
                await asyncio.sleep(0)
            if budget.spent:
                exact = False
                break
        return LogCount(n, exact, budget.read_buckets)

    async def aggregate(
        self,
        project: str,
        *,
        since: datetime,
        until: datetime,
        interval: timedelta,
        service: str | None = None,
        top: int = 10,
        budget: PageBudget | None = None,
    ) -> LogAggregate:
        """Records of ``project`` between ``since`` and ``until`` per ``interval`` by level,
        the ``top`` services and error messages: from summaries, nothing unpacked."""
        if interval <= timedelta(0):
            raise ValueError("interval must be positive")
        budget = budget or PageBudget(buckets=AGGREGATE_BUCKETS)
        flt = LogFilter(service=service, since=since, until=until)
        series: dict[datetime, Counter[str]] = defaultdict(Counter)
        services: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        levels: Counter[str] = Counter()
        complete = True
        covered: datetime | None = since
        async for lo, buckets in self._windows(
            project, flt, SUMMARY_FIELDS, budget, first=WINDOW_SECONDS
        ):
            for d in buckets:
                t1 = d.get("t1")
                if not isinstance(t1, datetime) or not since <= t1 < until:
                    continue
                slot = lb.interval_start(t1, interval)
                for e in d.get("c") or ():
                    s, lv, k = e[0], e[1], int(e[2])
                    services[s] += k
                    if service in (None, s):
                        series[slot][lv] += k
                        levels[lv] += k
                if service is None or any(e[0] == service for e in d.get("c") or ()):
                    for m, k in d.get("er") or ():
                        errors[m] += k
            if budget.spent:
                complete = False
                covered = max(lo, since)
                break
        return LogAggregate(
            interval=interval,
            series=sorted((t, dict(c)) for t, c in series.items()),
            services=services.most_common(top),
            errors=errors.most_common(top),
            total=sum(levels.values()),
            complete=complete,
            covered_from=covered,
            buckets_read=budget.read_buckets,
            levels=dict(levels),
        )

    # -- retention ------------------------------------------------------------------------

    async def expire(self, now: datetime | None = None, projects: Sequence[str] = ()) -> int:
        """Delete the buckets whose expiry passed (whole buckets: nothing per record), and
        for each of ``projects`` the buckets whose newest record and writing are older
        than its retention now (a shortened setting applies to buckets already written).
        Returns the buckets deleted."""
        now = now or datetime.now(UTC)
        deleted = 0
        with self._bounded("deleting expired logs"):
            res = await self.buckets.delete_many({"x": {"$lt": now}})
            deleted += res.deleted_count
            for p in projects:
                days = self.retention(p)
                if days is None:
                    continue
                cutoff = now - timedelta(days=days)
                res = await self.buckets.delete_many(
                    {"p": p, "t1": {"$lt": cutoff}, "w": {"$lt": cutoff}}
                )
                deleted += res.deleted_count
        return deleted

    # -- the old layout -------------------------------------------------------------------

    async def legacy_left(self) -> int:
        """Records still in the old layout (one document per record)."""
        with self._bounded("counting old-layout log records"):
            return int(await self.legacy.estimated_document_count())

    async def convert_legacy(
        self, *, batch: int = 1000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Move the records of the old layout into buckets, ``batch`` at a time, each
        keeping its id; calls ``progress(converted, left)`` after each batch and returns
        the records this call converted. Stopped anywhere, it resumes: a batch written
        again is stored once (its records' groups find their links), and its documents
        are deleted from the old collection only once their buckets are stored."""
        state = self.db.get_collection(
            self.buckets.name + ".converted", write_concern=WriteConcern(j=True)
        )
        done = 0
        while True:
            with self._bounded("converting old-layout log records"):
                docs = await self.legacy.find({}).limit(batch).to_list(None)
            if not docs:
                return done
            records: list[dict[str, Any]] = []
            positions: list[int] = []
            bad: list[Any] = []
            for d in docs:
                rec = dict(d)
                rec["_id"] = str(d["_id"])
                if not isinstance(rec.get("project_id"), str) or not rec["project_id"]:
                    bad.append(d["_id"])
                    continue
                if not isinstance(rec.get("time"), datetime):
                    rec["time"] = lb.MIN_TIME
                positions.append(len(records))
                records.append(rec)
            errors = await self.write(records, positions)
            if errors:
                raise RuntimeError(
                    f"Converting old-layout log records stopped: record {records[errors[0]['index']]['_id']!r} "
                    f"was not stored ({errors[0]['error']}). Run the conversion again; what it "
                    "stored stays stored once."
                )
            if bad:
                log.warning(
                    "%d old-layout documents without a project were left in %s",
                    len(bad),
                    self.legacy.name,
                )
            with self._bounded("converting old-layout log records"):
                await self.legacy.delete_many(
                    {"_id": {"$in": [d["_id"] for d in docs if d["_id"] not in bad]}}
                )
                mark = await state.find_one_and_update(
                    {"_id": "legacy"},
                    {"$inc": {"converted": len(records)}},
                    upsert=True,
                    return_document=True,
                )
            done += len(records)
            if progress is not None:
                progress(int(mark["converted"]), await self.legacy_left())
            if bad and len(bad) == len(docs):
                return done
