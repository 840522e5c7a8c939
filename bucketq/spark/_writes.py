"""Writes: every task attempt stages its buckets, and the driver's commit publishes
those of the attempts Spark reports as successful.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from .. import bucket
from ..bucket.codec import encode_item
from ..bucket.convert import bson_value
from ..errors import ConfigurationError, PayloadTooLarge
from ..stream import core as score
from ._clients import col, meta_col, stream
from ._options import INSERT_CHUNK, WRITER_PREFIX, Options, spark_names


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
