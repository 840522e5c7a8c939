"""The MongoDB storage engine for logs, spans and metrics (pymongo ``AsyncDatabase``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.errors import BulkWriteError, PyMongoError

from ..errors import ConfigurationError
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
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, str):
        try:
            d = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise RecordError(f"{field} {value!r} is not an ISO 8601 time") from None
        return d if d.tzinfo else d.replace(tzinfo=UTC)
    raise RecordError(f"{field} must be a time (ISO 8601 string, datetime or epoch seconds)")


def _common(rec: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(rec, Mapping):
        raise RecordError("a record must be an object")
    pid = rec.get("project_id")
    if not isinstance(pid, str) or not pid:
        raise RecordError("project_id must be a non-empty string")
    return {k: rec[k] for k in fields if rec.get(k) is not None}


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


class MongoReservoir(Reservoir):
    """Stores logs, spans and metrics in ``<prefix>logs``, ``<prefix>spans`` and
    ``<prefix>metrics`` of a pymongo ``AsyncDatabase``, indexed by project and time.

    Each call is one ``insert_many(ordered=False)``; records that fail validation or the
    insert are reported with their index in ``errors`` and never counted as ingested.
    """

    def __init__(self, db: Any, *, prefix: str = "", create_indexes: bool = True) -> None:
        if not hasattr(db, "get_collection") or not hasattr(db, "command"):
            raise ConfigurationError(
                "MongoReservoir needs a pymongo AsyncDatabase (AsyncMongoClient()[name])."
            )
        self.db = db
        self.logs = db.get_collection(prefix + "logs")
        self.spans = db.get_collection(prefix + "spans")
        self.metrics = db.get_collection(prefix + "metrics")
        self._indexes_done = not create_indexes

    async def _ensure_indexes(self) -> None:
        if self._indexes_done:
            return
        try:
            await self.logs.create_index(
                [("project_id", ASCENDING), ("time", DESCENDING)], name="project_time"
            )
            await self.spans.create_index(
                [("project_id", ASCENDING), ("start_time", DESCENDING)], name="project_time"
            )
            await self.spans.create_index([("trace_id", ASCENDING)], name="trace")
            await self.metrics.create_index(
                [("project_id", ASCENDING), ("time", DESCENDING)], name="project_time"
            )
            self._indexes_done = True
        except PyMongoError as exc:
            log.warning("creating storage indexes failed (%s); will retry", exc)

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
            try:
                await col.insert_many(docs, ordered=False)
            except BulkWriteError as exc:
                for e in exc.details.get("writeErrors", []):
                    errors.append(
                        {"index": positions[e["index"]], "error": e.get("errmsg", "write error")}
                    )
            except PyMongoError as exc:
                for i in positions:
                    errors.append({"index": i, "error": f"{type(exc).__name__}: {exc}"})
        errors.sort(key=lambda e: e["index"])
        return result(len(records) - len(errors), len(errors), errors)  # type: ignore[return-value]

    async def ingest(self, logs: Sequence[dict[str, Any]]) -> IngestResult:
        return await self._insert(self.logs, logs, log_document)

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
        col = {"log": self.logs, "span": self.spans, "metric": self.metrics}.get(kind)
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
        cursor = col.find(flt, {"_id": 0}).sort(tfield, DESCENDING).limit(limit)
        return [d async for d in cursor]

    async def health(self) -> dict[str, Any]:
        try:
            await self.db.command("ping")
            return {"status": "ok", "storage": "mongodb"}
        except PyMongoError as exc:
            return {"status": "error", "storage": "mongodb", "error": str(exc)}

    async def close(self) -> None:
        """The database's client belongs to the caller; nothing to release."""
