"""The log store's reads, each costing what its page costs: a page, a record, a trace,
a count, an aggregation.

Every query here is bounded on the embedded server too, which reads every document an
index range (or the whole collection, without one) selects before it sorts and limits:
so no query leans on ``sort`` + ``limit``. A page finds the newest seconds that have
buckets through slot markers (point lookups by ``_id``, see ``_logbuckets``) and reads the
buckets of a few of those seconds at a time (an index range on ``p, t1`` that holds just
them); a trace reads the buckets whose summary names it (an index on ``tr``); a record's
detail reads its group's links by ``_id``.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _logbuckets as lb
from ._logbuckets import LogAggregate, LogCount, LogFilter, LogPage, PageBudget
from ._logwrites import LINKS_PER_READ, LogWrites

#: Marked seconds one window reads at most: one find's reply stays small, so other
#: projects' writes get the store between a large read's finds.
WINDOW_SECONDS = 16
#: Buckets a count reads at most (then it is a lower bound, and says so), and an
#: aggregation (then it covers the newest part of its range, and says how far).
COUNT_BUCKETS = 1000
AGGREGATE_BUCKETS = 5000
#: Summary fields a read that does not unpack asks for.
SUMMARY_FIELDS = {"b": 0}


class LogReads(LogWrites):
    """The reads of one store: :meth:`page`, :meth:`record`, :meth:`trace`,
    :meth:`count`, :meth:`aggregate`, each bounded by its page or its budget."""

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
