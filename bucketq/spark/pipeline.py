"""A runnable pipeline: log records from a stream-mode queue into Parquet, exactly once.

    python -m bucketq.spark.pipeline --generate 20000 --out ./pipeline-out

1. (``--generate N``) pushes N synthetic log records into the stream queue;
2. a streaming query reads the queue with the ``bucketq`` data source and writes the
   records to ``OUT/logs`` as Parquet partitioned by ``project`` and ``day`` (Spark's
   file sink: exactly-once with the checkpoint in ``OUT/_checkpoint``; stop it at any
   time and run it again, nothing is lost or repeated; a checkpoint made on another
   incarnation of the queue, such as an earlier run's fresh embedded store, stops it
   with a message that says what to do);
3. once the queue is drained (or after ``--duration`` seconds) it writes per-minute
   counts per service and level to ``OUT/counts`` and prints the busiest minutes.

With no ``--mongodb-uri`` (and no ``$BUCKETQ_MONGODB_URI``) an embedded store is started.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: A record's fields as ``bucketq serve`` tees them. ``metadata`` is an object of any shape
#: (numbers, nested objects, an exception): read as STRING, Spark keeps its JSON text, so
#: no field or type is lost and records with different keys share one column (query it
#: with ``get_json_object(metadata, '$.order')`` or ``from_json`` with your schema).
LOG_SCHEMA = (
    "ts TIMESTAMP, project STRING, service STRING, level STRING, message STRING, "
    "metadata STRING, trace_id STRING, span_id STRING"
)
PROJECTS = ("acme", "globex", "initech")
SERVICES = ("api", "worker", "billing", "auth")
LEVELS = ("debug", "info", "info", "info", "warn", "error")
REGIONS = ("eu", "us")


def fake_logs(n: int, seed: int = 1, start: datetime | None = None) -> list[dict[str, Any]]:
    """``n`` log records evenly over 20 minutes around midnight (so over two days)."""
    rng = random.Random(seed)
    t0 = start or datetime(2025, 1, 1, 23, 50, tzinfo=UTC)
    return [
        {
            "ts": (t0 + timedelta(seconds=i * 1200 / n)).isoformat(),
            "project": rng.choice(PROJECTS),
            "service": rng.choice(SERVICES),
            "level": rng.choice(LEVELS),
            "message": f"request {i} took {rng.randint(1, 900)} ms",
            "metadata": {"request": i, "region": rng.choice(REGIONS)},
        }
        for i in range(n)
    ]


def build_session(
    master: str = "local[*]", shuffle_partitions: int = 2, bind_address: str | None = None
) -> Any:
    """The pipeline's session: bound to 127.0.0.1 for a local master unless
    ``bind_address`` (or ``$SPARK_LOCAL_IP``) says otherwise; no console progress bar
    (the pipeline prints its own lines)."""
    from pyspark.sql import SparkSession

    from . import register
    from ._session import prepare_session

    builder = (
        SparkSession.builder.master(master)
        .appName("bucketq-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    )
    for key, value in prepare_session(master, bind_address).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_query(
    spark: Any,
    uri: str,
    database: str,
    queue: str,
    out: Path,
    *,
    trigger: str,
    max_rows: int | None = None,
) -> Any:
    """The streaming query: queue → parsed logs → Parquet by project and day."""
    from pyspark.sql import functions as F

    src = (
        spark.readStream.format("bucketq")
        .option("uri", uri)
        .option("database", database)
        .option("queue", queue)
    )
    if max_rows:
        src = src.option("maxRowsPerTrigger", str(max_rows))
    src = src.load()
    logs = (
        src.select("seq", "index", F.from_json("payload", LOG_SCHEMA).alias("r"))
        .select("seq", "index", "r.*")
        .withColumn("day", F.to_date("ts"))
    )
    return (
        logs.writeStream.format("parquet")
        .option("path", str(out / "logs"))
        .option("checkpointLocation", str(out / "_checkpoint"))
        .partitionBy("project", "day")
        .trigger(processingTime=trigger)
        .start()
    )


def write_counts(spark: Any, out: Path) -> Any:
    """Per-minute counts per service and level from everything stored so far."""
    from pyspark.sql import functions as F

    logs = spark.read.parquet(str(out / "logs"))
    counts = (
        logs.groupBy(F.date_trunc("minute", "ts").alias("minute"), "service", "level")
        .count()
        .orderBy("minute", "service", "level")
    )
    counts.write.mode("overwrite").parquet(str(out / "counts"))
    return spark.read.parquet(str(out / "counts"))


def push_logs(uri: str, database: str, queue: str, records: list[dict[str, Any]]) -> float:
    from pymongo import MongoClient

    from ..bucket.deadline import client_timeouts
    from ..stream import StreamQueue

    t = time.perf_counter()
    client: MongoClient[dict[str, Any]]
    with MongoClient(uri, **client_timeouts(uri)) as client:
        q = StreamQueue(client[database], queue)
        q.push_many(records)
        q.close()
    return time.perf_counter() - t


def run(args: argparse.Namespace, uri: str) -> int:
    out = Path(args.out)
    if args.generate:
        secs = push_logs(uri, args.database, args.queue, fake_logs(args.generate, args.seed))
        print(
            f"pushed {args.generate} log records into {args.database}.{args.queue} in {secs:.2f} s"
        )
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # reuse a caller's session, never stop it
    spark = build_session(args.master, bind_address=args.bind_address)
    try:
        query = start_query(
            spark, uri, args.database, args.queue, out, trigger=args.trigger, max_rows=args.max_rows
        )
        t = time.perf_counter()
        try:
            if args.duration:
                query.awaitTermination(args.duration)
            else:
                query.processAllAvailable()
        except StreamingQueryException as exc:
            why = other_incarnation(str(exc))
            if why is None:
                raise
            # Not "delete the checkpoint": the Parquet sink keeps its own log of the
            # batches it wrote, and a new checkpoint's first batches would be skipped by it
            # (and acknowledged in the queue): a new output folder has neither.
            print(f"bucketq pipeline: {why}\n\nThe checkpoint is {out / '_checkpoint'}. Without "
                  "--uri each run starts a fresh embedded store, whose queue "
                  f"{args.queue!r} is another incarnation. To read this store's queue, give "
                  f"another --out (or move {out} aside); to go on where the checkpoint stopped, "
                  "give --uri of the store it was made with.", file=sys.stderr)  # fmt: skip
            return 1
        finally:
            query.stop()
        secs = time.perf_counter() - t
        stored = spark.read.parquet(str(out / "logs"))
        total = stored.count()
        print(
            f"streamed into {out / 'logs'} (partitioned by project, day): {total} records in total; ran {secs:.1f} s"
        )
        counts = write_counts(spark, out)
        print(
            f"per-minute counts per service and level: {out / 'counts'} ({counts.count()} rows); busiest:"
        )
        for r in counts.orderBy(counts["count"].desc()).limit(5).collect():
            print(f"  {r.minute:%Y-%m-%d %H:%M}  {r.service:<8} {r.level:<6} {r['count']}")
    finally:
        if owned:
            spark.stop()
    return 0


def other_incarnation(failure: str) -> str | None:
    """The source's refusal of a checkpoint from another incarnation of its stream, out of
    a failed query's text (Spark wraps it in the Python worker's traceback), or None."""
    m = re.search(
        r"(This query's checkpoint was made reading stream .*?made with\.)", failure, re.S
    )
    return " ".join(m.group(1).split()) if m else None


DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The pipeline's options, on ``p`` (``bucketq pipeline`` and ``python -m`` share them)."""
    from .. import _validate as v

    v.add_mongodb_uri(p, v.STARTS_ONE, "--uri", dest="uri")
    p.add_argument("--database", default="bucketq")
    p.add_argument("--queue", default="logs", help="the stream-mode queue to read (default: logs)")
    p.add_argument("--out", default="pipeline-out", help="output directory (Parquet + checkpoint)")
    p.add_argument(
        "--generate",
        type=v.cli_count(0),
        default=0,
        metavar="N",
        help="push N synthetic log records first",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--duration",
        type=v.cli_number(0, unit="seconds"),
        default=0,
        help="stream for this many seconds (default: until drained)",
    )
    p.add_argument("--trigger", default="1 second", help="micro-batch interval (default: 1 second)")
    p.add_argument(
        "--max-rows",
        type=v.cli_count(1),
        default=None,
        help="rows per micro-batch at most (default: the source's maxRowsPerTrigger, 1,000,000)",
    )
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--bind-address",
        default=None,
        help="address Spark's driver binds to (default: $SPARK_LOCAL_IP, else 127.0.0.1 "
        "for a local master, else Spark's choice)",
    )
    return p


def parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog="bucketq pipeline", description=DESCRIPTION))


def main(argv: list[str] | None = None) -> int:
    return run_from_args(parser().parse_args(argv))


def run_from_args(args: argparse.Namespace) -> int:
    from .. import _validate as v
    from ..embedded import mongodb
    from . import _need_pyspark

    _need_pyspark()  # a clear "pip install 'bucketq[spark]'" before any server starts
    given = v.mongodb_uri(args.uri, running_store=False)
    with mongodb(given or None) as uri:
        if not given and not args.generate:
            print("no --mongodb-uri given: using a fresh embedded store; add --generate N to "
                  "have data")  # fmt: skip
        return run(args, uri)


if __name__ == "__main__":
    sys.exit(main())
