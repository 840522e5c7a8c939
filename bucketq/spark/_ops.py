"""What the ``bucketq`` Spark data source does to MongoDB, with no pyspark import:
options, rows out of buckets, staged writes and their publication.

One job a module: ``_options`` (the options), ``_clients`` (one client per process),
``_rows`` (rows out of buckets, batch reads), ``_stream_read`` (the streaming read),
``_writes`` (staged writes and their publication); this module gathers the names the
source and the pipeline use.

Executors and the driver call these with their own ``MongoClient`` (one per process,
cached here), so the reader and writer objects Spark pickles hold only plain options.

Staged writes make task retries and replayed micro-batches harmless: every task
attempt inserts its buckets tagged ``stg: {j: <job>, t: <attempt token>}``, invisible
to consumers (a bucket queue's staged bucket is not mature until the year 3000; a
stream's blocks the stream at its number, like a hole). The driver's commit publishes
the buckets of the attempts Spark reports as successful and turns the rest into
nothing (deleted, or tombstones in a stream, so no number is left open).
"""

from ..bucket.convert import json_bytes
from ..stream import StreamQueue
from ._clients import client, col, meta_col, stream
from ._options import (
    DEFAULT_DATABASE,
    DEFAULT_MAX_ROWS_PER_TRIGGER,
    DEFAULT_NUM_PARTITIONS,
    INSERT_CHUNK,
    OPTIONS,
    STREAM_OPTIONS,
    WRITER_PREFIX,
    Options,
    check_partitions,
    options_table,
    spark_names,
)
from ._rows import (
    ARROW_BATCH_ROWS,
    Columns,
    arrow_batches,
    arrow_schema,
    batch_plan,
    live_filter,
    plan_ranges,
    read_range,
    schema_ddl,
)
from ._stream_read import StreamSource, incarnation_message, read_seq_range
from ._writes import (
    commit_batch,
    commit_micro_batch,
    discard,
    new_job,
    publish,
    row_item,
    stage,
)

__all__ = [
    "ARROW_BATCH_ROWS",
    "DEFAULT_DATABASE",
    "DEFAULT_MAX_ROWS_PER_TRIGGER",
    "DEFAULT_NUM_PARTITIONS",
    "INSERT_CHUNK",
    "OPTIONS",
    "STREAM_OPTIONS",
    "WRITER_PREFIX",
    "Columns",
    "Options",
    "StreamQueue",
    "StreamSource",
    "arrow_batches",
    "arrow_schema",
    "batch_plan",
    "check_partitions",
    "client",
    "col",
    "commit_batch",
    "commit_micro_batch",
    "discard",
    "incarnation_message",
    "json_bytes",
    "live_filter",
    "meta_col",
    "new_job",
    "options_table",
    "plan_ranges",
    "publish",
    "read_range",
    "read_seq_range",
    "row_item",
    "schema_ddl",
    "spark_names",
    "stage",
    "stream",
]
