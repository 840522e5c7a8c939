"""The JVMs the tests start (Spark's drivers and executors, a standalone cluster's
daemons, the README walk's pipeline): their options, and one archive of the classes they
load that they all map instead of loading them anew.

Each JVM spends much of its start loading and linking the same few thousand classes of
Spark's jars. A dynamic class-data archive (``-XX:ArchiveClassesAtExit``, JDK 13 and
newer) holds them ready to map; a JVM given one (``-XX:SharedArchiveFile``) starts on
a fraction of the CPU. It is made once per machine, Java and pyspark by a short Spark
job (:func:`class_archive`) and kept in the user's cache directory
(``$XDG_CACHE_HOME/bucketq-tests``); a JVM that cannot use it (another class path)
loads its classes as without it, and so does every JVM when it cannot be made.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The tests start several drivers (the session, each killed query's process) and run
#: short jobs whose work is mostly in the Python workers: the client compiler alone and
#: the serial collector start a driver faster on few cores. Spark's jars are not
#: bytecode-verified (the JDK's own classes never are), which saves CPU in every one of
#: the JVMs the tests start: they test Spark's use, not its jars.
JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)

#: How long a test waits for another test process making the archive before it goes on
#: without it.
MAKE_TIMEOUT = 240.0
#: After a failed attempt, how long test runs go on without the archive before one tries
#: to make it again (an attempt that times out holds a test worker that long).
RETRY_AFTER = 24 * 3600.0

#: The Spark job whose classes go into the archive: a session, a shuffle, JSON, Parquet
#: and a streaming query, as the tests' own jobs use them.
_JOB = """
import sys
from pyspark.sql import SparkSession
out = sys.argv[1]
s = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
     .config("spark.sql.shuffle.partitions", "2").getOrCreate())
jvm = s.sparkContext._gateway.proc
s.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
s.read.json(s.sparkContext.parallelize(['{"a": 1}'])).write.json(out + "/in")
q = (s.readStream.schema("a LONG").json(out + "/in").writeStream.format("parquet")
     .option("path", out + "/stream").option("checkpointLocation", out + "/checkpoint")
     .start())
q.processAllAvailable()
q.stop()
s.stop()
jvm.stdin.close()  # the gateway's JVM exits, writing the archive; waited for
sys.exit(jvm.wait())
"""


def java_command() -> str | None:
    """$JAVA_HOME/bin/java, else java on PATH (what Spark's launcher runs)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return java if java and os.path.exists(java) else None


def _archive_path() -> Path | None:
    """Where the archive for this Java, pyspark and :data:`JVM_OPTIONS` lives (made or
    not), or None without Java or pyspark."""
    java = java_command()
    try:
        import pyspark
    except ImportError:
        return None
    if java is None:
        return None
    real = Path(java).resolve()
    stat = real.stat()
    key = "\n".join([str(real), str(stat.st_size), str(stat.st_mtime_ns), pyspark.__file__,
                     pyspark.__version__, JVM_OPTIONS])  # fmt: skip
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bucketq-tests"
    return cache / f"spark-classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def jvm_options(tmp: str) -> str:
    """:data:`JVM_OPTIONS`, the JVM's temporary files (Spark's block managers and shuffle
    files, its native libraries) in ``tmp``, no perf-data file in /tmp, and the class
    archive when it has been made."""
    options = f"{JVM_OPTIONS} -XX:-UsePerfData -Djava.io.tmpdir={tmp}"
    archive = _archive_path()
    if archive is not None and archive.exists():
        options += f" -XX:SharedArchiveFile={archive}"
    return options


def class_archive(tmp: str) -> Path | None:
    """The class archive, made first if it is not there (one test process makes it, the
    others wait for it, up to :data:`MAKE_TIMEOUT`); None when it cannot be made, and
    the JVMs start without it."""
    archive = _archive_path()
    if archive is None or archive.exists():
        return archive
    if _failed_lately(archive):
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + MAKE_TIMEOUT
    with open(archive.with_suffix(".lock"), "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.2)
        # The lock's last holder may have made it, or failed to: either ends the wait.
        if not archive.exists() and not _failed_lately(archive):
            _make(archive, tmp, deadline)
    return archive if archive.exists() else None


def _failed_lately(archive: Path) -> bool:
    """Did an attempt to make ``archive`` fail within :data:`RETRY_AFTER`?"""
    try:
        return time.time() - archive.with_suffix(".failed").stat().st_mtime < RETRY_AFTER
    except OSError:
        return False


def _make(archive: Path, tmp: str, deadline: float) -> None:
    """Run the job under the archive's lock; a job that fails or outlives ``deadline``
    leaves a ``.failed`` file (its output) instead. What another Java's or pyspark's
    archive left, and a partial file of this one (a killed maker's), go first."""
    for old in archive.parent.glob("spark-classes-*"):
        if old.suffix in (".jsa", ".part", ".failed"):
            old.unlink(missing_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.part")
    work = tempfile.mkdtemp(dir=tmp)
    options = f"{jvm_options(tmp)} -XX:ArchiveClassesAtExit={partial}"
    env = {**os.environ, "TMPDIR": tmp,
           "PYSPARK_SUBMIT_ARGS": f'--driver-java-options "{options}" pyspark-shell'}  # fmt: skip
    # A group of its own: on the deadline the JVM goes with the Python that started it,
    # so it cannot write its partial file after this one is removed.
    job = subprocess.Popen([sys.executable, "-c", _JOB, work], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        out, _ = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
        if job.returncode == 0 and partial.exists():
            partial.rename(archive)
        else:
            archive.with_suffix(".failed").write_bytes(out[-20_000:])
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        archive.with_suffix(".failed").write_text(f"no archive within {MAKE_TIMEOUT:g} s\n")
    finally:
        partial.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
