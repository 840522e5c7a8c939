"""Queue options: defaults, limits, QueueOptions and the checks of a queue's name and
of each call's arguments when they arrive.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from pymongo.write_concern import WriteConcern

from .. import _validate as v
from ..errors import ConfigurationError

DEFAULT_BUCKET_MAX_SIZE = 1024


DEFAULT_BUCKET_MAX_BYTES = 8 * 1024 * 1024


#: MongoDB's document limit, less room for the bucket's own fields.
HARD_MAX_BYTES = 16 * 1024 * 1024 - 64 * 1024


DEFAULT_BUCKET_MAX_WAIT = 0.5


DEFAULT_STATE_FLUSH_PERIOD = 0.5


DEFAULT_LEASE = 30.0


DEFAULT_REJECT_DELTA_BASE = 10.0


DEFAULT_REJECT_DELTA_FACTOR = 10.0


DEFAULT_REJECT_TIMEOUT_GRACE = 10.0


DEFAULT_MATURE_GRANULARITY = 1.0


DEFAULT_PREFETCH = 1


DEFAULT_POLL_INTERVAL = 1.0


DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024


DEFAULT_RETRY_BASE = 0.1


DEFAULT_RETRY_CAP = 5.0


DEFAULT_RETRY_BUDGET = 60.0


DEFAULT_DRAIN_TIMEOUT = 5.0


#: How long one MongoDB operation not bounded by another budget may wait for its answer
#: (claims, state flushes, index creation, size(), ...).
DEFAULT_OP_TIMEOUT = 10.0


DLQ_SUFFIX = ".dlq"


#: Bytes a bucket document needs besides its items binary (ids, counters, bitmaps).
BUCKET_OVERHEAD = 512


MAX_PREFETCH = 1024


MAX_TRIES = 1_000_000


#: Partitions a queue may have (claims, the index and a shard key all stay one range each).
MAX_PARTITIONS = 4096


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Each option's type, finiteness and range is declared beside it with ``v.option`` (times
# are seconds, at most ``MAX_OPTION_SECONDS``: 30 days), with the help that docs/options.md
# shows (rendered by ``options_table``).


@dataclass(frozen=True, slots=True)
class CommonOptions:
    """The options a bucket queue and a stream share: packing, pushing, waiting."""

    #: Whose options these are, in messages.
    KIND: ClassVar[str] = "queue"

    bucket_max_size: int = v.option(
        DEFAULT_BUCKET_MAX_SIZE, v.count, lo=1, hi=65536, unit="items",
        help="items per bucket",
    )  # fmt: skip
    bucket_max_bytes: int = v.option(
        DEFAULT_BUCKET_MAX_BYTES, v.count, lo=1024, hi=HARD_MAX_BYTES, unit="bytes",
        note=" (MongoDB's 16 MiB document limit less room for the bucket's fields)",
        help="bytes of items per bucket (8 MiB)",
    )  # fmt: skip
    bucket_max_wait: float = v.option(
        DEFAULT_BUCKET_MAX_WAIT, v.number,
        help="an open bucket is written when it is this old (at once when a `durable=True` "
        "push waits on it; pushes that arrive meanwhile share the next insert)",
    )  # fmt: skip
    max_pending_bytes: int = v.option(
        DEFAULT_MAX_PENDING_BYTES, v.count, lo=1024, unit="bytes",
        help="pushed bytes not yet stored (64 MiB; at least `bucket_max_bytes`); past it a "
        "push blocks, or raises `QueueFull` (`pending_policy`)",
    )  # fmt: skip
    retry_base: float = v.option(
        DEFAULT_RETRY_BASE, v.number, open_lo=True,
        help="first delay of the jittered exponential backoff of a failed insert",
    )  # fmt: skip
    retry_cap: float = v.option(
        DEFAULT_RETRY_CAP, v.number, open_lo=True, help="longest delay of that backoff"
    )  # fmt: skip
    retry_budget: float = v.option(
        DEFAULT_RETRY_BUDGET, v.number,
        help="how long a bucket's insert is retried; then its receipts raise `PushFailed`",
    )  # fmt: skip
    poll_interval: float = v.option(
        DEFAULT_POLL_INTERVAL, v.number, open_lo=True,
        help="longest wait between claim attempts when idle (change streams wake consumers "
        "sooner)",
    )  # fmt: skip
    op_timeout: float = v.option(
        DEFAULT_OP_TIMEOUT, v.number, open_lo=True,
        help="how long one MongoDB call not bounded by `retry_budget` may wait for its answer "
        "(claims, state flushes, index creation, `size()`, `remove()`, ...)",
    )  # fmt: skip
    write_concern: WriteConcern | dict[str, Any] | None = v.option(
        None, v.write_concern, shown="on disk: the database's with `j: true`",
        help="`None`: the database's write concern (the URI's `w`, ...) with `j: true` added "
        "unless it says `j`, so a receipt resolves once the item is in the journal; given: "
        "used as is, e.g. `{\"w\": 1}` (faster; a server killed a moment later may lose "
        "what receipts called stored); an unacknowledged one (`w=0`) is refused",
    )  # fmt: skip
    change_streams: bool | None = v.option(
        None, v.flag, optional=True,
        help="`None`: use them where the server has them; `False` turns off the change-stream "
        "watcher (polling only); `True` logs a missing change stream as a warning (either way "
        "the consumer polls, counted in `stats()[\"change_stream_fallbacks\"]`)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        v.check_options(self)
        if self.max_pending_bytes < self.bucket_max_bytes:
            raise ConfigurationError(
                f"max_pending_bytes ({self.max_pending_bytes!r}) must be at least bucket_max_bytes "
                f"({self.bucket_max_bytes})."
            )

    def write_concern_for(self, db: Any) -> WriteConcern:
        """The write concern of this queue's writes in ``db``: the option as given, else
        ``db``'s with ``j: true`` (``writes.durable_write_concern``: on disk by default)."""
        from .writes import durable_write_concern

        return durable_write_concern(self.write_concern, getattr(db, "write_concern", None))

    @classmethod
    def build(cls, **options: Any) -> Self:
        """The options from keyword arguments; an unknown name is refused, naming the known."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"Unknown {cls.KIND} option(s): {', '.join(unknown)}. Known options: {', '.join(sorted(known))}."
            )
        return cls(**options)


@dataclass(frozen=True, slots=True)
class QueueOptions(CommonOptions):
    """Every queue option with its default (seconds for times, bytes for sizes).

    The names follow keuss where keuss has one (``lease`` is keuss's ``reserve_delay``).
    """

    state_flush_period: float = v.option(
        DEFAULT_STATE_FLUSH_PERIOD, v.number, open_lo=True,
        help="consumer commits and rollbacks are written this often (one fenced write per "
        "touched bucket)",
    )  # fmt: skip
    lease: float = v.option(
        DEFAULT_LEASE, v.number, open_lo=True,
        help="a claimed bucket's lease (keuss: `reserve_delay`), renewed while held; at least "
        "3 x `state_flush_period`",
    )  # fmt: skip
    reject_delta_base: float = v.option(
        DEFAULT_REJECT_DELTA_BASE, v.number,
        help="default rollback delay: `reject_delta_factor * tries + reject_delta_base`",
    )  # fmt: skip
    reject_delta_factor: float = v.option(
        DEFAULT_REJECT_DELTA_FACTOR, v.number, help="see `reject_delta_base`"
    )  # fmt: skip
    reject_timeout_grace: float = v.option(
        DEFAULT_REJECT_TIMEOUT_GRACE, v.number,
        help="an item reserved and neither committed nor rolled back for `lease` + this (per "
        "item, from when it was handed out or last touched: `touch(msg)`) is rolled back",
    )  # fmt: skip
    mature_granularity: float = v.option(
        DEFAULT_MATURE_GRANULARITY, v.number, open_lo=True,
        help="delayed items share a bucket per slot of this length: at most one slot late, "
        "never early",
    )  # fmt: skip
    prefetch: int = v.option(
        DEFAULT_PREFETCH, v.count, lo=0, hi=MAX_PREFETCH, unit="buckets",
        help="buckets claimed ahead of the one being served",
    )  # fmt: skip
    max_tries: int | None = v.option(
        None, v.maybe(v.count), lo=1, hi=MAX_TRIES,
        help="deliveries after which an item goes to the dead-letter queue (`None`: never)",
    )  # fmt: skip
    dead_letter_queue: str | None = v.option(
        None, v.maybe(v.collection_name), shown="`<name>.dlq`",
        help="the dead-letter queue's name (a bucketq queue; not the queue's own)",
    )  # fmt: skip
    pending_policy: str = v.option(
        "block", v.choice, options=("block", "raise"),
        help="past `max_pending_bytes`: `\"block\"` the push, or `\"raise\"` `QueueFull`",
    )  # fmt: skip
    drain_timeout: float = v.option(
        DEFAULT_DRAIN_TIMEOUT, v.number,
        help="how long `drain()` and `close()` serve in-memory items to consumers",
    )  # fmt: skip
    hold_pushed: bool = v.option(
        False, v.flag,
        help="`True`: while this queue object consumes, the buckets it writes are inserted "
        "already leased to it and served to its own consumers without a claim (one command "
        "per bucket fewer); others get them only if it closes or dies. The per-element "
        "queue ignores it",
    )  # fmt: skip
    partitions: int = v.option(
        1, v.count, lo=1, hi=MAX_PARTITIONS, unit="partitions",
        note=" (1: one claim range, today's layout; more: claims each search one partition)",
        help="`K > 1`: each bucket carries a partition (the producer's, or its push's `key=`) "
        "and each claim searches one; see [Scaling out](scaling.md). Streams and the "
        "per-element queue have one",
    )  # fmt: skip
    claim: str = v.option(
        "auto", v.choice, options=("auto", "find_and_modify", "find_then_update"),
        help="how a consumer claims a bucket: one `findAndModify`, or an indexed `find` of "
        "candidates then a conditional update (same guarantees); `auto` picks "
        "`find_then_update` on the embedded server, whose `findAndModify` scans every bucket "
        "([Claims and leases](design.md#claims-and-leases))",
    )  # fmt: skip
    owner: str = v.option(
        factory=_owner, check=v.text, shown="`host:pid`", help="recorded in leases"
    )  # fmt: skip

    def __post_init__(self) -> None:
        CommonOptions.__post_init__(self)
        if self.lease < 3 * self.state_flush_period:
            raise ConfigurationError(
                f"lease ({self.lease} s) must be at least 3x state_flush_period "
                f"({self.state_flush_period} s) so leases are renewed before they run out."
            )

    def retry_delay(self, tries: int) -> float:
        """The default wait before an item rolled back for the ``tries``-th time is
        delivered again: ``reject_delta_factor * tries + reject_delta_base`` seconds (at
        most ``MAX_DELAY``)."""
        return min(self.reject_delta_factor * tries + self.reject_delta_base, v.MAX_DELAY)

    def dead_letter_name(self, queue_name: str) -> str:
        """The dead-letter queue's name (``<name>.dlq`` unless ``dead_letter_queue``)."""
        return self.dead_letter_queue or queue_name + DLQ_SUFFIX


#: The keyword options of ``Queue(db, name, **options)``, in their order.
OPTIONS: tuple[v.Setting, ...] = v.settings(QueueOptions, keywords=True)


def options_table() -> str:
    """The queue's options as the Markdown table in ``docs/options.md``."""
    return v.settings_table(OPTIONS, first="Option", keywords=True)


def check_dead_letter_name(name: str, opts: QueueOptions) -> str:
    """The dead-letter queue's name, checked when the queue opens (not at its first dead
    letter): a valid collection name that is not the queue's own."""
    dlq = v.collection_name("dead-letter queue name (name + '.dlq')", opts.dead_letter_name(name))
    if dlq == name:
        raise ConfigurationError(
            f"dead_letter_queue must differ from the queue's own name {name!r}: an item moved "
            "there would be delivered again."
        )
    return dlq


def open_options(name: Any, options: dict[str, Any]) -> tuple[QueueOptions, str]:
    """A queue's options and name, checked when it opens (its dead-letter name too)."""
    opts = QueueOptions.build(**options)
    name = check_name(name)
    check_dead_letter_name(name, opts)
    return opts, name


def check_max_items(max_items: Any) -> int:
    return v.count("max_items", max_items, lo=1, hi=1_000_000, unit="items")


def check_name(name: Any) -> str:
    """A queue name: a valid MongoDB collection name (it also names ``<name>.dlq``)."""
    return v.collection_name("queue name", name)


def check_push(headers: Any, durable: Any) -> dict[str, Any] | None:
    """The per-item arguments of a push besides the payload and its time."""
    v.flag("durable", durable)
    return v.headers(headers)
