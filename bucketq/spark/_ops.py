"""What the ``bucketq`` Spark data source does to MongoDB, with no pyspark import:
options, rows out of buckets, staged writes and their publication.

Executors and the driver call these with their own ``MongoClient`` (one per process,
cached here), so the reader and writer objects Spark pickles hold only plain options.

Staged writes make task retries and replayed micro-batches harmless: every task
attempt inserts its buckets tagged ``stg: {j: <job>, t: <attempt token>}``, invisible
to consumers (a bucket queue's staged bucket is not mature until the year 3000; a
stream's blocks the stream at its number, like a hole). The driver's commit publishes
the buckets of the attempts Spark reports as successful and turns the rest into
nothing (deleted, or tombstones in a stream, so no number is left open).
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from bson import ObjectId
from bson.decimal128 import Decimal128
from pymongo import MongoClient, ReturnDocument
from pymongo.errors import DuplicateKeyError

from ..embedded import URI_ENV
from ..errors import ConfigurationError, Fenced, PayloadTooLarge
from ..queue import _core as qcore
from ..queue._codec import CODEC_OPTIONS, decode_items, encode_item
from ..queue._deadline import client_timeouts
from ..stream import _core as score

DEFAULT_DATABASE = "bucketq"
DEFAULT_NUM_PARTITIONS = 2
#: Buckets a task inserts per command.
INSERT_CHUNK = 16
WRITER_PREFIX = "spark-writer:"

# -- options ---------------------------------------------------------------------------


def _int(opts: dict[str, str], key: str, default: int | None, low: int = 1) -> int | None:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = low - 1
    if v < low:
        raise ConfigurationError(f"Option {key} must be a whole number >= {low}; got {raw!r}.")
    return v


def _float(opts: dict[str, str], key: str, default: float) -> float:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if v <= 0:
        raise ConfigurationError(f"Option {key} must be a number > 0; got {raw!r}.")
    return v


class Options:
    """The data source's options, checked once on the driver. Picklable (plain values).

    ``uri`` (else ``$BUCKETQ_MONGODB_URI``), ``database`` (default ``bucketq``), ``queue``
    (required), ``mode`` (``stream``, ``queue`` or ``auto``: a stream if the queue has
    stream metadata), ``payloadFormat`` (``json`` (default), ``binary``, or for writes
    ``text``), ``numPartitions``, ``bucketMaxSize``, ``bucketMaxBytes``,
    ``maxRowsPerTrigger``, ``startingAfter``, ``holeGrace``, ``stageTimeout``, ``writerId``.
    """

    def __init__(self, raw: dict[str, str]) -> None:
        opts = {str(k).lower(): str(v) for k, v in raw.items()}
        uri = opts.get("uri") or os.environ.get(URI_ENV)
        if not uri:
            raise ConfigurationError(
                f'The bucketq data source needs a MongoDB URI: .option("uri", "mongodb://...") or ${URI_ENV}.'
            )
        self.uri: str = uri
        self.database = opts.get("database") or DEFAULT_DATABASE
        queue = opts.get("queue")
        if not queue:
            raise ConfigurationError(
                'The bucketq data source needs .option("queue", "<queue name>").'
            )
        self.queue = qcore.check_name(queue)
        self.mode = opts.get("mode", "auto").lower()
        if self.mode not in ("auto", "stream", "queue"):
            raise ConfigurationError(
                f'Option mode must be "auto", "stream" or "queue"; got {self.mode!r}.'
            )
        self.payload_format = opts.get("payloadformat", "json").lower()
        if self.payload_format not in ("json", "binary", "text"):
            raise ConfigurationError(
                f'Option payloadFormat must be "json", "binary" or "text"; got {self.payload_format!r}.'
            )
        self.num_partitions = _int(opts, "numPartitions", DEFAULT_NUM_PARTITIONS)
        self.bucket_max_size = _int(opts, "bucketMaxSize", qcore.DEFAULT_BUCKET_MAX_SIZE)
        self.bucket_max_bytes = _int(opts, "bucketMaxBytes", qcore.DEFAULT_BUCKET_MAX_BYTES, 1024)
        self.max_rows_per_trigger = _int(opts, "maxRowsPerTrigger", None)
        self.starting_after = _int(opts, "startingAfter", None, 0)
        self.hole_grace = _float(opts, "holeGrace", score.DEFAULT_HOLE_GRACE)
        self.stage_timeout = _float(opts, "stageTimeout", score.DEFAULT_STAGE_TIMEOUT)
        self.writer_id = opts.get("writerid", "default")

    def resolve_mode(self) -> str:
        """``stream`` or ``queue`` (``auto`` looks for the stream's metadata document)."""
        if self.mode != "auto":
            return self.mode
        return "stream" if meta_col(self).find_one(score.meta_filter(), {"_id": 1}) else "queue"


# -- clients (one per process) ----------------------------------------------------------

_clients: dict[str, MongoClient] = {}
_clients_lock = threading.Lock()


def client(uri: str) -> MongoClient:
    with _clients_lock:
        c = _clients.get(uri)
        if c is None:
            c = _clients[uri] = MongoClient(uri, appname="bucketq-spark", **client_timeouts(uri))
        return c


def col(o: Options):
    return client(o.uri)[o.database].get_collection(o.queue, codec_options=CODEC_OPTIONS)


def meta_col(o: Options):
    return client(o.uri)[o.database].get_collection(
        score.meta_name(o.queue), codec_options=CODEC_OPTIONS
    )


# -- rows out of buckets ----------------------------------------------------------------

ROW_FIELDS = ("seq", "bucket", "index", "payload", "headers", "mature", "tries")


def schema_ddl(o: Options) -> str:
    payload = "BINARY" if o.payload_format == "binary" else "STRING"
    return (
        f"seq LONG, bucket STRING, index INT, payload {payload}, headers STRING, "
        "mature TIMESTAMP, tries INT"
    )


def _json_default(v: Any) -> Any:
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, _dt.date):
        return v.isoformat()
    if isinstance(v, ObjectId):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, Decimal128 | Decimal):
        return str(v)
    return str(v)


_json_encode = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


def to_json(v: Any) -> str:
    """Compact JSON text of a decoded BSON value (dates ISO 8601, ObjectIds and
    decimals as strings, bytes base64)."""
    return _json_encode(v)


def stream_rows(doc: dict[str, Any], fmt: str) -> Iterator[tuple]:
    """Rows of one stream bucket (none for a tombstone), as tuples."""
    cols = Columns(fmt)
    cols.add_stream(doc)
    yield from cols.rows()


def queue_rows(doc: dict[str, Any], fmt: str) -> Iterator[tuple]:
    """Rows of one bucket-queue bucket (its live, not consumed, items), as tuples."""
    cols = Columns(fmt)
    cols.add_queue(doc)
    yield from cols.rows()


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
    try:
        import pyarrow
    except ImportError as exc:  # pragma: no cover - the spark extra installs it
        raise ConfigurationError(
            "The bucketq Spark source needs pyarrow: pip install 'bucketq[spark]'."
        ) from exc
    return pyarrow


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
    per bucket, one JSON encoding per payload, bucket-wide values repeated in C."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.clear()

    def clear(self) -> None:
        self.seq: list[int | None] = []
        self.bucket: list[str] = []
        self.index: list[int] = []
        self.payload: list[Any] = []
        self.headers: list[str | None] = []
        self.mature: list[int | None] = []
        self.tries: list[int] = []

    def __len__(self) -> int:
        return len(self.index)

    def _items(self, items: list[dict[str, Any]]) -> None:
        enc = _json_encode
        pay = self.payload
        hdr = self.headers
        if self.fmt == "binary":
            for it in items:
                p = it["p"]
                pay.append(p if isinstance(p, bytes) else enc(p).encode())
                h = it.get("h")
                hdr.append(None if h is None else enc(h))
        else:
            for it in items:
                pay.append(enc(it["p"]))
                h = it.get("h")
                hdr.append(None if h is None else enc(h))

    def add_stream(self, doc: dict[str, Any]) -> None:
        if score.is_tombstone(doc):
            return
        items = decode_items(doc["items"])
        n = len(items)
        seq = int(doc["_id"])
        self.seq += [seq] * n
        self.bucket += [str(seq)] * n
        self.index += range(n)
        self.mature += [_micros(doc.get("at"))] * n
        self.tries += [0] * n
        self._items(items)

    def add_queue(self, doc: dict[str, Any]) -> None:
        items = decode_items(doc["items"])
        done = doc.get("done") or b""
        if done:
            keep = [i for i in range(len(items)) if not done[i >> 3] & (1 << (i & 7))]
            items = [items[i] for i in keep]
        else:
            keep = list(range(len(items)))
        n = len(items)
        tries = doc.get("tries") or {}
        nxt = doc.get("next") or {}
        mature = _micros(doc.get("mature"))
        self.seq += [doc.get("seq")] * n
        self.bucket += [str(doc["_id"])] * n
        self.index += keep
        if nxt:
            self.mature += [_micros(nxt[str(i)]) if str(i) in nxt else mature for i in keep]
        else:
            self.mature += [mature] * n
        self.tries += [int(tries.get(str(i), 0)) for i in keep] if tries else [0] * n
        self._items(items)

    def record_batch(self):
        """The rows so far as one ``pyarrow.RecordBatch``; empties the columns."""
        pa = _pyarrow()
        schema = arrow_schema(self.fmt)
        arrays = [
            pa.array(self.seq, pa.int64()),
            pa.array(self.bucket, pa.string()),
            pa.array(self.index, pa.int32()),
            pa.array(self.payload, schema.field("payload").type),
            pa.array(self.headers, pa.string()),
            pa.array(self.mature, pa.int64()).cast(schema.field("mature").type),
            pa.array(self.tries, pa.int32()),
        ]
        self.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def rows(self) -> Iterator[tuple]:
        """The rows so far as tuples (``mature`` as a datetime); empties the columns."""
        mature = [None if m is None else _EPOCH + m * _US for m in self.mature]
        out = zip(
            self.seq,
            self.bucket,
            self.index,
            self.payload,
            self.headers,
            mature,
            self.tries,
            strict=True,
        )
        self.clear()
        return out


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


# -- streaming read: offsets are sequence numbers ------------------------------------------


class StreamSource:
    """The driver side of a streaming read: one fenced consumer epoch per query run."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.epoch: int | None = None
        self.clock = score.HoleClock(o.hole_grace, o.stage_timeout)
        self.holes_closed = 0

    def open(self) -> dict[str, Any]:
        if self.epoch is None:
            ensure_meta(self.o)
            meta = meta_col(self.o).find_one_and_update(
                score.meta_filter(), score.open_update(), return_document=ReturnDocument.AFTER
            )
            self.epoch = int(meta["epoch"])
            return meta
        return self.check()

    def check(self) -> dict[str, Any]:
        meta = meta_col(self.o).find_one(score.meta_filter())
        if meta is None or int(meta.get("epoch", -1)) != self.epoch:
            raise Fenced(
                score.fenced_message(self.o.queue, self.epoch or 0, meta and meta.get("epoch"))
            )
        return meta

    def initial(self) -> int:
        meta = self.open()
        return score.check_resume(self.o.queue, self.o.starting_after, meta)

    def latest(self, start: int, max_rows: int | None) -> int:
        """The highest seq reachable from ``start`` without a gap (holes past their grace
        are closed on the way), no further than ``max_rows`` items."""
        meta = self.open()
        acked = int(meta.get("acked", 0))
        if start < acked:
            raise ConfigurationError(
                f"Stream {self.o.queue!r} is acknowledged through {acked}, past this query's "
                f"checkpoint ({start}): another consumer took those buckets. Start the query "
                "from a new checkpoint (with startingAfter) or stop the other consumer."
            )
        allocated = int(meta.get("next", 0))
        cursor = start
        rows = 0
        c = col(self.o)
        while True:
            docs = list(c.find({"_id": {"$gt": cursor}}, {"items": 0}).sort("_id", 1).limit(256))
            res = score.scan(cursor, docs, allocated)
            for d in res.ready:
                n = int(d.get("n", 0))
                if max_rows is not None and rows and rows + n > max_rows:
                    return cursor
                cursor = d["_id"]
                rows += n
            self.clock.passed(cursor)
            if res.blocked is None:
                if len(docs) < 256 or not res.ready:
                    return cursor
                continue
            kind, seq, doc = res.blocked
            if self.clock.due_in(kind, seq, time.monotonic()) > 0:
                return cursor
            close_hole(self.o, kind, seq, doc)
            self.holes_closed += 1

    def target(self) -> int:
        """Where a ``Trigger.AvailableNow`` run stops: the highest seq reachable without
        a gap from the acknowledged position, now."""
        meta = self.open()
        return self.latest(int(meta.get("acked", 0)), None)

    def commit(self, end: int) -> None:
        """Acknowledge through ``end`` (fenced) and delete what is acknowledged."""
        if self.epoch is None:
            self.open()
        assert self.epoch is not None  # open() sets it
        m = meta_col(self.o)
        res = m.update_one(score.ack_filter(self.epoch), score.ack_update(end))
        if not res.matched_count:
            meta = m.find_one(score.meta_filter())
            raise Fenced(
                score.fenced_message(self.o.queue, self.epoch or 0, meta and meta.get("epoch"))
            )
        col(self.o).delete_many(
            score.delete_acked_filter(end, time.time(), score.DEFAULT_TOMBSTONE_TTL)
        )


def close_hole(o: Options, kind: str, seq: int, doc: dict[str, Any] | None) -> None:
    now = time.time()
    if kind == "missing":
        try:
            col(o).insert_one(score.tombstone(seq, now))
        except DuplicateKeyError:
            pass
    else:
        assert doc is not None
        flt, upd = score.close_staged(seq, doc["stg"], now)
        col(o).update_one(flt, upd)


def read_seq_range(o: Options, lo: int, hi: int) -> Iterator[Any]:
    """``pyarrow.RecordBatch``es of the buckets ``lo < seq <= hi``; every number must be
    there (bucket or tombstone): latestOffset only ever hands out gapless ranges."""
    cols = Columns(o.payload_format)
    expect = lo + 1
    for doc in col(o).find({"_id": {"$gt": lo, "$lte": hi}}).sort("_id", 1):
        if doc["_id"] != expect or score.is_staged(doc):
            break
        expect += 1
        cols.add_stream(doc)
        if len(cols) >= ARROW_BATCH_ROWS:
            yield cols.record_batch()
    if len(cols):
        yield cols.record_batch()
    if expect != hi + 1:
        raise ConfigurationError(
            f"Stream {o.queue!r}: bucket {expect} of the planned range {lo + 1}..{hi} is gone; "
            "another consumer acknowledged it. Only one consumer may read a stream."
        )


# -- writes: staged buckets, published by the driver's commit ----------------------------


def ensure_meta(o: Options) -> None:
    try:
        meta_col(o).update_one(score.meta_filter(), score.meta_init(), upsert=True)
    except DuplicateKeyError:
        pass


def _plain(v: Any) -> Any:
    """Row values BSON cannot take as they are."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Decimal):
        return Decimal128(v)
    if isinstance(v, _dt.date) and not isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, bytearray):
        return bytes(v)
    return v


def row_item(row: Any, fields: list[str], fmt: str) -> bytes:
    """Encode one Spark row as a bucket item.

    With a ``payload`` column: a JSON string is parsed (``payloadFormat=json``) or kept
    (``text``), binary is stored as bytes, a struct or map as a document; an optional
    ``headers`` column (JSON string or map) gives the item's headers. Without one, the
    whole row is the payload (a document of its columns).
    """
    if "payload" in fields:
        p = row["payload"]
        if isinstance(p, str) and fmt == "json":
            p = json.loads(p)
        elif hasattr(p, "asDict"):
            p = p.asDict(recursive=True)
        h = row["headers"] if "headers" in fields else None
        if isinstance(h, str):
            h = json.loads(h)
        elif h is not None and hasattr(h, "asDict"):
            h = h.asDict(recursive=True)
        return encode_item(_plain(p), _plain(h) if h else None)
    return encode_item(_plain(row.asDict(recursive=True)))


def pack(items: Iterable[bytes], max_size: int, max_bytes: int) -> Iterator[list[bytes]]:
    limit = max_bytes - qcore.BUCKET_OVERHEAD
    cur: list[bytes] = []
    size = 0
    for it in items:
        if len(it) > limit:
            raise PayloadTooLarge(
                f"A row is {len(it)} bytes encoded; a bucket holds at most {limit} bytes of items "
                f"(bucketMaxBytes={max_bytes}). Raise bucketMaxBytes (up to {qcore.HARD_MAX_BYTES}) "
                "or store large blobs elsewhere and write a reference."
            )
        if cur and (len(cur) >= max_size or size + len(it) > limit):
            yield cur
            cur, size = [], 0
        cur.append(it)
        size += len(it)
    if cur:
        yield cur


def stage(o: Options, mode: str, job: str, items: Iterable[bytes]) -> dict[str, Any]:
    """Insert one task attempt's items as staged buckets; returns its commit message."""
    token = uuid.uuid4().hex
    stg = {"j": job, "t": token}
    c = col(o)
    buckets = n = 0
    chunk: list[list[bytes]] = []

    def flush() -> None:
        now = time.time()
        if mode == "stream":
            ensure_meta(o)
            meta = meta_col(o).find_one_and_update(
                score.meta_filter(),
                score.allocate_update(len(chunk)),
                return_document=ReturnDocument.AFTER,
            )
            seqs = score.allocated(meta, len(chunk))
            docs = [
                score.bucket_document(s, b, ObjectId(), now, stg)
                for s, b in zip(seqs, chunk, strict=True)
            ]
        else:
            docs = []
            for b in chunk:
                ob = qcore.OpenBucket(None, now, None)
                ob.items = b
                ob.mature = qcore.from_datetime(score.STAGED_MATURE)
                doc = ob.document()
                doc["stg"] = stg
                docs.append(doc)
        c.insert_many(docs, ordered=False)
        chunk.clear()

    for b in pack(
        items,
        o.bucket_max_size or qcore.DEFAULT_BUCKET_MAX_SIZE,
        o.bucket_max_bytes or qcore.DEFAULT_BUCKET_MAX_BYTES,
    ):
        chunk.append(b)
        buckets += 1
        n += len(b)
        if len(chunk) >= INSERT_CHUNK:
            flush()
    if chunk:
        flush()
    return {"token": token, "buckets": buckets, "items": n}


def publish(o: Options, mode: str, job: str, tokens: list[str], *, expect: int | None) -> int:
    """Make the named attempts' buckets visible; returns how many were published."""
    flt = {"stg.j": job, "stg.t": {"$in": tokens}}
    if mode == "stream":
        upd: dict[str, Any] = {"$unset": {"stg": ""}}
    else:
        upd = {"$set": {"mature": qcore.to_datetime(time.time())}, "$unset": {"stg": ""}}
    res = col(o).update_many(flt, upd)
    if expect is not None and res.modified_count != expect:
        raise ConfigurationError(
            f"Publishing a Spark write to {o.queue!r} found {res.modified_count} of its {expect} staged "
            f"buckets: the others were closed as stale (stageTimeout={o.stage_timeout} s) or removed. "
            "The write is incomplete; run it again."
        )
    return res.modified_count


def discard(o: Options, mode: str, job: str, keep: list[str]) -> None:
    """Remove the job's staged buckets of every other attempt (failed or replayed)."""
    flt = {"stg.j": job, "stg.t": {"$nin": keep}}
    if mode == "stream":  # numbers must not stay open: turn them into tombstones
        now = qcore.to_datetime(time.time())
        col(o).update_many(
            flt,
            {
                "$set": {"hole": True, "at": now},
                "$unset": {"stg": "", "items": "", "n": "", "w": ""},
            },
        )
    else:
        col(o).delete_many(flt)


def commit_batch(o: Options, mode: str, job: str, messages: list[Any]) -> None:
    ok = [m for m in messages if m is not None]
    tokens = [m.token for m in ok]
    publish(o, mode, job, tokens, expect=sum(m.buckets for m in ok))
    discard(o, mode, job, tokens)


def commit_micro_batch(o: Options, mode: str, job: str, messages: list[Any], batch_id: int) -> bool:
    """Publish micro-batch ``batch_id`` once per ``writerId``; a replay is discarded.
    Returns False for a replay."""
    ok = [m for m in messages if m is not None]
    tokens = [m.token for m in ok]
    m = meta_col(o)
    wid = WRITER_PREFIX + o.writer_id
    rec = m.find_one({"_id": wid})
    if rec is not None and int(rec.get("batch", -1)) >= batch_id:
        if int(rec["batch"]) == batch_id:  # finish a publication a crash interrupted
            publish(o, mode, rec["j"], list(rec["t"]), expect=None)
        discard(o, mode, job, [])
        return False
    # The intent first: a crash after it is finished by the replay above.
    m.update_one({"_id": wid}, {"$set": {"batch": batch_id, "j": job, "t": tokens}}, upsert=True)
    publish(o, mode, job, tokens, expect=sum(x.buckets for x in ok))
    discard(o, mode, job, tokens)
    return True


def new_job() -> str:
    return uuid.uuid4().hex
