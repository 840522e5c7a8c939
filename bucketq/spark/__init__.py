"""The PySpark data source ``bucketq`` (needs ``pip install 'bucketq[spark]'``).

::

    from bucketq.spark import register
    register(spark)  # once per SparkSession
    df = spark.read.format("bucketq").option("uri", uri).option("queue", "events").load()

See docs/spark.md for the options, the streaming read and the exactly-once writes.
:func:`prepare_session` gives the settings bucketq's own sessions use (loopback binding
for a local master, Python workers that import the compiled pyspark).
"""

from __future__ import annotations

from typing import Any

from ._session import prepare_session

__all__ = ["BucketQDataSource", "prepare_session", "register"]


def _need_pyspark() -> None:
    from .._deps import require

    require("pyspark.sql.datasource", "spark", "The bucketq Spark data source (pyspark >= 4.0)")


def register(spark: Any) -> None:
    """Register the ``bucketq`` data source with a SparkSession."""
    _need_pyspark()
    from .source import BucketQDataSource

    spark.dataSource.register(BucketQDataSource)


def __getattr__(name: str) -> Any:
    if name == "BucketQDataSource":
        _need_pyspark()
        from .source import BucketQDataSource

        return BucketQDataSource
    raise AttributeError(f"module 'bucketq.spark' has no attribute {name!r}")
