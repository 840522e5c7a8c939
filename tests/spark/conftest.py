"""One local SparkSession for the Spark tests: local[2] with one task retry allowed,
small shuffle partitions, UI off."""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark", reason="pip install 'bucketq[spark]'")


def spark_session(app: str, master: str = "local[2,2]"):
    from pyspark.sql import SparkSession

    from bucketq.spark import register

    spark = (
        SparkSession.builder.master(
            master
        )  # local[2, maxFailures=2]: a failed task is retried once
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def spark():
    s = spark_session("bucketq-tests")
    yield s
    s.stop()
