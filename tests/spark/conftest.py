"""One local SparkSession for the Spark tests: local[2] with one task retry allowed,
small shuffle partitions, UI off. Without pyspark or a Java runtime the Spark tests
skip with the reason locally, and fail in CI (``CI=true``), like the other servers."""

from __future__ import annotations

import os
import subprocess
import tempfile

import jvm
import pytest
from jvm import java_command

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the Spark tests must run)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def java_problem() -> str | None:
    """Why Spark cannot start a JVM here, or None: $JAVA_HOME/bin/java, else java on PATH."""
    java = java_command()
    if java is None:
        return "no Java runtime (Spark needs Java 17+): install one or set JAVA_HOME"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{java} -version failed ({exc}): Spark needs a working Java 17+"
    return None


try:
    import pyspark  # noqa: F401
except ImportError:
    _missing("no pyspark: pip install 'bucketq[spark]'")


#: This test run's directory for Spark's temporary files, once ``_spark_tmp`` made it.
_TMP: dict[str, str] = {}


def spark_tmp() -> str:
    """Where Spark's temporary files go: this run's directory; in a process the tests
    started, its ``TMPDIR`` (:func:`spark_env`)."""
    return _TMP.get("dir") or tempfile.gettempdir()


def spark_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a process the tests start that runs Spark,
    with ``TMPDIR`` set to :func:`spark_tmp`. Only those processes get it: the test
    process's own ``TMPDIR`` stays, for the other tests its worker runs."""
    return {**(os.environ if env is None else env), "TMPDIR": spark_tmp()}


def jvm_options() -> str:
    """The options of the JVMs the tests start (``jvm.jvm_options``), their temporary
    files in :func:`spark_tmp` rather than /tmp."""
    return jvm.jvm_options(spark_tmp())


def cluster_app() -> dict[str, str]:
    """An application's settings on the test cluster (tests/spark/test_cluster.py): one
    executor of one core and 512 MiB on each of its two workers."""
    return {
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "512m",
        "spark.executor.extraJavaOptions": jvm_options(),
    }


def spark_session(app: str, master: str = "local[2,2]", conf: dict[str, str] | None = None):
    """A session as bucketq's own are built (bound to loopback, Python workers importing
    the compiled pyspark: bucketq/spark/_session.py says why); ``local[2,2]`` is
    local[2] with a failed task retried once. ``conf``: settings over these."""
    from pyspark.sql import SparkSession

    from bucketq.spark import prepare_session, register

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.extraJavaOptions", jvm_options())
    )
    if master.startswith("spark://"):  # the standalone cluster: one small executor per worker
        for key, value in cluster_app().items():
            builder = builder.config(key, value)
    for key, value in [*prepare_session(master).items(), *(conf or {}).items()]:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def _spark_tmp(tmp_path_factory) -> None:
    """Temporary files of Spark and of the processes the tests start under this run's
    temporary directory (pytest keeps the last few runs' and removes older ones), not
    in /tmp where each run left dozens."""
    _TMP["dir"] = str(tmp_path_factory.mktemp("spark-tmp", numbered=False))


@pytest.fixture(scope="session")
def java(_spark_tmp) -> None:
    problem = java_problem()
    if problem:
        _missing(problem)
    jvm.class_archive(spark_tmp())


@pytest.fixture(autouse=True)
def _needs_java(java) -> None:
    """Every Spark test (the ones that start Spark in a worker process too)."""


@pytest.fixture(scope="session")
def spark(java):
    s = spark_session("bucketq-tests")
    yield s
    s.stop()
