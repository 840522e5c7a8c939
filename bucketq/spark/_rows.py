"""Rows out of buckets: the schema, bucket documents decoded into Arrow columns, and a
batch read's plan and ranges.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Iterator
from typing import Any

from .. import bucket
from ..bucket.codec import decode_items, may_have_headers
from ..bucket.convert import json_bytes, json_list
from ..stream import core as score
from ._clients import col, meta_col
from ._options import DEFAULT_NUM_PARTITIONS, Options


def schema_ddl(o: Options) -> str:
    payload = "BINARY" if o.payload_format == "binary" else "STRING"
    return (
        f"seq LONG, bucket STRING, index INT, payload {payload}, headers STRING, "
        "mature TIMESTAMP, tries INT"
    )


#: Rows per Arrow record batch a read task yields (whole buckets, so a batch may be larger).
ARROW_BATCH_ROWS = 10_000
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_US = _dt.timedelta(microseconds=1)


def _micros(t: Any) -> int | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return (t - _EPOCH) // _US


def _pyarrow():
    from .._deps import require

    return require("pyarrow", "spark")


def arrow_schema(fmt: str):
    """The read schema as Arrow types (what Spark's ``schema_ddl`` maps to)."""
    pa = _pyarrow()
    return pa.schema(
        [
            ("seq", pa.int64()),
            ("bucket", pa.string()),
            ("index", pa.int32()),
            ("payload", pa.binary() if fmt == "binary" else pa.string()),
            ("headers", pa.string()),
            ("mature", pa.timestamp("us", tz="UTC")),
            ("tries", pa.int32()),
        ]
    )


class Columns:
    """The read columns of some buckets, filled bucket by bucket: one ``bson.decode_all``
    per bucket and one JSON encoding per payload (UTF-8 bytes, straight into an Arrow
    column); bucket-wide values are repeated in C, and headers are looked for only in a
    bucket whose binary has some."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.schema = arrow_schema(fmt)
        self.clear()

    def clear(self) -> None:
        self.seq: list[int | None] = []
        self.bucket: list[str] = []
        self.index: list[int] = []
        self.payload: list[bytes] = []
        self.headers: list[bytes | None] = []
        self.mature: list[int | None] = []
        self.tries: list[int] = []

    def __len__(self) -> int:
        return len(self.index)

    def _items(self, blob: bytes, items: list[dict[str, Any]]) -> None:
        if self.fmt == "binary":
            pay = [it["p"] for it in items]
            if not all(isinstance(p, bytes) for p in pay):
                pay = [p if isinstance(p, bytes) else json_bytes(p) for p in pay]
            self.payload += pay
        else:
            self.payload += json_list([it["p"] for it in items])
        if may_have_headers(blob):
            self.headers += [None if (h := it.get("h")) is None else json_bytes(h) for it in items]
        else:
            self.headers += [None] * len(items)

    def add_stream(self, doc: dict[str, Any]) -> None:
        if score.is_tombstone(doc):
            return
        blob = doc["items"]
        items = decode_items(blob)
        n = len(items)
        seq = int(doc["_id"])
        self.seq += [seq] * n
        self.bucket += [str(seq)] * n
        self.index += range(n)
        self.mature += [_micros(doc.get("at"))] * n
        self.tries += [0] * n
        self._items(blob, items)

    def add_queue(self, doc: dict[str, Any]) -> None:
        blob = doc["items"]
        items = decode_items(blob)
        keep = bucket.open_items(doc, len(items))
        if len(keep) < len(items):
            items = [items[i] for i in keep]
        n = len(items)
        self.seq += [doc.get("seq")] * n
        self.bucket += [str(doc["_id"])] * n
        self.index += keep
        times = bucket.item_mature(doc, keep)
        # Items without a next time share the bucket's mature: convert it once.
        common = doc.get("mature")
        micros = _micros(common)
        self.mature += [micros if t is common else _micros(t) for t in times]
        self.tries += bucket.item_tries(doc, keep)
        self._items(blob, items)

    def record_batch(self):
        """The rows so far as one ``pyarrow.RecordBatch``; empties the columns."""
        pa = _pyarrow()
        payload = pa.array(self.payload, pa.binary())
        if self.fmt != "binary":
            payload = payload.cast(pa.string())  # checks the UTF-8, copies nothing else
        arrays = [
            pa.array(self.seq, pa.int64()),
            pa.array(self.bucket, pa.string()),
            pa.array(self.index, pa.int32()),
            payload,
            pa.array(self.headers, pa.binary()).cast(pa.string()),
            pa.array(self.mature, pa.int64()).cast(self.schema.field("mature").type),
            pa.array(self.tries, pa.int32()),
        ]
        self.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def arrow_batches(docs: Iterable[dict[str, Any]], fmt: str, mode: str) -> Iterator[Any]:
    """Buckets -> ``pyarrow.RecordBatch``es of about :data:`ARROW_BATCH_ROWS` rows."""
    cols = Columns(fmt)
    add = cols.add_stream if mode == "stream" else cols.add_queue
    for doc in docs:
        add(doc)
        if len(cols) >= ARROW_BATCH_ROWS:
            yield cols.record_batch()
    if len(cols):
        yield cols.record_batch()


def live_filter(mode: str, acked: int = 0) -> dict[str, Any]:
    if mode == "stream":
        return {"_id": {"$gt": acked}, "hole": {"$exists": False}, "stg": {"$exists": False}}
    return {"stg": {"$exists": False}}


def plan_ranges(ids: list[Any], parts: int) -> list[tuple[Any, Any]]:
    """Split sorted bucket ids into at most ``parts`` contiguous inclusive ranges."""
    if not ids:
        return []
    parts = max(1, min(parts, len(ids)))
    size = -(-len(ids) // parts)
    return [(ids[i], ids[min(i + size, len(ids)) - 1]) for i in range(0, len(ids), size)]


def batch_plan(o: Options) -> tuple[str, list[tuple[Any, Any]]]:
    mode = o.resolve_mode()
    acked = 0
    if mode == "stream":
        meta = meta_col(o).find_one(score.meta_filter()) or {}
        acked = int(meta.get("acked", 0))
    ids = [d["_id"] for d in col(o).find(live_filter(mode, acked), {"_id": 1}).sort("_id", 1)]
    return mode, plan_ranges(ids, o.num_partitions or DEFAULT_NUM_PARTITIONS)


def read_range(o: Options, mode: str, lo: Any, hi: Any) -> Iterator[Any]:
    """``pyarrow.RecordBatch``es of the live items of buckets ``lo <= _id <= hi``."""
    flt = dict(live_filter(mode))
    flt["_id"] = {"$gte": lo, "$lte": hi}
    return arrow_batches(col(o).find(flt).sort("_id", 1), o.payload_format, mode)
