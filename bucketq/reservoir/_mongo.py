"""The MongoDB storage engine for logs, spans and metrics (pymongo ``AsyncDatabase``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import bson
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import BulkWriteError, PyMongoError

from ..bucket.concurrency import STARTUP_DONE, AsyncStartup, startup_key
from ..bucket.deadline import Health, StartupBusy, bounded
from ..bucket.options import DEFAULT_OP_TIMEOUT
from ..bucket.writes import durable_write_concern
from ..errors import ConfigurationError
from . import _logbuckets as lb
from ._logbuckets import LogFilter
from ._logstore import LogStore
from ._logwrites import DUPLICATE_KEY, MAX_DOCUMENT_BYTES
from ._policy import result
from ._reservoir import IngestResult, Reservoir

log = logging.getLogger("bucketq.reservoir.mongo")

#: LogTide's log fields.
LOG_FIELDS = ("time", "project_id", "service", "level", "message", "metadata",
              "trace_id", "span_id", "session_id", "hostname")  # fmt: skip
SPAN_FIELDS = ("project_id", "trace_id", "span_id", "parent_span_id", "service", "name", "kind",
               "start_time", "end_time", "duration_ms", "status", "attributes")  # fmt: skip
METRIC_FIELDS = ("time", "project_id", "service", "name", "type", "value", "labels")
LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "fatal", "critical")


class RecordError(ValueError):
    """One record cannot be stored as it is."""


def parse_time(value: Any, field: str) -> datetime:
    """A datetime, an ISO 8601 string, or seconds since the epoch -> aware UTC datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise RecordError(f"{field} {value!r} is not a time (epoch seconds must be finite)")
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, ValueError, OSError):
            raise RecordError(
                f"{field} {value!r} is out of range (epoch seconds of years 1-9999)"
            ) from None
    if isinstance(value, str):
        try:
            d = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise RecordError(f"{field} {value!r} is not an ISO 8601 time") from None
        return d if d.tzinfo else d.replace(tzinfo=UTC)
    raise RecordError(f"{field} must be a time (ISO 8601 string, datetime or epoch seconds)")


def _common(rec: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if type(rec) is not dict and not isinstance(rec, Mapping):
        raise RecordError("a record must be an object")
    pid = rec.get("project_id")
    if not isinstance(pid, str) or not pid:
        raise RecordError("project_id must be a non-empty string")
    rid = rec.get("_id")
    if rid is None:
        rid = lb.IDS.mint(1)[0]  # assigned at acceptance: the same id on a driver retry
    elif not isinstance(rid, str) or not rid:
        raise RecordError("_id must be a non-empty string (the record's stable id)")
    doc = {"_id": rid}
    for k in fields:
        v = rec.get(k)
        if v is not None:
            doc[k] = v
    return doc


def log_document(rec: Any) -> dict[str, Any]:
    doc = _common(rec, LOG_FIELDS)
    if not isinstance(doc.get("message"), str):
        raise RecordError("message must be a string")
    doc["time"] = parse_time(doc["time"], "time") if "time" in doc else datetime.now(UTC)
    level = str(doc.get("level", "info")).lower()
    if level not in LEVELS:
        raise RecordError(f"level {level!r} is not one of {', '.join(LEVELS)}")
    doc["level"] = level
    doc.setdefault("service", "unknown")
    if "metadata" in doc and not isinstance(doc["metadata"], Mapping):
        raise RecordError("metadata must be an object")
    return doc


def span_document(rec: Any) -> dict[str, Any]:
    doc = _common(rec, SPAN_FIELDS)
    for f in ("trace_id", "span_id"):
        if not isinstance(doc.get(f), str):
            raise RecordError(f"{f} must be a string")
    doc["start_time"] = parse_time(doc.get("start_time"), "start_time")
    if "end_time" in doc:
        doc["end_time"] = parse_time(doc["end_time"], "end_time")
        doc.setdefault("duration_ms", (doc["end_time"] - doc["start_time"]).total_seconds() * 1000)
    return doc


def metric_document(rec: Any) -> dict[str, Any]:
    doc = _common(rec, METRIC_FIELDS)
    if not isinstance(doc.get("name"), str):
        raise RecordError("name must be a string")
    if not isinstance(doc.get("value"), int | float) or isinstance(doc.get("value"), bool):
        raise RecordError("value must be a number")
    doc["time"] = parse_time(doc["time"], "time") if "time" in doc else datetime.now(UTC)
    return doc


def _already_stored(write_error: Mapping[str, Any]) -> bool:
    """A duplicate-key error on ``_id``: the record is stored (by an earlier write)."""
    if write_error.get("code") != DUPLICATE_KEY:
        return False
    pattern = write_error.get("keyPattern")
    return pattern is None or list(pattern) == ["_id"]


def unencodable(doc: Mapping[str, Any]) -> str | None:
    """Why MongoDB cannot take ``doc`` (None when it can): the check run on the records
    of a batch the driver refused to encode, so only the bad ones fail."""
    try:
        size = len(bson.encode(doc))
    except RecursionError:
        return "the record nests too deeply (or contains itself)"
    except Exception as exc:  # noqa: BLE001 - any encoding failure is this record's
        return f"the record cannot be stored as BSON: {exc}"
    if size > MAX_DOCUMENT_BYTES:
        return f"the record is {size} bytes as BSON; MongoDB stores at most {MAX_DOCUMENT_BYTES}"
    return None


class MongoReservoir(Reservoir):
    """Stores logs in bucket documents of ``<prefix>log_buckets`` (:attr:`logstore`, a
    :class:`LogStore`: many records per document, with summaries; docs/server.md,
    "Storage"), spans and metrics one document per record in ``<prefix>spans`` and
    ``<prefix>metrics``, of a pymongo ``AsyncDatabase``.

    Each call is one ``insert_many(ordered=False)``; records that fail validation or the
    insert are reported with their index in ``errors`` and never counted as ingested.
    One bad record (a time out of range, a key MongoDB refuses) fails only itself.

    Idempotent: a record's ``_id`` (a string; one is assigned when it has none) is its
    stable id, and a record whose ``_id`` is already stored counts as stored, so writing
    the same records again (a retry, a redelivery, however regrouped) stores nothing twice.

    ``write_concern`` is every write's (log buckets, spans, metrics); by default the
    database's with ``j: true`` added unless it says ``j``, so a record counts as stored
    once it is on disk (``bucketq.bucket.writes.durable_write_concern``, the queues'
    rule); ``retention_days`` how long log records are kept (a number, a function of the
    project, or None: forever).

    Every MongoDB call waits at most ``op_timeout`` seconds for its answer (an insert
    not answered in time fails its records; a query raises OperationTimeout).
    """

    idempotent = True

    def __init__(
        self,
        db: Any,
        *,
        prefix: str = "",
        create_indexes: bool = True,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        write_concern: Mapping[str, Any] | None = None,
        retention_days: float | Callable[[str], float | None] | None = lb.DEFAULT_RETENTION_DAYS,
        log_layout: str = "buckets",
    ) -> None:
        if not hasattr(db, "get_collection") or not hasattr(db, "command"):
            raise ConfigurationError(
                "MongoReservoir needs a pymongo AsyncDatabase (AsyncMongoClient()[name])."
            )
        self.db = db
        # A record is reported stored once it is on disk: the queues' rule.
        wc = durable_write_concern(write_concern, getattr(db, "write_concern", None))
        self.spans = db.get_collection(prefix + "spans", write_concern=wc)
        self.metrics = db.get_collection(prefix + "metrics", write_concern=wc)
        self._indexes_done = not create_indexes
        self.op_timeout = op_timeout
        self._health = Health("reservoir storage")
        if log_layout not in ("buckets", "documents"):
            raise ConfigurationError(
                f"log_layout must be 'buckets' or 'documents'; got {log_layout!r}."
            )
        #: ``"documents"``: logs one document per record in ``<prefix>logs``, as earlier
        #: releases stored them (the benchmark's baseline; reads do not see them).
        self.log_layout = log_layout
        self.logstore = LogStore(db, name=prefix + "log_buckets", legacy=prefix + "logs",
                                 write_concern=wc.document, op_timeout=op_timeout,
                                 health=self._health, retention_days=retention_days)  # fmt: skip

    def _bounded(self, what: str | None = None) -> Any:
        return bounded(self.op_timeout, self._health, what)

    async def _ensure_indexes(self) -> None:
        """Once per process and storage, never alongside other start-up work (two
        concurrent creations stall the embedded server)."""
        if self._indexes_done:
            return
        key = startup_key(self.logstore.buckets, "reservoir-indexes")
        try:
            async with AsyncStartup(self.op_timeout):
                if key not in STARTUP_DONE:
                    with self._bounded():
                        await self._create_indexes()
                    STARTUP_DONE.add(key)
            self._indexes_done = True
        except (PyMongoError, StartupBusy) as exc:
            log.warning("creating storage indexes failed (%s); will retry", exc)

    async def _create_indexes(self) -> None:
        await self.logstore.create_indexes()
        if self.log_layout == "documents":
            await self.logstore.legacy.create_index(
                [("project_id", ASCENDING), ("time", DESCENDING)], name="project_time"
            )
        await self.spans.create_index(
            [("project_id", ASCENDING), ("start_time", DESCENDING)], name="project_time"
        )
        await self.spans.create_index([("trace_id", ASCENDING)], name="trace")
        await self.metrics.create_index(
            [("project_id", ASCENDING), ("time", DESCENDING)], name="project_time"
        )

    async def _insert(
        self, col: Any, records: Sequence[Any], build: Callable[[Any], dict[str, Any]]
    ) -> IngestResult:
        await self._ensure_indexes()
        errors: list[dict[str, Any]] = []
        docs: list[dict[str, Any]] = []
        positions: list[int] = []
        for i, rec in enumerate(records):
            try:
                docs.append(build(rec))
                positions.append(i)
            except RecordError as exc:
                errors.append({"index": i, "error": str(exc)})
        if docs:
            errors.extend(await self._insert_docs(col, docs, positions))
        errors.sort(key=lambda e: e["index"])
        return result(len(records) - len(errors), len(errors), errors)  # type: ignore[return-value]

    async def _insert_docs(
        self, col: Any, docs: list[dict[str, Any]], positions: list[int], *, again: bool = True
    ) -> list[dict[str, Any]]:
        """One unordered insert; the errors of the records that were not stored. A
        duplicate ``_id`` is a record already stored. When the driver cannot encode the
        batch, the records it cannot encode fail and the others are inserted again (what
        part of the batch was sent already is a duplicate, so stored once)."""
        try:
            with self._bounded():
                await col.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            return [
                {"index": positions[e["index"]], "error": e.get("errmsg", "write error")}
                for e in exc.details.get("writeErrors", [])
                if not _already_stored(e)
            ]
        except PyMongoError as exc:
            if again and isinstance(exc, bson.errors.InvalidDocument):
                return await self._insert_encodable(col, docs, positions, exc)
            return [{"index": i, "error": f"{type(exc).__name__}: {exc}"} for i in positions]
        except (bson.errors.BSONError, ValueError, OverflowError, TypeError, RecursionError) as exc:
            if again:
                return await self._insert_encodable(col, docs, positions, exc)
            return [{"index": i, "error": f"{type(exc).__name__}: {exc}"} for i in positions]
        return []

    async def _insert_encodable(
        self, col: Any, docs: list[dict[str, Any]], positions: list[int], exc: BaseException
    ) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = []
        good: list[dict[str, Any]] = []
        good_pos: list[int] = []
        for doc, pos in zip(docs, positions, strict=True):
            why = unencodable(doc)
            if why is None:
                good.append(doc)
                good_pos.append(pos)
            else:
                errors.append({"index": pos, "error": why})
        if not errors:  # not a per-record problem after all: every record failed
            return [{"index": i, "error": f"{type(exc).__name__}: {exc}"} for i in positions]
        log.warning("%d of %d records cannot be stored as BSON: %s", len(errors), len(docs),
                    errors[0]["error"])  # fmt: skip
        if good:
            errors.extend(await self._insert_docs(col, good, good_pos, again=False))
        return errors

    async def ingest(self, logs: Sequence[dict[str, Any]]) -> IngestResult:
        if self.log_layout == "documents":
            return await self._insert(self.logstore.legacy, logs, log_document)
        await self._ensure_indexes()
        errors: list[dict[str, Any]] = []
        docs: list[dict[str, Any]] = []
        positions: list[int] = []
        for i, rec in enumerate(logs):
            try:
                docs.append(log_document(rec))
                positions.append(i)
            except RecordError as exc:
                errors.append({"index": i, "error": str(exc)})
        if docs:
            errors.extend(await self.logstore.write(docs, positions))
        errors.sort(key=lambda e: e["index"])
        return result(len(logs) - len(errors), len(errors), errors)  # type: ignore[return-value]

    async def ingest_spans(self, spans: Sequence[dict[str, Any]]) -> IngestResult:
        return await self._insert(self.spans, spans, span_document)

    async def ingest_metrics(self, metrics: Sequence[dict[str, Any]]) -> IngestResult:
        return await self._insert(self.metrics, metrics, metric_document)

    async def query(
        self,
        kind: str = "log",
        *,
        project_id: str | None = None,
        service: str | None = None,
        level: str | None = None,
        trace_id: str | None = None,
        since: Any = None,
        until: Any = None,
        limit: int = 100,
        **unknown: Any,
    ) -> list[dict[str, Any]]:
        """Newest first, at most ``limit`` records, filtered by the given fields."""
        if unknown:
            raise ConfigurationError(
                f"Unknown query filter(s): {', '.join(sorted(unknown))}. Use project_id, service, level, "
                "trace_id, since, until, limit."
            )
        if kind == "log":
            return await self._query_logs(project_id, service=service, level=level, trace_id=trace_id,
                                          since=since, until=until, limit=limit)  # fmt: skip
        col = {"span": self.spans, "metric": self.metrics}.get(kind)
        if col is None:
            raise ConfigurationError(f"kind must be 'log', 'span' or 'metric'; got {kind!r}.")
        tfield = "start_time" if kind == "span" else "time"
        flt: dict[str, Any] = {}
        for k, v in (
            ("project_id", project_id),
            ("service", service),
            ("level", level),
            ("trace_id", trace_id),
        ):
            if v is not None:
                flt[k] = v
        if since is not None or until is not None:
            rng = flt[tfield] = {}
            if since is not None:
                rng["$gte"] = parse_time(since, "since")
            if until is not None:
                rng["$lt"] = parse_time(until, "until")
        with self._bounded(f"query({kind!r})"):
            cursor = col.find(flt, {"_id": 0}).sort(tfield, DESCENDING).limit(limit)
            return [d async for d in cursor]

    async def _query_logs(
        self, project_id: str | None, *, trace_id: str | None, limit: int, **filters: Any
    ) -> list[dict[str, Any]]:
        if project_id is None:
            # Every project's: the projects are found first (a scan: for small stores,
            # tests and tools; the service always reads one project).
            with self._bounded("query('log')"):
                projects = await self.logstore.buckets.distinct("p")
            recs: list[dict[str, Any]] = []
            for p in projects:
                recs += await self._query_logs(p, trace_id=trace_id, limit=limit, **filters)
            recs.sort(key=lambda r: r.get("time") or lb.MIN_TIME, reverse=True)
            return recs[:limit]
        filters = dict(filters)
        since, until = filters.pop("since"), filters.pop("until")
        flt = LogFilter(since=None if since is None else parse_time(since, "since"),
                        until=None if until is None else parse_time(until, "until"), **filters)  # fmt: skip
        if trace_id is not None:
            recs = [r for r in await self.logstore.trace(project_id, trace_id) if flt.keeps(r)]
            recs.sort(key=lb.sort_key, reverse=True)
        else:
            recs = (await self.logstore.page(project_id, flt, limit=limit)).records
        for r in recs:
            r.pop("_id", None)
        return recs[:limit]

    async def health(self) -> dict[str, Any]:
        try:
            with self._bounded():
                await self.db.command("ping")
            return {"status": "ok", "storage": "mongodb"}
        except PyMongoError as exc:
            return {
                "status": "error",
                "storage": "mongodb",
                "error": str(exc),
                "unreachable_since": self._health.unreachable_since,
            }

    async def close(self) -> None:
        """The database's client belongs to the caller; nothing to release."""
