"""The data source on Spark's own standalone cluster: a master and two workers, each a
process of its own (started from the installed pyspark, bound to 127.0.0.1), one
executor of one core per worker. `bucketq pipeline --master spark://...` runs its driver
in a process of its own, as a user's would, its tasks on both workers' executors; it is
SIGKILLed mid-run and run again from its checkpoint.

One cluster for the module (the xdist group keeps its tests on one worker, so it starts
once); no local session is started in this process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from conftest import cluster_app, jvm_options, spark_env
from spark_worker import committed_batches, kill_when

from bucketq.spark.pipeline import fake_logs
from bucketq.stream import StreamQueue
from waiting import eventually

#: A driver's run here (its JVM, two executors' JVMs and Python workers, the query) is
#: slow on a loaded machine: the bounds catch a run that hangs, never a slow one.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.xdist_group("spark-cluster"),
    pytest.mark.timeout(600),
]

#: A whole driver's run: a generous bound, never waited, under the test's own 600 s so
#: that a run that hangs fails with its output.
RUN_TIMEOUT = 540


def run_driver(args: list[str]) -> subprocess.CompletedProcess:
    """Run a driver process to its end; a run that hangs fails with what it printed."""
    try:
        return subprocess.run(args, capture_output=True, text=True, env=driver_env(),
                              timeout=RUN_TIMEOUT)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(
            errors="replace"
        )
        raise AssertionError(
            f"{args[1:4]} still running after {RUN_TIMEOUT} s:\n{said[-4000:]}"
        ) from None


class Cluster:
    """A standalone master and two workers (``spark-class``), stopped with their executors."""

    def __init__(self, home: Path, logs: Path) -> None:
        self.home, self.logs = home, logs
        self.procs: list[subprocess.Popen] = []
        self.work = [logs / "work-1", logs / "work-2"]
        self.url = ""

    def _start(self, name: str, *args: str) -> Path:
        log = self.logs / f"{name}.log"
        env = spark_env(
            dict(
                os.environ,
                SPARK_LOCAL_IP="127.0.0.1",
                SPARK_DAEMON_MEMORY="256m",
                SPARK_DAEMON_JAVA_OPTS=jvm_options(),
                SPARK_NO_DAEMONIZE="1",
            )
        )
        with open(log, "w") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(self.home / "bin" / "spark-class"), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )  # fmt: skip
            )
        return log

    def _wait_log(self, log: Path, pattern: str, what: str) -> re.Match:
        def seen() -> re.Match | None:
            assert all(p.poll() is None for p in self.procs), f"{what}: a process exited"
            return re.search(pattern, log.read_text())

        try:
            return eventually(seen, timeout=120, interval=0.1, what=what)
        except AssertionError as exc:
            tails = "\n".join(
                f"--- {p.name}\n{p.read_text()[-2000:]}" for p in self.logs.glob("*.log")
            )
            raise AssertionError(f"{exc}\n{tails}") from None

    def start(self) -> Cluster:
        master = self._start("master", "org.apache.spark.deploy.master.Master",
                             "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")  # fmt: skip
        m = self._wait_log(master, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)",
                           "the master listening")  # fmt: skip
        self.url = m[1]
        for i, work in enumerate(self.work, 1):
            work.mkdir()
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                        "--host", "127.0.0.1", "--cores", "1", "--memory", "768m",
                        "--webui-port", "0", "--work-dir", str(work))  # fmt: skip
        self._wait_log(
            master, r"(?s)(Registering worker 127\.0\.0\.1.*){2}", "two workers registered"
        )
        return self

    def stop(self) -> None:
        for p in self.procs:  # each group: the worker's executors too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def apps_ran_on(self) -> list[int]:
        """How many applications each worker ran executors for (their work directories)."""
        return [len(list(w.glob("app-*"))) for w in self.work]


@pytest.fixture(scope="module")
def cluster(java, tmp_path_factory):
    import pyspark

    c = Cluster(Path(pyspark.__file__).parent, tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


def driver_env() -> dict[str, str]:
    """A driver process's environment: the cluster's executor settings and small JVMs
    through ``PYSPARK_SUBMIT_ARGS`` (what spark-submit's ``--conf`` would say)."""
    conf = " ".join(f"--conf {k}={v}" for k, v in cluster_app().items() if "Java" not in k)
    jvm = jvm_options()
    opts = f'--driver-java-options "{jvm}" --conf "spark.executor.extraJavaOptions={jvm}"'
    return spark_env(dict(os.environ, PYSPARK_SUBMIT_ARGS=f"{conf} {opts} pyspark-shell"))


def committed_parquet(out: Path) -> list[Path]:
    """The files a Parquet sink committed (its ``_spark_metadata`` log, as Spark reads
    it): a killed micro-batch may have left files of its own beside them."""
    added: set[str] = set()
    for log in (out / "_spark_metadata").iterdir():
        if log.name.startswith("."):
            continue
        for line in log.read_text().splitlines()[1:]:  # the first line is the log's version
            entry = json.loads(line)
            (added.add if entry["action"] == "add" else added.discard)(entry["path"])
    return [Path(urlparse(a).path) for a in added]


def test_the_pipeline_killed_on_a_standalone_cluster_and_run_again_stores_each_record_once(
    cluster, db, mongo_uri, db_name, tmp_path
):
    """`bucketq pipeline --master spark://...` SIGKILLed after three micro-batches, records
    arriving while it is down, and run again to the end: every record in Parquet exactly
    once, partitioned by project, counted; both runs' tasks ran on both workers."""
    records = fake_logs(3000)
    q = StreamQueue(db, "logs", bucket_max_size=50, bucket_max_wait=0.05)
    q.push_many(records[:2000], durable=True)  # 40 buckets; 200 rows per micro-batch
    out = tmp_path / "out"
    pipeline = [sys.executable, "-m", "bucketq", "pipeline", "--master", cluster.url,
                "--uri", mongo_uri, "--database", db_name, "--out", str(out),
                "--trigger", "0 seconds"]  # fmt: skip
    before = cluster.apps_ran_on()
    kill_when(["--max-rows", "200"], tmp_path / "killed.log",
              lambda: committed_batches(out / "_checkpoint") >= 3,
              "3 committed micro-batches on the cluster", timeout=RUN_TIMEOUT,
              env=driver_env(), program=pipeline)  # fmt: skip
    done_before = committed_batches(out / "_checkpoint")
    assert done_before < 10, "killed before it was done"
    q.push_many(records[2000:], durable=True)  # more arrive while it is down
    run = run_driver(pipeline)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert any(
        re.fullmatch(r"streamed into .*: 3000 records in total; ran .* s", x)
        for x in run.stdout.splitlines()
    ), "the summary is a line of its own: " + run.stdout
    files = committed_parquet(out / "logs")
    requests = Counter(
        int(re.match(r"request (\d+) ", m)[1])
        for f in files
        for m in pq.read_table(f, columns=["message"]).column("message").to_pylist()
    )
    assert requests == Counter(range(3000)), "each record exactly once"
    assert {f.parent.parent.name for f in files} == {
        "project=acme",
        "project=globex",
        "project=initech",
    }
    assert sum(pq.read_table(out / "counts").column("count").to_pylist()) == 3000
    # a micro-batch's buckets are acknowledged when the next one starts: the first run's
    # batches are, the second run's one batch awaits its successor
    assert q.position()["acked"] >= 4 * done_before
    assert [a - b for a, b in zip(cluster.apps_ran_on(), before, strict=True)] == [2, 2], (
        "both runs' executors ran on both workers"
    )
