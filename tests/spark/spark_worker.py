"""A streaming query the Spark tests run in their own process and SIGKILL mid-run.

python spark_worker.py parquet URI DB QUEUE OUT CHECKPOINT
python spark_worker.py copy URI DB QUEUE TARGET CHECKPOINT
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import spark_session


def start(spark, mode, uri, db, queue, out, checkpoint):
    src = (
        spark.readStream.format("bucketq")
        .option("uri", uri)
        .option("database", db)
        .option("queue", queue)
        .option("maxRowsPerTrigger", "200")
        .load()
    )
    if mode == "parquet":
        w = src.select("seq", "index", "payload").writeStream.format("parquet").option("path", out)
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
    return (
        w.option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )


if __name__ == "__main__":
    mode, uri, db, queue, out, checkpoint = sys.argv[1:7]
    spark = spark_session("bucketq-killed-query", "local[2]")
    q = start(spark, mode, uri, db, queue, out, checkpoint)
    print("started", flush=True)
    q.awaitTermination()
