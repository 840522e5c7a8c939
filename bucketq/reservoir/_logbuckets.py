"""Log buckets without I/O: record ids and their groups, packing a group's records into
bucket documents, each bucket's summary, unpacking, and the arithmetic of a page read.

A bucket holds records of one project and one *group*: the records whose ids share the
part before their last ``.`` (:func:`group_of`). Records minted here (:class:`RecordIds`)
share a group per process and second of acceptance, so the records of many requests
accepted together pack into one bucket; an Idempotency-Key request's records are a group
of their own. A group's buckets are its *links* ``0, 1, 2, ...``, and a bucket's ``_id``
names its project, group and link (:func:`bucket_id`). Links are written once, never
changed, and a link is only written after every lower link was seen: so a record that is
in no link seen so far is stored by writing it into the next link, and a write that
finds the link taken (duplicate ``_id``) reads that link and goes on. That is how a
record is stored once however its writes were regrouped (retries, redeliveries, replays)
without an index entry per record.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from bson.codec_options import CodecOptions

#: Records one bucket holds at most.
DEFAULT_BUCKET_RECORDS = 1000
#: Encoded bytes of records one bucket holds at most (a single larger record gets a
#: bucket of its own).
DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024
#: The longest time (between its oldest and newest record) one bucket spans: a page read
#: that continues below a time looks this far above it for buckets that reach below.
BUCKET_SPAN = timedelta(seconds=10)
#: How long records are kept unless a project has a setting of its own (LogTide's default).
DEFAULT_RETENTION_DAYS = 90.0
#: Error messages a bucket's summary counts (the most frequent), and their length.
SUMMARY_ERRORS = 10
SUMMARY_ERROR_CHARS = 200
#: Levels counted as errors in a summary's top errors.
ERROR_LEVELS = frozenset({"error", "fatal", "critical"})

CODEC: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_TIME = datetime(1, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


# -- record ids and groups -----------------------------------------------------------------


_HEX = frozenset("0123456789abcdef")


def group_of(record_id: str) -> str:
    """The group of a record id: the part before its last ``.``; for the ids earlier
    releases minted (32 hex digits: a request's 24 and the record's index) the first 24;
    else the whole id."""
    head, dot, _ = record_id.rpartition(".")
    if dot and head:
        return head
    if len(record_id) == 32 and _HEX.issuperset(record_id):
        return record_id[:24]
    return record_id


class RecordIds:
    """Mints record ids ``<group>.<n>``: the group is this process's token and the
    current second, so every record accepted in one second shares one."""

    def __init__(self) -> None:
        self.renew()
        # A forked child (``bucketq serve --workers``) mints ids of its own.
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.token = "r" + os.urandom(6).hex()
        self._seq = itertools.count()

    def group(self, now: float | None = None) -> str:
        return f"{self.token}{int(time.time() if now is None else now):x}"

    def mint(self, n: int, now: float | None = None) -> list[str]:
        g = self.group(now)
        return [f"{g}.{next(self._seq):x}" for _ in range(n)]

    def own(self, group: str) -> bool:
        return group.startswith(self.token)


#: The ids of this process.
IDS = RecordIds()


def new_ids(n: int) -> list[str]:
    """``n`` fresh record ids of this process's current group (see :class:`RecordIds`)."""
    return IDS.mint(n)


def keyed_ids(digest: str, n: int) -> list[str]:
    """Ids of the ``n`` records of a request known by ``digest`` (an Idempotency-Key's):
    one group, so a retry of the request finds its records' links."""
    return [f"{digest}.{i}" for i in range(n)]


def bucket_id(project: str, group: str, link: int) -> str:
    """``<length of project>.<project>.<link>.<group>``: unambiguous whatever the names hold."""
    return f"{len(project)}.{project}.{link}.{group}"


def link_of(bid: str) -> int:
    n, _, rest = bid.partition(".")
    return int(rest[int(n) + 1 :].partition(".")[0])


# -- packing ------------------------------------------------------------------------------


@dataclass(slots=True)
class Packed:
    """One record ready for a bucket: its document (no ``project_id``), its BSON, and its
    position in the write call."""

    doc: dict[str, Any]
    raw: bytes
    index: int

    @property
    def id(self) -> str:
        rid: str = self.doc["_id"]
        return rid

    @property
    def time(self) -> datetime:
        t: datetime = self.doc["time"]
        return t


def split_links(
    records: Sequence[Packed],
    *,
    max_records: int = DEFAULT_BUCKET_RECORDS,
    max_bytes: int = DEFAULT_BUCKET_BYTES,
    span: timedelta = BUCKET_SPAN,
) -> list[list[Packed]]:
    """A group's records (of one project) in time order, cut into buckets by count,
    bytes and time span."""
    out: list[list[Packed]] = []
    cur: list[Packed] = []
    size = 0
    for r in sorted(records, key=lambda r: (r.time, r.id)):
        if cur and (
            len(cur) >= max_records or size + len(r.raw) > max_bytes or r.time - cur[0].time > span
        ):
            out.append(cur)
            cur, size = [], 0
        cur.append(r)
        size += len(r.raw)
    if cur:
        out.append(cur)
    return out


def _key(d: dict[str, Any]) -> tuple[str, str]:
    return str(d.get("service")), str(d.get("level"))


def summary(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What reads use without unpacking: time range, count, counts by service and level
    (``c``: ``[service, level, n]``), trace ids (``tr``), the most frequent error
    messages (``er``: ``[message, n]``)."""
    t0 = t1 = None
    counts: Counter[tuple[str, str]] = Counter()
    traces: set[str] = set()
    errors: Counter[str] = Counter()
    n = 0
    for d in docs:
        n += 1
        t = d["time"]
        t0 = t if t0 is None or t < t0 else t0
        t1 = t if t1 is None or t > t1 else t1
        counts[_key(d)] += 1
        tr = d.get("trace_id")
        if isinstance(tr, str) and tr:
            traces.add(tr)
        if d.get("level") in ERROR_LEVELS:
            errors[str(d.get("message"))[:SUMMARY_ERROR_CHARS]] += 1
    out: dict[str, Any] = {"t0": t0, "t1": t1, "n": n,
                           "c": [[s, lv, k] for (s, lv), k in sorted(counts.items())]}  # fmt: skip
    if traces:
        out["tr"] = sorted(traces)
    if errors:
        out["er"] = [[m, k] for m, k in errors.most_common(SUMMARY_ERRORS)]
    return out


def bucket_document(
    project: str, group: str, link: int, records: Sequence[Packed], expire: datetime
) -> dict[str, Any]:
    """A bucket's one insert: summary fields first, the records last as one binary of
    concatenated BSON documents (one element for the server, one ``decode_all`` to read),
    ordered by service and level: each ``c`` entry is ``[service, level, n, offset,
    length]`` of its records in the binary, so a read filtered by service or level
    decodes only those."""
    doc: dict[str, Any] = {"_id": bucket_id(project, group, link), "p": project, "g": group,
                           "k": link}  # fmt: skip
    doc.update(summary(r.doc for r in records))
    ordered = sorted(records, key=lambda r: _key(r.doc))
    slices: dict[tuple[str, str], list[int]] = {}
    at = 0
    for r in ordered:
        sl = slices.setdefault(_key(r.doc), [at, 0])
        sl[1] += len(r.raw)
        at += len(r.raw)
    doc["c"] = [[sv, lv, n, *slices[(sv, lv)]] for sv, lv, n in doc["c"]]
    doc["x"] = expire
    doc["w"] = datetime.now(UTC)
    doc["b"] = bson.Binary(b"".join(r.raw for r in ordered))
    return doc


def build_bucket(
    project: str,
    group: str,
    records: Sequence[dict[str, Any]],
    *,
    link: int = 0,
    expire: datetime = MAX_TIME,
) -> dict[str, Any]:
    """A bucket document of ``records`` (each with a string ``_id`` and a ``time``, no
    ``project_id``) as link ``link`` of ``group``: for ``LogStore.insert_buckets``."""
    packed = [Packed(r, bson.encode(r), i) for i, r in enumerate(records)]
    return bucket_document(project, group, link, packed, expire)


def expiry(t1: datetime, retention_days: float, now: datetime | None = None) -> datetime:
    """When a bucket whose newest record is at ``t1``, written at ``now``, is deleted:
    once both are older than the retention (records stamped long ago, a backfill or a
    client's wrong clock, are kept the retention period from their writing)."""
    now = now or datetime.now(UTC)
    try:
        return max(t1, now) + timedelta(days=retention_days)
    except OverflowError:
        return MAX_TIME


def unpack(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored bucket's records, each with the bucket's ``project_id``."""
    blob = doc.get("b")
    if not isinstance(blob, bytes) or not blob:
        return []
    try:
        recs = bson.decode_all(blob, CODEC)
    except Exception:  # noqa: BLE001 - a damaged bucket (another writer's) reads as empty
        return []
    p = doc.get("p")
    for r in recs:
        r["project_id"] = p
    return recs


def unpack_matching(doc: dict[str, Any], flt: LogFilter) -> tuple[list[dict[str, Any]], int]:
    """The records of a stored bucket ``flt`` may keep (the caller checks each with
    ``flt.keeps``), and how many were decoded: only the service and level slices the
    filter names, and with ``q`` (ASCII, over ASCII records) only the records whose bytes
    hold it in any case."""
    blob = doc.get("b")
    if not isinstance(blob, bytes) or not blob:
        return [], 0
    parts: list[bytes] = [blob]
    if flt.service is not None or flt.level is not None:
        try:
            parts = [
                blob[int(e[3]) : int(e[3]) + int(e[4])]
                for e in doc.get("c") or ()
                if takes(flt.service, e[0]) and takes(flt.level, e[1])
            ]
        except (IndexError, TypeError, ValueError):  # no slices (another writer): all of it
            parts = [blob]
    if flt.q and flt.q.isascii():
        needle = flt.q.lower().encode()
        parts = [p if FOLDS_TO_ASCII.search(p) else b"".join(_holding(p, needle)) for p in parts]
    recs: list[dict[str, Any]] = []
    for part in parts:
        if part:
            try:
                recs.extend(bson.decode_all(part, CODEC))
            except Exception:  # noqa: BLE001 - a damaged bucket (another writer's) reads as empty
                return [], 0
    p = doc.get("p")
    for r in recs:
        r["project_id"] = p
    return recs, len(recs)


#: The characters outside ASCII whose case folding holds ASCII letters (``ß`` -> ``ss``,
#: the Kelvin sign -> ``k``, ligatures ...), as UTF-8: a bucket holding one is decoded
#: whole for ``q``, since a byte search in ASCII case would miss what they fold to.
FOLDING_TO_ASCII = (0xDF, 0x130, 0x149, 0x17F, 0x1F0, 0x1E96, 0x1E97, 0x1E98, 0x1E99, 0x1E9A,
                    0x1E9E, 0x212A, 0xFB00, 0xFB01, 0xFB02, 0xFB03, 0xFB04, 0xFB05, 0xFB06)  # fmt: skip
FOLDS_TO_ASCII = re.compile(b"|".join(re.escape(chr(c).encode()) for c in FOLDING_TO_ASCII))


def _holding(part: bytes, needle: bytes) -> list[bytes]:
    """The BSON documents of ``part`` whose bytes hold ``needle`` (ASCII, any case)."""
    low = part.lower()
    out: list[bytes] = []
    at = low.find(needle)
    start = 0
    while at >= 0:
        while start < len(part):  # the document holding ``at``
            size = int.from_bytes(part[start : start + 4], "little")
            if size <= 0:
                return [part]  # not documents after all: let the decoder say so
            if at < start + size:
                out.append(part[start : start + size])
                start += size
                break
            start += size
        at = low.find(needle, start)
    return out


def record_ids(doc: dict[str, Any]) -> set[str]:
    return {str(r.get("_id")) for r in unpack(doc)}


# -- reads --------------------------------------------------------------------------------


def sort_key(rec: dict[str, Any]) -> tuple[datetime, str]:
    """Newest first is this key, descending: time, then id."""
    t = rec.get("time")
    if not isinstance(t, datetime):
        t = MIN_TIME
    elif t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t, str(rec.get("_id"))


def takes(want: str | frozenset[str] | None, value: Any) -> bool:
    """Whether a filter's ``want`` (None: any; a value; or a set of values) keeps ``value``."""
    if want is None:
        return True
    return value == want if isinstance(want, str) else value in want


@dataclass(frozen=True, slots=True)
class LogFilter:
    """What a page, a count or an aggregation keeps: ``since <= time < until``, the
    service and level (one, or any of a set), ``q`` a case-insensitive substring of the
    message, and (pages) records before ``before`` (time, id) in newest-first order."""

    service: str | frozenset[str] | None = None
    level: str | frozenset[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None
    before: tuple[datetime, str] | None = None

    @property
    def upper(self) -> datetime | None:
        """Records are older than this (exclusive), when anything bounds them above."""
        times = [t for t in (self.until, self.before[0] if self.before else None) if t]
        return min(times) if times else None

    def bucket_may_match(self, doc: dict[str, Any]) -> bool:
        """From the summary alone: could the bucket hold a record this filter keeps?"""
        t0, t1 = _aware(doc.get("t0")), _aware(doc.get("t1"))
        if isinstance(t1, datetime) and self.since is not None and t1 < self.since:
            return False
        upper = self.upper
        if isinstance(t0, datetime) and upper is not None:
            if t0 > upper or (t0 == upper and self.before is None):
                return False
        if self.service is None and self.level is None:
            return True
        try:
            return any(
                e[2] and takes(self.service, e[0]) and takes(self.level, e[1])
                for e in doc.get("c") or ()
            )
        except (IndexError, TypeError, ValueError):  # a summary not of this store's making
            return True

    def matching_count(self, doc: dict[str, Any]) -> int:
        """Records of the bucket this filter's service and level keep (its summary)."""
        try:
            return sum(
                int(e[2])
                for e in doc.get("c") or ()
                if takes(self.service, e[0]) and takes(self.level, e[1])
            )
        except (IndexError, TypeError, ValueError):
            return 0

    def keeps(self, rec: dict[str, Any]) -> bool:
        if not (takes(self.service, rec.get("service")) and takes(self.level, rec.get("level"))):
            return False
        t, rid = sort_key(rec)
        if self.since is not None and t < self.since:
            return False
        if self.until is not None and t >= self.until:
            return False
        if self.before is not None and (t, rid) >= self.before:
            return False
        if self.q:
            msg = rec.get("message")
            if not isinstance(msg, str) or self.q.casefold() not in msg.casefold():
                return False
        return True


# -- slots: where in time a project has buckets -------------------------------------------

#: A slot of level ``L`` spans ``FANOUT ** L`` seconds; level 0 is one second, the top
#: level about 2,177 years (five top slots cover the years 1-9999). A bucket's insert comes with a marker document for each level's
#: slot that holds its newest record, so a read finds the newest seconds that have
#: buckets with point lookups of at most ``FANOUT`` ``_id`` s a level, however large or
#: quiet the project, instead of an index range whose size it cannot know beforehand.
FANOUT = 64
TOP_LEVEL = 6


def seconds(t: datetime) -> int:
    """Whole seconds since the epoch (floor), for any time of years 1-9999."""
    return (_aware(t) - _EPOCH) // timedelta(seconds=1)


def at_second(n: int) -> datetime:
    try:
        return _EPOCH + timedelta(seconds=n)
    except OverflowError:
        return MIN_TIME if n < 0 else MAX_TIME


def slot_size(level: int) -> int:
    return int(FANOUT**level)


def marker_id(project: str, level: int, n: int) -> str:
    """A slot marker's ``_id`` (``~`` keeps it apart from bucket ids, whose third part is
    a link number)."""
    return f"{len(project)}.{project}.~{level}.{n}"


def markers_of(project: str, t1: datetime) -> list[tuple[str, int, int]]:
    """``(marker id, level, slot)`` of every level's slot holding time ``t1``."""
    s = seconds(t1)
    out = []
    for lv in range(TOP_LEVEL + 1):
        n = s // slot_size(lv)
        out.append((marker_id(project, lv, n), lv, n))
    return out


def marker_expiry(level: int, n: int, retention_days: float | None) -> datetime:
    """A marker lives as long as any bucket of its slot may."""
    if retention_days is None:
        return MAX_TIME
    return expiry(at_second((n + 1) * slot_size(level)), retention_days)


def _aware(t: Any) -> Any:
    return t.replace(tzinfo=UTC) if isinstance(t, datetime) and t.tzinfo is None else t


def plus(t: datetime, d: timedelta) -> datetime:
    try:
        return t + d
    except OverflowError:
        return MAX_TIME


@dataclass(slots=True)
class PageBudget:
    """What one page read may do before it answers with what it has and a cursor that
    goes on: buckets read (their summaries), records unpacked."""

    buckets: int = 256
    records: int = 100_000
    read_buckets: int = 0
    read_records: int = 0

    @property
    def spent(self) -> bool:
        return self.read_buckets >= self.buckets or self.read_records >= self.records


@dataclass(slots=True)
class LogPage:
    """One page, newest first. ``next_before``: the (time, id) the next page starts below
    (None: no record older than this page's matches). ``complete`` is False when the
    page ended on its read budget rather than on its size: it may hold fewer records
    than asked, and ``next_before`` goes on where the read stopped."""

    records: list[dict[str, Any]]
    next_before: tuple[datetime, str] | None
    complete: bool = True
    buckets_read: int = 0
    records_unpacked: int = 0


@dataclass(slots=True)
class LogCount:
    """A count of records, ``exact`` or a lower bound (the read stopped at its budget)."""

    count: int
    exact: bool
    buckets_read: int = 0


@dataclass(slots=True)
class LogAggregate:
    """Records per interval by level, the services and the error messages with the most
    records, from bucket summaries. A bucket's records count in the interval of its
    newest record (a bucket spans at most :data:`BUCKET_SPAN`). ``complete`` is False when
    the read stopped at its budget (the figures then cover ``[covered_from, until)``)."""

    interval: timedelta
    series: list[tuple[datetime, dict[str, int]]]
    services: list[tuple[str, int]]
    errors: list[tuple[str, int]]
    total: int
    complete: bool
    covered_from: datetime | None
    buckets_read: int = 0
    levels: dict[str, int] = field(default_factory=dict)


def interval_start(t: datetime, interval: timedelta) -> datetime:
    step = interval.total_seconds()
    secs = (t - _EPOCH).total_seconds()
    return _EPOCH + timedelta(seconds=(secs // step) * step)
