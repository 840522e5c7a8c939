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

import datetime as _dt
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from pymongo import MongoClient

from .. import _validate as v
from .. import bucket
from ..bucket.codec import CODEC_OPTIONS, decode_items, encode_item, may_have_headers
from ..bucket.convert import bson_value, json_bytes, json_list
from ..bucket.deadline import client_timeouts
from ..bucket.writes import durable_write_concern
from ..embedded import URI_ENV
from ..errors import ConfigurationError, PayloadTooLarge
from ..stream import StreamConsumer, StreamQueue
from ..stream import core as score

DEFAULT_DATABASE = "bucketq"
DEFAULT_NUM_PARTITIONS = 2
log = logging.getLogger("bucketq.spark")

#: Rows per micro-batch of a streaming read unless ``maxRowsPerTrigger`` says otherwise:
#: large enough that a micro-batch's fixed cost (planning, tasks, the sink's commit) is
#: a small part of it, small enough that a backlog is read in
#: several micro-batches (a failed one is read again whole).
DEFAULT_MAX_ROWS_PER_TRIGGER = 1_000_000
#: Buckets a task inserts per command.
INSERT_CHUNK = 16
WRITER_PREFIX = "spark-writer:"

# -- options ---------------------------------------------------------------------------


def _option(name: str, field: str, default: Any, check: Any, help: str, **limits: Any) -> v.Setting:
    return v.Setting(name, field, default, help, check, limits)


def _stream_option(name: str, field: str, help: str) -> v.Setting:
    """A Spark option that is a stream option: read with the ``StreamOptions`` field's own
    check, so it accepts what a ``StreamQueue`` accepts (errors name the Spark option)."""
    return v.setting_of(score.StreamOptions, field, name, help)


#: The data source's options (any case, as Spark's are), each read from Spark's text by
#: its check (bucketq._validate): one declaration, the table in docs/spark.md.
# fmt: off
OPTIONS: tuple[v.Setting, ...] = (
    _option("uri", "uri", "", v.url, f"MongoDB URI (default: `${URI_ENV}`)", schemes=v.MONGODB_SCHEMES),
    _option("database", "database", DEFAULT_DATABASE, v.database_name, "database"),
    _option("queue", "queue", "", v.collection_name, "queue name (required)", optional=True),
    _option("mode", "mode", "auto", v.choice, "`stream` (stream-mode queue), `queue` (bucket queue); "
            "`auto` = stream if the queue has stream metadata", options=("auto", "stream", "queue")),
    _option("payloadFormat", "payload_format", "json", v.choice, "read: payload as JSON text (`json`) "
            "or bytes (`binary`: bytes payloads as they are, others as UTF-8 JSON). write: `json` parses "
            "a string `payload` column, `text` keeps it a string", options=("json", "binary", "text")),
    _option("numPartitions", "num_partitions", DEFAULT_NUM_PARTITIONS, v.count,
            "partitions of a read (contiguous bucket ranges)", lo=1),
    _option("maxRowsPerTrigger", "max_rows_per_trigger", DEFAULT_MAX_ROWS_PER_TRIGGER, v.count,
            "streaming read: rows per micro-batch at most (whole buckets, at least one)", lo=1),
    _option("startingAfter", "starting_after", None, v.maybe(v.count),
            "streaming read of a new query: start after this seq (default: the last ack)", lo=0),
    _stream_option("holeGrace", "hole_grace",
                   "streaming read: a seq taken by a producer that died is closed after this (seconds)"),
    _stream_option("stageTimeout", "stage_timeout",
                   "a staged (unpublished) write blocking a stream is closed after this (seconds)"),
    _stream_option("bucketMaxSize", "bucket_max_size", "writes: items per bucket at most (1 to 65,536)"),
    _stream_option("bucketMaxBytes", "bucket_max_bytes", "writes: bytes per bucket at most (1,024 to 16 MiB less 64 KiB)"),
    _option("writerId", "writer_id", "default", v.text,
            "streaming write: one id per streaming query writing into the same queue"),
    _option("partitions", "partitions", 1, v.count, "write into a bucket queue opened with "
            "`partitions=K`: give K, and each task's rows go to partition `task % K` (refused for a stream)",
            lo=1, hi=bucket.MAX_PARTITIONS, note=" (the queue's partitions=K: writes spread their tasks over them)"),
)
# fmt: on
#: The options that are stream options, by their ``StreamQueue`` names.
STREAM_OPTIONS = {
    s.name: s.field for s in OPTIONS if s.field in score.StreamOptions.__dataclass_fields__
}


def options_table() -> str:
    """The options as the Markdown table in ``docs/spark.md``."""
    return v.settings_table(OPTIONS, first="Option")


def spark_names(message: str) -> str:
    """A stream option check's message with the Spark options' names."""
    for key, name in STREAM_OPTIONS.items():
        if message.startswith(name + " "):
            message = "Option " + message
        message = message.replace(name, key)
    return message


def check_partitions(o: Options, mode: str) -> None:
    """Option partitions is for bucket queues: a stream has one partition."""
    if o.partitions > 1 and mode == "stream":
        raise ConfigurationError(
            f"Option partitions={o.partitions} is for bucket queues (mode queue); "
            f"{o.queue!r} is a stream, which has one partition. Leave partitions out."
        )


class Options:
    """The data source's options (:data:`OPTIONS`), checked once on the driver.
    Picklable (plain values). ``uri`` falls back to ``$BUCKETQ_MONGODB_URI``; ``queue`` is
    required."""

    def __init__(self, raw: dict[str, str]) -> None:
        opts = {str(k).lower(): str(x) for k, x in raw.items()}
        given = v.read_text(OPTIONS, opts, label="Option {}", casefold=True)
        values = {s.field: s.default for s in OPTIONS if s.field not in STREAM_OPTIONS.values()}
        values.update(given)
        values["uri"] = values["uri"] or v.env_mongodb_uri()
        if not values["uri"]:
            raise ConfigurationError(
                f'The bucketq data source needs a MongoDB URI: .option("uri", "mongodb://...") or ${URI_ENV}.'
            )
        if not values["queue"]:
            raise ConfigurationError(
                'The bucketq data source needs .option("queue", "<queue name>").'
            )
        self.uri: str = values["uri"]
        self.database: str = values["database"]
        self.queue: str = values["queue"]
        self.mode: str = values["mode"]
        self.payload_format: str = values["payload_format"]
        self.num_partitions: int = values["num_partitions"]
        self.max_rows_per_trigger: int = values["max_rows_per_trigger"]
        self.starting_after: int | None = values["starting_after"]
        #: The stream options given (by their ``StreamQueue`` names), checked as it checks them.
        self.stream_options: dict[str, Any] = {
            f: given[f] for f in STREAM_OPTIONS.values() if f in given
        }
        self.stream_opts()
        self.writer_id: str = values["writer_id"]
        self.partitions: int = values["partitions"]
        check_partitions(self, self.mode)

    def stream_opts(self) -> score.StreamOptions:
        try:
            return score.StreamOptions.build(**self.stream_options)
        except ConfigurationError as exc:
            raise ConfigurationError(spark_names(str(exc))) from None

    @property
    def stage_timeout(self) -> float:
        return self.stream_opts().stage_timeout

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


_streams: dict[tuple[Any, ...], StreamQueue] = {}


def stream(o: Options) -> StreamQueue:
    """This process's ``StreamQueue`` for the options (its consumer, numbering and
    staged writes are what the data source uses)."""
    key = (os.getpid(), o.uri, o.database, o.queue, tuple(sorted(o.stream_options.items())))
    sq = _streams.get(key)
    if sq is None:
        sq = StreamQueue(client(o.uri)[o.database], o.queue, **o.stream_options)
        sq = _streams.setdefault(key, sq)
    return sq


def col(o: Options):
    return _collection(o, o.queue)


def meta_col(o: Options):
    return _collection(o, score.meta_name(o.queue))


def _collection(o: Options, name: str):
    """``name`` in the options' database; its writes (a task's buckets, a query's offsets
    and acks) on disk unless the URI's write concern says ``j`` (as a queue's)."""
    c = client(o.uri)
    wc = durable_write_concern(None, c.write_concern)
    return c[o.database].get_collection(name, codec_options=CODEC_OPTIONS, write_concern=wc)


# -- rows out of buckets ----------------------------------------------------------------


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


# -- streaming read: offsets are sequence numbers ------------------------------------------


def incarnation_message(queue: str, checkpoint: str, stream: str) -> str:
    """What a query whose checkpoint came from another incarnation of its stream is told."""
    return (
        f"This query's checkpoint was made reading stream {queue!r} incarnation {checkpoint}, "
        f"but the stream {queue!r} of this database is incarnation {stream}: it was made "
        "again since (dropped and made anew, or a fresh store, such as the embedded one "
        "`bucketq pipeline` starts without --uri), and its sequence numbers are not the "
        "checkpoint's. Reading on would skip its records or read them twice, so the query "
        "stops. Start the query with a new checkpoint location to read this stream from its "
        "start, or point it at the store the checkpoint was made with."
    )


class StreamSource:
    """The driver side of a streaming read: the stream's one consumer (a fenced epoch)
    per query run, opened at the first call. Executors read the planned ranges.

    An offset is a seq and the stream's incarnation (``stream.core``): a checkpoint's
    offset from another incarnation of the queue (dropped and made again, or on a fresh
    store) names numbers that are not this stream's; reading on from it would skip
    records or read them twice, so :meth:`check` fails naming both incarnations. An
    offset without an incarnation (a checkpoint made before offsets had one) is taken as
    this stream's, with a warning; the query's next offsets carry it."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self._consumer: StreamConsumer | None = None
        self._warned = False

    @property
    def consumer(self) -> StreamConsumer:
        if self._consumer is None:
            self._consumer = stream(self.o).consumer()  # fences every older consumer
        return self._consumer

    @property
    def holes_closed(self) -> int:
        return self._consumer.holes_closed if self._consumer is not None else 0

    def initial(self) -> int:
        meta = self.consumer.check_epoch()
        return score.check_resume(self.o.queue, self.o.starting_after, meta)

    def offset(self, seq: int) -> dict[str, Any]:
        """The offset through ``seq`` of this stream."""
        return {"seq": seq, "incarnation": self.consumer.incarnation}

    def check(self, offset: dict[str, Any]) -> int:
        """The seq of ``offset`` (a checkpoint's, or one this source made), once it is
        known to be this stream's; see the class's text."""
        given = offset.get("incarnation")
        current = self.consumer.incarnation
        if given is None:
            if not self._warned:
                self._warned = True
                log.warning(
                    "this query's checkpoint has offsets without a stream incarnation (made by "
                    "an older bucketq): they are taken as stream %s's, incarnation %s; if the "
                    "queue was made again since (or the store is a fresh one), stop the query "
                    "and start it with a new checkpoint location",
                    v.printable(self.o.queue), current,
                )  # fmt: skip
        elif given != current:
            raise ConfigurationError(incarnation_message(self.o.queue, str(given), current))
        return int(offset["seq"])

    def latest(self, start: int, max_rows: int | None) -> int:
        """The highest seq reachable from ``start`` without a gap (holes past their grace
        are closed on the way), no further than ``max_rows`` items."""
        c = self.consumer
        if start < c.acked:
            raise ConfigurationError(
                f"Stream {self.o.queue!r} is acknowledged through {c.acked}, past this query's "
                f"checkpoint ({start}): another consumer took those buckets. Start the query "
                "from a new checkpoint (with startingAfter) or stop the other consumer."
            )
        return c.reachable(start, max_rows)

    def target(self) -> int:
        """Where a ``Trigger.AvailableNow`` run stops: the highest seq reachable without
        a gap from the acknowledged position, now."""
        return self.consumer.reachable(self.consumer.acked)

    def commit(self, end: int) -> None:
        """Acknowledge through ``end`` (fenced) and delete what is acknowledged."""
        self.consumer.write_ack(end)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


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
        return encode_item(bson_value(p), bson_value(h) if h else None)
    return encode_item(bson_value(row.asDict(recursive=True)))


def stage(o: Options, mode: str, job: str, items: Iterable[bytes], task: int = 0) -> dict[str, Any]:
    """Insert one task attempt's items as staged buckets; returns its commit message.
    Into a bucket queue with ``partitions`` K, the buckets of Spark partition ``task``
    go to the queue's partition for that number (``task % K``), as a producer's go to
    its own: the write is spread over the partitions and a task's items stay in order."""
    part = bucket.partition_of(task, o.partitions)
    token = uuid.uuid4().hex
    stg = {"j": job, "t": token}
    buckets = n = 0
    chunk: list[list[bytes]] = []

    def flush() -> None:
        if mode == "stream":  # numbered, retried and renumbered as pushed buckets are
            stream(o).write_staged(chunk, stg)
        else:
            docs = []
            for b in chunk:
                ob = score.sealed(b, time.time())
                ob.part = part
                ob.mature = bucket.from_datetime(score.STAGED_MATURE)
                doc = ob.document()
                doc["stg"] = stg
                docs.append(doc)
            col(o).insert_many(docs, ordered=False)
        chunk.clear()

    try:
        for b in score.pack(o.stream_opts().packer, items, time.time()):
            chunk.append(b)
            buckets += 1
            n += len(b)
            if len(chunk) >= INSERT_CHUNK:
                flush()
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(spark_names(str(exc))) from None
    if chunk:
        flush()
    return {"token": token, "buckets": buckets, "items": n}


def publish(o: Options, mode: str, job: str, tokens: list[str], *, expect: int | None) -> int:
    """Make the named attempts' buckets visible; returns how many were published."""
    flt = {"stg.j": job, "stg.t": {"$in": tokens}}
    if mode == "stream":
        upd: dict[str, Any] = score.publish_update()
    else:
        upd = {"$set": {"mature": bucket.to_datetime(time.time())}, "$unset": {"stg": ""}}
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
        col(o).update_many(flt, score.staged_to_tombstone(time.time()))
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
