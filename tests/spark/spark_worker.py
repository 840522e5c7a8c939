"""A streaming query the Spark tests run in their own process and SIGKILL mid-run.

python spark_worker.py parquet URI DB QUEUE OUT CHECKPOINT [MAX_ROWS [HOLD_AFTER FLAG]]
python spark_worker.py copy URI DB QUEUE TARGET CHECKPOINT [MAX_ROWS]

With HOLD_AFTER, the task that meets a seq past it creates FLAG and waits there (the
query is held inside that micro-batch until it is killed).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import spark_session


def hold_past(after: int, flag: str):
    def f(seq):
        if seq > after:
            import os
            import time

            open(flag, "a").close()
            end = time.monotonic() + 600  # killed long before; never left behind
            while time.monotonic() < end and os.path.exists(flag):
                time.sleep(0.2)
        return seq

    return f


def start(spark, mode, uri, db, queue, out, checkpoint, *, max_rows=200, available_now=False,
          hold=None):  # fmt: skip
    """``hold``: (seq, flag file) for :func:`hold_past`."""
    src = (
        spark.readStream.format("bucketq")
        .option("uri", uri)
        .option("database", db)
        .option("queue", queue)
        .option("maxRowsPerTrigger", str(max_rows))
        .load()
    )
    if mode == "parquet":
        seq = src.seq
        if hold is not None:
            from pyspark.sql import functions as F

            seq = F.udf(hold_past(*hold), "long")(seq)
        w = (
            src.select(seq.alias("seq"), "index", "payload")
            .writeStream.format("parquet")
            .option("path", out)
        )
    else:
        w = (
            src.select("payload")
            .writeStream.format("bucketq")
            .option("uri", uri)
            .option("database", db)
            .option("queue", out)
            .option("mode", "stream")
            .option("writerId", "copy-test")
        )
    w = w.option("checkpointLocation", checkpoint)
    if available_now:
        return w.trigger(availableNow=True).start()
    return w.trigger(processingTime="200 milliseconds").start()


if __name__ == "__main__":
    mode, uri, db, queue, out, checkpoint = sys.argv[1:7]
    max_rows = int(sys.argv[7]) if len(sys.argv) > 7 else 200
    hold = (int(sys.argv[8]), sys.argv[9]) if len(sys.argv) > 9 else None
    spark = spark_session("bucketq-killed-query", "local[2]")
    q = start(spark, mode, uri, db, queue, out, checkpoint, max_rows=max_rows, hold=hold)
    q.awaitTermination()
