"""A streaming query the Spark tests run in their own process and SIGKILL mid-run.

python spark_worker.py [--master URL] [--conf KEY=VALUE]... parquet URI DB QUEUE OUT CHECKPOINT [MAX_ROWS [HOLD_AFTER FLAG]]
python spark_worker.py [--master URL] [--conf KEY=VALUE]... copy URI DB QUEUE TARGET CHECKPOINT [MAX_ROWS]

With HOLD_AFTER, the task that meets a seq past it creates FLAG and waits there (the
query is held inside that micro-batch until it is killed). ``--master`` defaults to
local[2]; ``--conf`` settings go over the session's own (``spark_session``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: jvm
sys.path.insert(0, str(Path(__file__).parent))  # conftest

from conftest import spark_env, spark_session


def committed_batches(checkpoint: Path) -> int:
    d = checkpoint / "commits"
    return len([p for p in d.iterdir() if p.name.isdigit()]) if d.exists() else 0


def kill_when(args: list[str], log: Path, until, what: str, timeout: float = 240,
              env: dict[str, str] | None = None, program: list[str] | None = None) -> None:  # fmt: skip
    """Run ``spark_worker.py args`` (a streaming query in a process and JVM of its own;
    ``program`` instead of ``spark_worker.py``), wait for ``until()``, then SIGKILL the
    process and its JVM. A query that dies fails the test at once, one that hangs after
    ``timeout`` seconds, each with its log."""
    from waiting import eventually  # tests/ is on the test process's path, not the query's

    with open(log, "w") as out:
        p = subprocess.Popen([*(program or [sys.executable, __file__]), *args], stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             env=spark_env(env))  # fmt: skip
    try:

        def ready() -> bool:
            assert p.poll() is None, f"the streaming query died (exit {p.returncode})"
            return until()

        try:
            eventually(ready, timeout=timeout, interval=0.1, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log:\n{log.read_text()[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone if it died
            os.killpg(p.pid, signal.SIGKILL)  # the whole group: its JVM too
        p.wait()


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
    argv = sys.argv[1:]
    master, conf = "local[2]", {}
    while argv[0] in ("--master", "--conf"):
        if argv[0] == "--master":
            master = argv[1]
        else:
            key, _, value = argv[1].partition("=")
            conf[key] = value
        argv = argv[2:]
    mode, uri, db, queue, out, checkpoint = argv[:6]
    max_rows = int(argv[6]) if len(argv) > 6 else 200
    hold = (int(argv[7]), argv[8]) if len(argv) > 8 else None
    spark = spark_session("bucketq-killed-query", master, conf)
    q = start(spark, mode, uri, db, queue, out, checkpoint, max_rows=max_rows, hold=hold)
    q.awaitTermination()
