"""The bucketq Spark data source on local[2] against a real server: batch read, a
streaming query SIGKILLed and restarted from its checkpoint (exactly-once), batch and
streaming writes with a failing task and a replayed micro-batch (no duplicates)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from spark_worker import committed_batches, kill_when

from bucketq.bucket.codec import decode_items
from bucketq.queue import Queue
from bucketq.spark import _ops as ops
from bucketq.spark.source import BucketQDataSource
from bucketq.stream import StreamQueue

pytestmark = pytest.mark.spark

WORKER = str(Path(__file__).with_name("spark_worker.py"))
#: Rows per micro-batch of a query restarted from its checkpoint (the killed one read 200).
RESTART_ROWS = 1000


def reader(spark, uri, db_name, queue, **extra):
    r = (
        spark.read.format("bucketq")
        .option("uri", uri)
        .option("database", db_name)
        .option("queue", queue)
    )
    for k, v in extra.items():
        r = r.option(k, str(v))
    return r.load()


def stream_items(db, name):
    """Every item of a stream collection, decoded, from the buckets that are not holes."""
    out = []
    for d in db[name].find({"hole": {"$exists": False}}).sort("_id", 1):
        out.extend(it["p"] for it in decode_items(d["items"]))
    return out


def test_batch_read_of_a_stream_equals_what_was_pushed(spark, db, mongo_uri, db_name):
    # Buckets sealed by size (and the durable push): with a 50 ms bucket_max_wait a
    # pause on a busy machine sealed the tenth early (39 items, an eleventh bucket).
    q = StreamQueue(db, "events", bucket_max_size=40, bucket_max_wait=30.0)
    pushed = [{"i": i, "tag": f"t{i % 7}"} for i in range(400)]
    q.push_many(pushed[:399])
    q.push(pushed[399], headers={"trace": "abc"}, durable=True)
    df = reader(spark, mongo_uri, db_name, "events", numPartitions=3)
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted((r.seq, r["index"]) for r in rows) == [
        (s, i) for s in range(1, 11) for i in range(40)
    ]
    assert Counter(r.payload for r in rows) == Counter(
        json.dumps(p, separators=(",", ":")) for p in pushed
    )
    last = max(rows, key=lambda r: (r.seq, r["index"]))
    assert json.loads(last.headers) == {"trace": "abc"} and last.tries == 0


def test_batch_read_of_a_bucket_queue_shows_its_live_items(spark, db, mongo_uri, db_name):
    q = Queue(db, "jobs", bucket_max_size=50, bucket_max_wait=0.05)
    q.push_many([f"job-{i}" for i in range(200)])
    q.flush()
    taken = [q.pop(timeout=5) for _ in range(30)]
    q.flush()
    df = reader(spark, mongo_uri, db_name, "jobs", payloadFormat="binary")
    rows = df.collect()
    q.close()
    gone = {m.payload for m in taken}
    assert len(gone) == 30
    assert Counter(json.loads(r.payload) for r in rows) == Counter(
        f"job-{i}" for i in range(200) if f"job-{i}" not in gone
    )
    assert all(r.seq is None and len(r.bucket) == 24 for r in rows)


def test_a_partitioned_queue_is_read_and_written_whole(spark, db, mongo_uri, db_name):
    """Batch read sees the live items of every partition; rows Spark writes into a
    partitioned queue (``partitions=4``) are spread over its partitions by Spark
    partition, and partitioned consumers read them all."""
    q = Queue(db, "jobs", partitions=4, bucket_max_size=50, bucket_max_wait=0.05)
    for k in range(4):
        q.push_many([f"job-{k}-{i}" for i in range(50)], key=k)
    q.flush()
    assert {d.get("part", 0) for d in db.jobs.find()} == {0, 1, 2, 3}
    taken = [q.pop(timeout=5) for _ in range(30)]
    q.flush()
    rows = reader(spark, mongo_uri, db_name, "jobs", payloadFormat="binary").collect()
    gone = {m.payload for m in taken}
    assert len(gone) == 30
    assert Counter(json.loads(r.payload) for r in rows) == Counter(
        f"job-{k}-{i}" for k in range(4) for i in range(50) if f"job-{k}-{i}" not in gone
    )
    before = {d["_id"] for d in db.jobs.find({}, {"_id": 1})}
    (
        spark.range(0, 1000, numPartitions=4)
        .selectExpr("id")
        .write.format("bucketq")
        .option("uri", mongo_uri)
        .option("database", db_name)
        .option("queue", "jobs")
        .option("mode", "queue")
        .option("partitions", "4")
        .mode("append")
        .save()
    )
    written = [d for d in db.jobs.find() if d["_id"] not in before]
    by_part = Counter()
    for d in written:
        by_part[d.get("part", 0)] += len(decode_items(d["items"]))
    assert by_part == {0: 250, 1: 250, 2: 250, 3: 250}, "each Spark partition's rows in its own"
    got = []
    while (m := q.reserve(timeout=2)) is not None:
        q.commit(m)
        got.append(m.payload)
    q.close()
    assert len(got) == 170 + 1000
    assert sorted(p["id"] for p in got if isinstance(p, dict)) == list(range(1000))


def fail_once(marker: str):
    """A UDF passing ids through; the first attempt of partition 1 dies 40,000 rows in
    (and leaves ``marker`` behind to show it did)."""

    def f(i):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and i >= 90_000:
            open(marker, "w").close()
            raise RuntimeError("injected task failure (first attempt)")
        return i

    return f


@pytest.mark.parametrize("mode", ["stream", "queue"])
def test_batch_write_of_100k_rows_lands_exactly_100k_items_despite_a_failed_task(
    spark, db, mongo_uri, db_name, mode, tmp_path
):
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    df = spark.range(0, 100_000, numPartitions=2).select(
        F.udf(fail_once(str(tmp_path / "failed")), "long")("id").alias("id")
    )
    (
        df.selectExpr("id", "concat('row-', id) AS name")
        .write.format("bucketq")
        .option("uri", mongo_uri)
        .option("database", db_name)
        .option("queue", "out")
        .option("mode", mode)
        .mode("append")
        .save()
    )
    assert (tmp_path / "failed").exists(), "the first attempt of a task failed and was retried"
    assert db.out.count_documents({"stg": {"$exists": True}}) == 0, "no staged bucket is left"
    if mode == "stream":
        holes = db.out.count_documents({"hole": True})
        print(f"failed attempt staged {holes} buckets, closed as holes")
        assert holes >= 8, "the failed attempt's buckets were closed as holes"
        seqs = [d["_id"] for d in db.out.find({}, {"_id": 1}).sort("_id", 1)]
        assert seqs == list(range(1, len(seqs) + 1))
        items = stream_items(db, "out")
        # and a consumer reads them all, in order, without waiting on a hole
        c = StreamQueue(db, "out").consumer()
        read = 0
        while read < 100_000 and (b := c.next_batch(timeout=0.5)) is not None:
            read += len(b.items)
        assert read == 100_000 and c.next_batch(timeout=0) is None
    else:
        items = [it["p"] for d in db.out.find() for it in decode_items(d["items"])]
    assert len(items) == 100_000
    assert sorted(it["id"] for it in items) == list(range(100_000))
    assert items[5] == {"id": items[5]["id"], "name": f"row-{items[5]['id']}"}


def _run_killed(mode, uri, db_name, queue, out, checkpoint, min_batches):
    checkpoint.mkdir(parents=True)
    kill_when([mode, uri, db_name, queue, str(out), str(checkpoint)],
               checkpoint.with_suffix(".log"),
               lambda: committed_batches(checkpoint) >= min_batches,
               f"{min_batches} committed batches")  # fmt: skip
    return committed_batches(checkpoint)


def test_streaming_write_killed_and_restarted_neither_loses_nor_duplicates(
    spark, db, mongo_uri, db_name, tmp_path
):
    sys.path.insert(0, str(Path(WORKER).parent))
    from spark_worker import start

    q = StreamQueue(db, "src", bucket_max_size=50, bucket_max_wait=0.05)
    q.push_many([{"k": i} for i in range(2000)], durable=True)
    ckpt = tmp_path / "ckpt"
    _run_killed("copy", mongo_uri, db_name, "src", "dst", ckpt, 3)
    query = start(spark, "copy", mongo_uri, db_name, "src", "dst", str(ckpt),
                  max_rows=RESTART_ROWS)  # fmt: skip
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert db.dst.count_documents({"stg": {"$exists": True}}) == 0
    assert Counter(p["k"] for p in stream_items(db, "dst")) == Counter(range(2000))


def test_a_replayed_micro_batch_is_published_once(db, mongo_uri, db_name):
    """Spark replays a micro-batch whose commit it did not record: same batchId, new tasks."""
    from pyspark.sql import Row
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("payload", StringType())])
    src = BucketQDataSource(
        {"uri": mongo_uri, "database": db_name, "queue": "dst", "mode": "stream"}
    )
    rows = [Row(payload=json.dumps({"v": i})) for i in range(30)]
    first = src.streamWriter(schema, False)
    first.commit([first.write(iter(rows))], 7)
    replay = src.streamWriter(schema, False)  # the restarted query's writer
    replay.commit([replay.write(iter(rows))], 7)
    nxt = replay.write(iter([Row(payload='"next"')]))
    replay.commit([nxt], 8)
    assert [p for p in stream_items(db, "dst")] == [{"v": i} for i in range(30)] + ["next"]
    assert db.dst.count_documents({"stg": {"$exists": True}}) == 0
    assert db["dst.meta"].find_one({"_id": ops.WRITER_PREFIX + "default"})["batch"] == 8


def test_available_now_after_a_query_killed_in_its_third_micro_batch_reads_all_once(
    spark, db, mongo_uri, db_name, tmp_path
):
    """A query into Parquet killed during its third micro-batch, more items pushed while
    it is down, and restarted from its checkpoint with ``trigger(availableNow=True)``:
    it replays the planned batch, reads every item exactly once and ends."""
    sys.path.insert(0, str(Path(WORKER).parent))
    from spark_worker import start

    q = StreamQueue(db, "logs", bucket_max_size=100, bucket_max_wait=0.05)
    q.push_many([{"n": i} for i in range(30_000)], durable=True)  # seqs 1..300
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    ckpt.mkdir()
    flag = tmp_path / "holding"
    # 2,000 rows (20 buckets) per batch: the third batch (id 2) is the first past seq 40.
    try:
        kill_when(["parquet", mongo_uri, db_name, "logs", str(out), str(ckpt), "2000", "40",
                    str(flag)], tmp_path / "query.log", flag.exists,
                   "the third micro-batch running")  # fmt: skip
    finally:
        flag.unlink(missing_ok=True)
    planned = sorted(int(f.name) for f in (ckpt / "offsets").iterdir() if f.name.isdigit())
    assert planned == [0, 1, 2] and committed_batches(ckpt) == 2, "killed inside batch 2"
    assert q.position()["acked"] == 40, "batches 0 and 1 acknowledged when batch 2 started"
    q.push_many([{"n": i} for i in range(30_000, 31_000)], durable=True)  # while it is down

    query = start(spark, "parquet", mongo_uri, db_name, "logs", str(out), str(ckpt),
                  max_rows=2000, available_now=True)  # fmt: skip
    try:
        ended = query.awaitTermination(600)
    finally:
        query.stop()
    assert ended, "an AvailableNow query ends once it read what was there when it started"
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).select("seq", "index", "payload").collect()
    got = Counter(json.loads(r.payload)["n"] for r in rows)
    assert len(got) == 31_000 and set(got.values()) == {1}, (
        f"{31_000 - len(got)} items unread, {sum(c > 1 for c in got.values())} read twice"
    )
    assert len({(r.seq, r["index"]) for r in rows}) == 31_000
    assert committed_batches(ckpt) >= 15
