#!/usr/bin/env python3
"""Items/s from bucketq queues into Parquet through the ``bucketq`` Spark data source
on local[2] (or a standalone cluster), beside Spark's own floors for the same rows.

    python bench/spark_bench.py --repeat 3      # 100,000 items, medians of 3 runs
    python bench/spark_bench.py --quick         # 20,000 items
    python bench/spark_bench.py --cpu           # + CPU seconds per streaming query by process
    python bench/spark_bench.py --json out.json --mongodb-uri mongodb://...
    python bench/spark_bench.py --master spark://127.0.0.1:7077 --conf spark.executor.memory=512m

Contenders, run one after the other in ONE process against ONE server, ``--repeat``
times (each run with new queues, a new checkpoint and new output):
  stream→parquet       streaming query (offsets = seqs, acks on commit) until drained,
                       its start included
  stream, K partition(s) with --also-partitions K: the same, numPartitions=K (another copy)
  batch→parquet        batch read of the same items (a second copy in another stream)
  floor: python stream the same rows (an Arrow file the bench wrote) through a minimal
                       Python streaming data source into Parquet: what PySpark's Python
                       data sources cost with no MongoDB and no decoding
  floor: python batch  the same, as a batch read
  floor: memory        the same rows cached in Spark into Parquet: Spark's own write

The first run also starts the executors' Python workers (the JVM is warmed up before);
later runs reuse them, as a long-lived Spark application does. Medians are printed, and
each run's figures are in the JSON. On the embedded server (SecantusDB) per-operation
costs are 10-100x those of mongod.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)


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


# -- the floor's data source: rows from an Arrow file, no MongoDB, no decoding -----------


class RowRange(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi


def _read_rows(path: str, lo: int, hi: int):
    import pyarrow as pa

    table = pa.ipc.open_file(pa.memory_map(path)).read_all()
    yield from table.slice(lo, hi - lo).to_batches(max_chunksize=10_000)


def _split(lo: int, hi: int, parts: int) -> list[RowRange]:
    step = max(1, -(-(hi - lo) // parts))
    return [RowRange(a, min(a + step, hi)) for a in range(lo, hi, step)]


class ArrowFileSource(DataSource):
    """Options ``path`` (an Arrow IPC file of the source's rows), ``rows``, ``parts``."""

    @classmethod
    def name(cls) -> str:
        return "bucketq_bench_arrow_file"

    def schema(self) -> str:
        return (
            "seq LONG, bucket STRING, index INT, payload STRING, headers STRING, "
            "mature TIMESTAMP, tries INT"
        )

    def reader(self, schema: Any) -> DataSourceReader:
        return ArrowFileReader(self.options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ArrowFileStreamReader(self.options)


class ArrowFileReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path, self.rows, self.parts = options["path"], int(options["rows"]), 2

    def partitions(self) -> list[InputPartition]:
        return _split(0, self.rows, self.parts)

    def read(self, partition: Any):
        return _read_rows(self.path, partition.lo, partition.hi)


class ArrowFileStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path, self.rows, self.parts = options["path"], int(options["rows"]), 2
        self.max_rows = int(options.get("maxRowsPerTrigger") or 0) or None

    def initialOffset(self) -> dict:
        return {"row": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        begin = int(start["row"]) if start else 0
        end = self.rows if self.max_rows is None else min(self.rows, begin + self.max_rows)
        return {"row": end}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return _split(int(start["row"]), int(end["row"]), self.parts)

    def read(self, partition: Any):
        return _read_rows(self.path, partition.lo, partition.hi)

    def commit(self, end: dict) -> None:
        pass


# -- CPU by process (--cpu) --------------------------------------------------------------

#: What a process of this bench's tree is, by its command line (the first match).
CPU_KINDS = (
    ("python_streaming_source_runner", "source runner (per query)"),
    ("pyspark.daemon pyspark.worker", "executors' Python workers"),
    ("pyspark.sql.worker.", "planners' Python workers"),
    ("secantus", "MongoDB server (embedded)"),
    ("java", "JVM"),
    ("spark-submit", "JVM"),
    ("spark-class", "JVM"),
)


class CpuByProcess:
    """CPU seconds (user + system) of this process and its descendants, by kind
    (:data:`CPU_KINDS`), from ``/proc`` (Linux), sampled every ``interval`` seconds by a
    thread: a process is counted until its last sample, so one that lives a fraction of
    a second (a query's source runner, ~0.5 s) loses at most one interval's CPU."""

    def __init__(self, interval: float = 0.05) -> None:
        self.root, self.interval = os.getpid(), interval
        self.tick = os.sysconf("SC_CLK_TCK")
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cpu-by-process", daemon=True)
        self.thread.start()

    def _kind(self, pid: int) -> str:
        if pid == self.root:
            return "bench (driver's Python)"
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "other"
        return next((kind for key, kind in CPU_KINDS if key in cmd), "other")

    def _sample(self) -> None:
        stats: dict[int, tuple[int, float]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                except OSError:
                    continue
                stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / self.tick)
        tree, grew = {self.root}, True
        while grew:
            more = {pid for pid, (ppid, _) in stats.items() if ppid in tree} - tree
            tree |= more
            grew = bool(more)
        with self.lock:
            for pid in tree:
                old = self.seen.get(pid)
                kind = old[0] if old is not None and old[0] != "other" else self._kind(pid)
                self.seen[pid] = (kind, stats[pid][1])

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            self._sample()

    def totals(self) -> dict[str, float]:
        """CPU seconds so far by kind (exited processes included)."""
        self._sample()
        out: dict[str, float] = {}
        with self.lock:
            for kind, cpu in self.seen.values():
                out[kind] = out.get(kind, 0.0) + cpu
        return out

    def close(self) -> None:
        self.done.set()
        self.thread.join()


def cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        k: round(v - before.get(k, 0.0), 3)
        for k, v in after.items()
        if v - before.get(k, 0.0) > 0.0005
    }


# -- one run -----------------------------------------------------------------------------


def stream_figures(n: int, seconds: float, t0: float, progress: list[dict]) -> dict[str, Any]:
    """A streaming run's figures from ``query.recentProgress``."""
    batches = [p for p in progress if p["numInputRows"]]
    ms = [p["durationMs"] for p in batches]
    in_batches = sum(d.get("triggerExecution", 0) for d in ms) / 1000
    first = ms[0].get("triggerExecution", 0) / 1000 if ms else 0.0
    later_rows = sum(p["numInputRows"] for p in batches[1:])
    later_s = sum(d.get("triggerExecution", 0) for d in ms[1:]) / 1000
    out: dict[str, Any] = {
        "seconds": seconds,
        "items_per_s": n / seconds,
        "micro_batches": len(batches),
        "seconds_in_batches": in_batches,
        "items_per_s_in_batches": n / in_batches if in_batches else None,
        "first_batch_seconds": first,
        "items_per_s_after_first_batch": later_rows / later_s if later_s else None,
        # the query's start: start() until its first micro-batch began
        "start_seconds": max(0.0, seconds - in_batches),
    }
    for key in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets"):
        out[f"ms_{key}"] = [d.get(key, 0) for d in ms]
    return out


def run_stream(
    spark: Any, fmt: str, opts: dict[str, str], out: Path, n: int, cpu: CpuByProcess | None = None
) -> dict[str, Any]:
    before = cpu.totals() if cpu else {}
    t = time.perf_counter()
    query = (
        spark.readStream.format(fmt)
        .options(**opts)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "ckpt"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    query.processAllAvailable()
    seconds = time.perf_counter() - t
    progress = list(query.recentProgress)
    query.stop()
    used = cpu_between(before, cpu.totals()) if cpu else None  # the source runner exits at stop
    got = spark.read.parquet(str(out / "data")).count()
    assert got == n, f"{fmt} stream→parquet stored {got} of {n} rows"
    res = stream_figures(n, seconds, t, progress)
    if used is not None:
        res["cpu_seconds"] = used
    return res


def timed(n: int, f: Any) -> dict[str, Any]:
    t = time.perf_counter()
    f()
    s = time.perf_counter() - t
    return {"seconds": s, "items_per_s": n / s}


def one_run(
    spark: Any, db: Any, uri: str, n: int, args: Any, tmp: Path, cpu: CpuByProcess | None
) -> dict[str, Any]:
    import pyarrow as pa

    from bucketq.bucket.codec import CODEC_OPTIONS
    from bucketq.spark import _ops as ops
    from bucketq.stream import StreamQueue

    extra = [f"bench_stream_p{k}" for k in args.also_partitions]
    names = ["bench_stream", "bench_batch", *extra]
    for name in names:
        db.drop_collection(name)
        db.drop_collection(name + ".meta")
    items = payloads(n)
    res: dict[str, Any] = {}
    t = time.perf_counter()
    for name in names:
        q = StreamQueue(db, name)
        q.push_many(items)
        q.close()
    push_s = (time.perf_counter() - t) / len(names)
    res["push"] = {"items": n, "seconds": push_s, "items_per_s": n / push_s}

    # The floor's rows: exactly what the source yields for this stream, as an Arrow file.
    arrow = tmp / "rows.arrow"
    docs = db.get_collection("bench_batch", codec_options=CODEC_OPTIONS).find().sort("_id")
    batches = list(ops.arrow_batches(docs, "json", "stream"))
    with pa.ipc.new_file(str(arrow), batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)

    opts = {"uri": uri, "database": db.name, "numPartitions": str(args.partitions)}
    limit = {"maxRowsPerTrigger": str(args.max_rows)} if args.max_rows else {}
    res["stream_to_parquet"] = run_stream(
        spark, "bucketq", {**opts, "queue": "bench_stream", **limit}, tmp / "stream", n, cpu
    )
    for k, name in zip(args.also_partitions, extra, strict=True):
        res[f"stream_to_parquet_p{k}"] = run_stream(
            spark, "bucketq", {**opts, "numPartitions": str(k), "queue": name, **limit},
            tmp / name, n, cpu,
        )  # fmt: skip
    res["batch_to_parquet"] = timed(
        n,
        lambda: (
            spark.read.format("bucketq")
            .options(**opts, queue="bench_batch")
            .load()
            .write.parquet(str(tmp / "batch"))
        ),
    )
    fopts = {"path": str(arrow), "rows": str(n), **limit}
    res["floor_python_stream"] = run_stream(
        spark, ArrowFileSource.name(), fopts, tmp / "fstream", n, cpu
    )
    res["floor_python_batch"] = timed(
        n,
        lambda: (
            spark.read.format(ArrowFileSource.name())
            .options(**fopts)
            .load()
            .write.parquet(str(tmp / "fbatch"))
        ),
    )
    df = spark.read.format(ArrowFileSource.name()).options(**fopts).load().cache()
    df.count()
    res["floor_memory"] = timed(n, lambda: df.write.parquet(str(tmp / "floor")))
    df.unpersist()
    for p in tmp.iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    return res


ROWS = (
    ("push", "push (not Spark)"),
    ("stream_to_parquet", "stream→parquet"),
    ("batch_to_parquet", "batch→parquet"),
    ("floor_python_stream", "floor: python stream"),
    ("floor_python_batch", "floor: python batch"),
    ("floor_memory", "floor: memory"),
)

DEFAULT_N = 100_000
#: The stream's target: items/s into Parquet with the query's start included, at
#: ``DEFAULT_N`` items, medians of 3 runs.
STREAM_TARGET = 50_000


def median_of(runs: list[dict[str, Any]], key: str, field: str) -> float | None:
    vals = [r[key][field] for r in runs if r[key].get(field) is not None]
    return statistics.median(vals) if vals else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--quick", action="store_true", help="20,000 items")
    ap.add_argument("--repeat", type=int, default=1, help="runs; medians are printed")
    ap.add_argument("--mongodb-uri", default=None)
    ap.add_argument(
        "--master", default="local[2]", help="local[N] or a standalone cluster's spark://host:port"
    )
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable), e.g. spark.executor.memory=512m on a cluster",
    )
    ap.add_argument(
        "--max-rows", type=int, default=None, help="maxRowsPerTrigger (default: the source's)"
    )
    ap.add_argument("--partitions", type=int, default=2, help="numPartitions of the source")
    ap.add_argument(
        "--also-partitions",
        type=int,
        action="append",
        default=[],
        metavar="K",
        help="also stream another copy with numPartitions=K, right after the first (repeatable)",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="CPU seconds of each streaming query by process (JVM, the source runner, the "
        "executors' Python workers, the embedded server), sampled from /proc (Linux) every "
        "50 ms by a thread that costs CPU itself; this process's descendants only (not a "
        "cluster's executors)",
    )
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)
    n = 20_000 if args.quick else args.n

    import pymongo
    import pyspark
    from pymongo import MongoClient
    from pyspark.sql import SparkSession

    from bucketq.benchmark.machine import Run
    from bucketq.embedded import mongodb
    from bucketq.spark import prepare_session, register

    bench_run = Run("python bench/spark_bench.py", ["python", "bench/spark_bench.py", *argv])
    bench_run.__enter__()
    tmp = Path(tempfile.mkdtemp(prefix="bucketq-spark-bench-"))
    runs: list[dict[str, Any]] = []
    loads: list[tuple[float, float, float]] = []
    with mongodb(args.mongodb_uri) as uri:
        server = (
            "given URI" if args.mongodb_uri else "embedded SecantusDB (or $BUCKETQ_MONGODB_URI)"
        )
        client = MongoClient(uri)
        db = client["bucketq_spark_bench"]
        client.drop_database(db.name)
        builder = (
            SparkSession.builder.master(args.master)
            .appName("bucketq-spark-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
        )
        settings = prepare_session(args.master)
        settings.update(kv.split("=", 1) for kv in args.conf)
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(ArrowFileSource)
        # warm-up: one tiny Parquet write, so the JVM's start is nobody's cost
        spark.range(10).write.mode("overwrite").parquet(str(tmp / "warm"))
        shutil.rmtree(tmp / "warm")
        cpu = CpuByProcess() if args.cpu else None
        rows = [
            *ROWS[:2],
            *(
                (f"stream_to_parquet_p{k}", f"stream, {k} partition(s)")
                for k in args.also_partitions
            ),
            *ROWS[2:],
        ]
        for i in range(args.repeat):
            loads.append(os.getloadavg())
            runs.append(one_run(spark, db, uri, n, args, tmp, cpu))
            r = runs[-1]
            print(
                f"run {i + 1}/{args.repeat} (load {loads[-1][0]:.1f}): "
                + ", ".join(f"{k} {r[k]['items_per_s']:,.0f}" for k, _ in rows[1:])
                + " items/s",
                flush=True,
            )
        loads.append(os.getloadavg())
        if cpu:
            cpu.close()
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
        "conf": args.conf,
        "n": n,
        "repeat": args.repeat,
        "payload_bytes": round(sum(len(json.dumps(p)) for p in payloads(1000)) / 1000),
        "maxRowsPerTrigger": args.max_rows or "source default",
        "numPartitions": args.partitions,
        "also_numPartitions": args.also_partitions,
        "load_average_1m": [round(x[0], 2) for x in loads],
    }
    print(
        f"\nbucketq Spark benchmark: {n:,} items (~{env['payload_bytes']} B JSON), {args.master}, "
        f"{server}; medians of {args.repeat} run(s); load average (1 min) "
        + " → ".join(f"{x[0]:.1f}" for x in loads)
    )
    floor = median_of(runs, "floor_memory", "items_per_s") or 1.0
    print(f"{'contender':<24}{'seconds':>10}{'items/s':>12}{'vs memory':>11}")
    for key, label in rows:
        s, ips = median_of(runs, key, "seconds"), median_of(runs, key, "items_per_s")
        ratio = "" if key == "push" else f"{(ips or 0) / floor:.2f}x"
        print(f"{label:<24}{s or 0:>10.2f}{ips or 0:>12,.0f}{ratio:>11}")
    stream_ips = median_of(runs, "stream_to_parquet", "items_per_s") or 0.0
    met = "met" if stream_ips >= STREAM_TARGET else "MISSED"
    if n != DEFAULT_N or args.repeat < 3:  # the first run starts the Python workers
        met = f"for {DEFAULT_N:,} items, medians of 3 runs; not this run's settings"
    print(
        f"stream→parquet, the query's start included: {stream_ips:,.0f} items/s "
        f"(target >= {STREAM_TARGET:,}: {met})"
    )
    streams = [("stream_to_parquet", "stream")]
    streams += [
        (f"stream_to_parquet_p{k}", f"stream, {k} partition(s)") for k in args.also_partitions
    ]
    streams.append(("floor_python_stream", "floor"))
    for key, label in streams:
        print(
            f"({label}: start {median_of(runs, key, 'start_seconds') or 0:.2f} s, "
            f"{median_of(runs, key, 'micro_batches') or 0:.0f} micro-batch(es) in "
            f"{median_of(runs, key, 'seconds_in_batches') or 0:.2f} s = "
            f"{median_of(runs, key, 'items_per_s_in_batches') or 0:,.0f} items/s; "
            f"first run's first micro-batch {runs[0][key]['first_batch_seconds']:.2f} s)"
        )
    if args.cpu:
        # A cluster's executors are its workers' children, not this process's descendants.
        uncounted = "" if args.master.startswith("local") else "; the executors not counted"
        for key, label in streams:
            kinds = sorted({k for r in runs for k in r[key]["cpu_seconds"]})
            med = {
                k: statistics.median(r[key]["cpu_seconds"].get(k, 0.0) for r in runs) for k in kinds
            }
            print(
                f"({label}: CPU seconds per query, medians: "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(med.items(), key=lambda x: -x[1]))
                + f"; total {sum(med.values()):.2f}{uncounted})"
            )
    if args.json:
        doc = {
            "env": env,
            "targets": {
                "stream_to_parquet_items_per_s": {"median": stream_ips, "target": STREAM_TARGET}
            },
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))
        bench_run.__exit__(None, None, None)
        bench_run.stamp(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
