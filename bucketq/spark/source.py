"""The PySpark data source ``bucketq`` (pyspark >= 4.0, ``pyspark.sql.datasource``).

Register it once per session with :func:`bucketq.spark.register`; then::

    spark.read.format("bucketq").option("uri", uri).option("queue", "events").load()
    spark.readStream.format("bucketq").option("uri", uri).option("queue", "logs").load()
    df.write.format("bucketq").option("uri", uri).option("queue", "out").mode("append").save()

Every object here holds only an :class:`~bucketq.spark._ops.Options` (plain values), so
Spark can pickle it to executors; executors open their own ``MongoClient``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from . import _ops as ops

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older pyspark runs Trigger.AvailableNow as one batch

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


__all__ = ["BucketQDataSource"]


@dataclass
class BucketRange(InputPartition):
    """Buckets ``lo <= _id <= hi`` of a batch read."""

    mode: str
    lo: Any
    hi: Any


@dataclass
class SeqRange(InputPartition):
    """Stream buckets ``lo < seq <= hi`` of one micro-batch."""

    lo: int
    hi: int


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: its token and how many buckets and items."""

    token: str
    buckets: int
    items: int


class BucketQDataSource(DataSource):
    """``bucketq``: read a queue's items (batch), a stream-mode queue as a stream, and
    write DataFrames into queues (batch and streaming) without duplicates."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = ops.Options(dict(options))

    @classmethod
    def name(cls) -> str:
        return "bucketq"

    def schema(self) -> str:
        return ops.schema_ddl(self.opts)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchWriter(self.opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(self.opts, schema)


class BatchReader(DataSourceReader):
    """A queue's live items; partitions are contiguous bucket ranges."""

    def __init__(self, opts: ops.Options) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        mode, ranges = ops.batch_plan(self.opts)
        return [BucketRange(mode, lo, hi) for lo, hi in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, BucketRange)
        return ops.read_range(self.opts, partition.mode, partition.lo, partition.hi)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream-mode queue as a stream. Offsets are ``{"seq": n, "incarnation": id}``:
    everything through seq n of that incarnation of the stream (an offset of another
    incarnation, such as a checkpoint's from a store made anew, fails the query naming
    both; ``_ops.StreamSource.check``). ``latestOffset`` stops at the highest seq reachable without a gap;
    ``commit(end)`` acknowledges (and deletes) through ``end`` under this query's fenced
    consumer epoch. Spark commits a batch to the source only when it starts a later
    one, after the sink committed it, so a restarted query re-reads exactly the
    batches its sink did not commit.

    ``Trigger.AvailableNow``: when the query starts, :meth:`prepareForTriggerAvailableNow`
    fixes the target (the highest seq reachable without a gap from the acknowledged
    position); micro-batches then run, ``maxRowsPerTrigger`` at a time, up to it and the
    query ends. Buckets pushed later wait for the next run."""

    def __init__(self, opts: ops.Options) -> None:
        self.opts = opts
        self._source: ops.StreamSource | None = None
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_source": None, "_target": self._target}

    @property
    def source(self) -> ops.StreamSource:
        if self._source is None:
            self._source = ops.StreamSource(self.opts)
        return self._source

    def initialOffset(self) -> dict:
        return self.source.offset(self.source.initial())

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # pyspark < 4.2 calls latestOffset() without a start or a limit.
        max_rows = getattr(limit, "max_rows", None)
        if limit is None:
            max_rows = self.opts.max_rows_per_trigger
        begin = self.source.check(start) if start else self.source.initial()
        if self._target is not None and begin >= self._target:
            return self.source.offset(begin)  # Trigger.AvailableNow: reached; the query ends
        end = self.source.latest(begin, max_rows)
        if self._target is not None:
            end = min(end, self._target)
        return self.source.offset(end)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.source.target()

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # pyspark >= 4.2

        n = self.opts.max_rows_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        lo, hi = self.source.check(start), self.source.check(end)
        if hi <= lo:
            return []
        parts = max(1, min(self.opts.num_partitions or 1, hi - lo))
        step = -(-(hi - lo) // parts)
        return [SeqRange(a, min(a + step, hi)) for a in range(lo, hi, step)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SeqRange)
        return ops.read_seq_range(self.opts, partition.lo, partition.hi)

    def commit(self, end: dict) -> None:
        self.source.commit(self.source.check(end))

    def stop(self) -> None:
        """The query stopped: close the stream's consumer (what it delivered and did not
        acknowledge is read again by the next one)."""
        if self._source is not None:
            self._source.close()
            self._source = None


class _Writes:
    def __init__(self, opts: ops.Options, schema: StructType, job: str | None = None) -> None:
        self.opts = opts
        self.fields = list(schema.fieldNames())
        self.mode = opts.resolve_mode()
        ops.check_partitions(opts, self.mode)
        self.job = job or ops.new_job()

    def write(self, iterator: Iterator[Any]) -> Staged:
        fmt = self.opts.payload_format
        items = (ops.row_item(row, self.fields, fmt) for row in iterator)
        task = 0
        if self.opts.partitions > 1:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            task = ctx.partitionId() if ctx is not None else 0
        m = ops.stage(self.opts, self.mode, self.job, items, task)
        return Staged(m["token"], m["buckets"], m["items"])


class BatchWriter(_Writes, DataSourceWriter):
    """Each task stages its rows in buckets; the job's commit publishes the buckets of
    the successful attempts only, so a retried task leaves no duplicate."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        ops.commit_batch(self.opts, self.mode, self.job, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        ops.discard(self.opts, self.mode, self.job, [])


class StreamWriter(_Writes, DataSourceStreamWriter):
    """Like :class:`BatchWriter`, and a micro-batch is published once per ``writerId``
    (its id is recorded with the publication), so a replayed batch is discarded.

    Spark builds one writer for the tasks and another for the commit, so the tag of
    the staged buckets is derived from ``writerId``, not drawn at random."""

    def __init__(self, opts: ops.Options, schema: StructType) -> None:
        super().__init__(opts, schema, ops.WRITER_PREFIX + opts.writer_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ops.commit_micro_batch(self.opts, self.mode, self.job, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ops.discard(self.opts, self.mode, self.job, [])
