"""The Spark data source's options (``Options``, one per read or write) and their table."""

from __future__ import annotations

from typing import Any

from .. import _validate as v
from .. import bucket
from ..embedded import URI_ENV
from ..errors import ConfigurationError
from ..stream import core as score
from ._clients import meta_col

DEFAULT_DATABASE = "bucketq"
DEFAULT_NUM_PARTITIONS = 2

#: Rows per micro-batch of a streaming read unless ``maxRowsPerTrigger`` says otherwise:
#: large enough that a micro-batch's fixed cost (planning, tasks, the sink's commit) is
#: a small part of it, small enough that a backlog is read in
#: several micro-batches (a failed one is read again whole).
DEFAULT_MAX_ROWS_PER_TRIGGER = 1_000_000
#: Buckets a task inserts per command.
INSERT_CHUNK = 16
WRITER_PREFIX = "spark-writer:"


def _option(name: str, field: str, default: Any, check: Any, help: str, **limits: Any) -> v.Setting:
    return v.Setting(name, field, default, help, check, limits)


def _stream_option(name: str, field: str, help: str) -> v.Setting:
    """A Spark option that is a stream option: read with the ``StreamOptions`` field's own
    check, so it accepts what a ``StreamQueue`` accepts (errors name the Spark option)."""
    return v.setting_of(score.StreamOptions, field, name, help)


#: The data source's options (any case, as Spark's are), each read from Spark's text by
#: its check (bucketq._validate): one declaration, the table in docs/spark.md.
# fmt: off
OPTIONS: tuple[v.Setting, ...] = (
    _option("uri", "uri", "", v.url, f"MongoDB URI (default: `${URI_ENV}`)", schemes=v.MONGODB_SCHEMES),
    _option("database", "database", DEFAULT_DATABASE, v.database_name, "database"),
    _option("queue", "queue", "", v.collection_name, "queue name (required)", optional=True),
    _option("mode", "mode", "auto", v.choice, "`stream` (stream-mode queue), `queue` (bucket queue); "
            "`auto` = stream if the queue has stream metadata", options=("auto", "stream", "queue")),
    _option("payloadFormat", "payload_format", "json", v.choice, "read: payload as JSON text (`json`) "
            "or bytes (`binary`: bytes payloads as they are, others as UTF-8 JSON). write: `json` parses "
            "a string `payload` column, `text` keeps it a string", options=("json", "binary", "text")),
    _option("numPartitions", "num_partitions", DEFAULT_NUM_PARTITIONS, v.count,
            "partitions of a read (contiguous bucket ranges)", lo=1),
    _option("maxRowsPerTrigger", "max_rows_per_trigger", DEFAULT_MAX_ROWS_PER_TRIGGER, v.count,
            "streaming read: rows per micro-batch at most (whole buckets, at least one)", lo=1),
    _option("startingAfter", "starting_after", None, v.maybe(v.count),
            "streaming read of a new query: start after this seq (default: the last ack)", lo=0),
    _stream_option("holeGrace", "hole_grace",
                   "streaming read: a seq taken by a producer that died is closed after this (seconds)"),
    _stream_option("stageTimeout", "stage_timeout",
                   "a staged (unpublished) write blocking a stream is closed after this (seconds)"),
    _stream_option("bucketMaxSize", "bucket_max_size", "writes: items per bucket at most (1 to 65,536)"),
    _stream_option("bucketMaxBytes", "bucket_max_bytes", "writes: bytes per bucket at most (1,024 to 16 MiB less 64 KiB)"),
    _option("writerId", "writer_id", "default", v.text,
            "streaming write: one id per streaming query writing into the same queue"),
    _option("partitions", "partitions", 1, v.count, "write into a bucket queue opened with "
            "`partitions=K`: give K, and each task's rows go to partition `task % K` (refused for a stream)",
            lo=1, hi=bucket.MAX_PARTITIONS, note=" (the queue's partitions=K: writes spread their tasks over them)"),
)
# fmt: on
#: The options that are stream options, by their ``StreamQueue`` names.
STREAM_OPTIONS = {
    s.name: s.field for s in OPTIONS if s.field in score.StreamOptions.__dataclass_fields__
}


def options_table() -> str:
    """The options as the Markdown table in ``docs/spark.md``."""
    return v.settings_table(OPTIONS, first="Option")


def spark_names(message: str) -> str:
    """A stream option check's message with the Spark options' names."""
    for key, name in STREAM_OPTIONS.items():
        if message.startswith(name + " "):
            message = "Option " + message
        message = message.replace(name, key)
    return message


def check_partitions(o: Options, mode: str) -> None:
    """Option partitions is for bucket queues: a stream has one partition."""
    if o.partitions > 1 and mode == "stream":
        raise ConfigurationError(
            f"Option partitions={o.partitions} is for bucket queues (mode queue); "
            f"{o.queue!r} is a stream, which has one partition. Leave partitions out."
        )


class Options:
    """The data source's options (:data:`OPTIONS`), checked once on the driver.
    Picklable (plain values). ``uri`` falls back to ``$BUCKETQ_MONGODB_URI``; ``queue`` is
    required."""

    def __init__(self, raw: dict[str, str]) -> None:
        opts = {str(k).lower(): str(x) for k, x in raw.items()}
        given = v.read_text(OPTIONS, opts, label="Option {}", casefold=True)
        values = {s.field: s.default for s in OPTIONS if s.field not in STREAM_OPTIONS.values()}
        values.update(given)
        values["uri"] = values["uri"] or v.env_mongodb_uri()
        if not values["uri"]:
            raise ConfigurationError(
                f'The bucketq data source needs a MongoDB URI: .option("uri", "mongodb://...") or ${URI_ENV}.'
            )
        if not values["queue"]:
            raise ConfigurationError(
                'The bucketq data source needs .option("queue", "<queue name>").'
            )
        self.uri: str = values["uri"]
        self.database: str = values["database"]
        self.queue: str = values["queue"]
        self.mode: str = values["mode"]
        self.payload_format: str = values["payload_format"]
        self.num_partitions: int = values["num_partitions"]
        self.max_rows_per_trigger: int = values["max_rows_per_trigger"]
        self.starting_after: int | None = values["starting_after"]
        #: The stream options given (by their ``StreamQueue`` names), checked as it checks them.
        self.stream_options: dict[str, Any] = {
            f: given[f] for f in STREAM_OPTIONS.values() if f in given
        }
        self.stream_opts()
        self.writer_id: str = values["writer_id"]
        self.partitions: int = values["partitions"]
        check_partitions(self, self.mode)

    def stream_opts(self) -> score.StreamOptions:
        try:
            return score.StreamOptions.build(**self.stream_options)
        except ConfigurationError as exc:
            raise ConfigurationError(spark_names(str(exc))) from None

    @property
    def stage_timeout(self) -> float:
        return self.stream_opts().stage_timeout

    def resolve_mode(self) -> str:
        """``stream`` or ``queue`` (``auto`` looks for the stream's metadata document)."""
        if self.mode != "auto":
            return self.mode
        return "stream" if meta_col(self).find_one(score.meta_filter(), {"_id": 1}) else "queue"
