#!/usr/bin/env python3
"""Items/s from a stream-mode queue into Parquet through the
``bucketq`` Spark data source on local[2].

    python bench/spark_bench.py                 # 100,000 items
    python bench/spark_bench.py --quick         # 20,000 items
    python bench/spark_bench.py --json out.json --mongodb-uri mongodb://...

Contenders, run one after the other in ONE process against ONE server:
  stream→parquet   streaming query (offsets = seqs, acks on commit) until drained
  batch→parquet    batch read of the same items (a second copy in another stream)
  floor            the same rows from memory (no MongoDB) into Parquet: Spark's own cost
Ratios to the floor are what carries over between servers; on the embedded server
(SecantusDB) per-operation costs are 10-100x those of mongod.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def payloads(n: int) -> list[dict[str, Any]]:
    # ~100-byte JSON payloads, as in the other benchmarks
    return [
        {
            "id": i,
            "user": f"u{i % 997:04d}",
            "action": "click",
            "path": "/p/" + "x" * (i % 20),
            "v": i * 0.5,
        }
        for i in range(n)
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="20,000 items")
    ap.add_argument("--mongodb-uri", default=None)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-rows", type=int, default=50_000, help="maxRowsPerTrigger")
    ap.add_argument("--partitions", type=int, default=2, help="numPartitions of the source")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)
    n = 20_000 if args.quick else args.n

    import pymongo
    import pyspark
    from pymongo import MongoClient
    from pyspark.sql import SparkSession

    from bucketq.embedded import mongodb
    from bucketq.spark import register
    from bucketq.stream import StreamQueue

    tmp = Path(tempfile.mkdtemp(prefix="bucketq-spark-bench-"))
    results: dict[str, Any] = {}
    with mongodb(args.mongodb_uri) as uri:
        server = (
            "given URI" if args.mongodb_uri else "embedded SecantusDB (or $BUCKETQ_MONGODB_URI)"
        )
        client = MongoClient(uri)
        db = client["bucketq_spark_bench"]
        client.drop_database(db.name)
        items = payloads(n)
        t = time.perf_counter()
        for name in ("bench_stream", "bench_batch"):
            q = StreamQueue(db, name)
            q.push_many(items)
            q.close()
        push_s = (time.perf_counter() - t) / 2
        results["push"] = {"items": n, "seconds": push_s, "items_per_s": n / push_s}

        spark = (
            SparkSession.builder.master(args.master)
            .appName("bucketq-spark-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        opts = {"uri": uri, "database": db.name, "numPartitions": str(args.partitions)}

        # warm-up: one tiny Parquet write, so the JVM's start is nobody's cost
        spark.range(10).write.mode("overwrite").parquet(str(tmp / "warm"))

        # 1. stream → parquet
        t = time.perf_counter()
        query = (
            spark.readStream.format("bucketq")
            .options(**opts, queue="bench_stream", maxRowsPerTrigger=str(args.max_rows))
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp / "stream"))
            .option("checkpointLocation", str(tmp / "ckpt"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        query.processAllAvailable()
        stream_s = time.perf_counter() - t
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        query.stop()
        got = spark.read.parquet(str(tmp / "stream")).count()
        assert got == n, f"stream→parquet stored {got} of {n} rows"
        in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in batches) / 1000
        # The first micro-batch also starts the executors' Python workers (imports,
        # MongoDB connections); the later ones show the source's steady pace.
        later = batches[1:]
        later_s = sum(p["durationMs"].get("triggerExecution", 0) for p in later) / 1000
        later_rows = sum(p["numInputRows"] for p in later)
        results["stream_to_parquet"] = {
            "seconds": stream_s,
            "items_per_s": n / stream_s,
            "micro_batches": len(batches),
            "seconds_in_batches": in_batches,
            "items_per_s_in_batches": n / in_batches if in_batches else None,
            "first_batch_seconds": batches[0]["durationMs"].get("triggerExecution", 0) / 1000
            if batches
            else None,
            "items_per_s_after_first_batch": later_rows / later_s if later_s else None,
        }

        # 2. batch read → parquet
        t = time.perf_counter()
        spark.read.format("bucketq").options(**opts, queue="bench_batch").load().write.parquet(
            str(tmp / "batch")
        )
        batch_s = time.perf_counter() - t
        results["batch_to_parquet"] = {"seconds": batch_s, "items_per_s": n / batch_s}

        # 3. floor: the same rows, already in Spark, into Parquet
        rows = [(i, "1", 0, json.dumps(p)) for i, p in enumerate(items)]
        df = (
            spark.createDataFrame(rows, "seq LONG, bucket STRING, index INT, payload STRING")
            .repartition(2)
            .cache()
        )
        df.count()
        t = time.perf_counter()
        df.write.parquet(str(tmp / "floor"))
        floor_s = time.perf_counter() - t
        results["floor"] = {"seconds": floor_s, "items_per_s": n / floor_s}
        spark.stop()
        client.drop_database(db.name)
        client.close()
    shutil.rmtree(tmp, ignore_errors=True)

    env = {
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pymongo": pymongo.version,
        "server": server,
        "master": args.master,
        "n": n,
        "payload_bytes": round(sum(len(json.dumps(p)) for p in items[:1000]) / 1000),
        "maxRowsPerTrigger": args.max_rows,
        "numPartitions": args.partitions,
    }
    floor = results["floor"]["items_per_s"]
    print(
        f"\nbucketq Spark benchmark: {n:,} items (~{env['payload_bytes']} B JSON), {args.master}, {server}"
    )
    print(f"{'contender':<20}{'seconds':>10}{'items/s':>12}{'vs floor':>10}")
    for key in ("push", "stream_to_parquet", "batch_to_parquet", "floor"):
        r = results[key]
        ratio = "" if key == "push" else f"{r['items_per_s'] / floor:.2f}x"
        print(f"{key:<20}{r['seconds']:>10.2f}{r['items_per_s']:>12,.0f}{ratio:>10}")
    sp = results["stream_to_parquet"]
    print(
        f"(stream→parquet: query start included; its {sp['micro_batches']} micro-batches took "
        f"{sp['seconds_in_batches']:.2f} s = {sp['items_per_s_in_batches'] or 0:,.0f} items/s; "
        f"the first {sp['first_batch_seconds'] or 0:.2f} s (it also starts the Python workers), the others "
        f"{sp['items_per_s_after_first_batch'] or 0:,.0f} items/s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
