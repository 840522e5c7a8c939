"""Queue options: defaults, limits, QueueOptions and the checks of a queue's name and
of each call's arguments when they arrive.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, fields
from typing import Any

from pymongo.write_concern import WriteConcern

from ... import _validate as v
from ...errors import ConfigurationError

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


#: Time options (seconds): the lowest value and whether it is excluded. Each is at most
#: ``MAX_OPTION_SECONDS`` (30 days).
_TIME_OPTIONS: dict[str, tuple[float, bool]] = {
    "bucket_max_wait": (0.0, False),
    "state_flush_period": (0.0, True),
    "lease": (0.0, True),
    "reject_delta_base": (0.0, False),
    "reject_delta_factor": (0.0, False),
    "reject_timeout_grace": (0.0, False),
    "mature_granularity": (0.0, True),
    "poll_interval": (0.0, True),
    "retry_base": (0.0, True),
    "retry_cap": (0.0, True),
    "retry_budget": (0.0, False),
    "drain_timeout": (0.0, False),
    "op_timeout": (0.0, True),
}


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Every queue option with its default (seconds for times, bytes for sizes).

    The names follow keuss where keuss has one (``lease`` is keuss's ``reserve_delay``).
    """

    bucket_max_size: int = DEFAULT_BUCKET_MAX_SIZE
    bucket_max_bytes: int = DEFAULT_BUCKET_MAX_BYTES
    bucket_max_wait: float = DEFAULT_BUCKET_MAX_WAIT
    state_flush_period: float = DEFAULT_STATE_FLUSH_PERIOD
    lease: float = DEFAULT_LEASE
    reject_delta_base: float = DEFAULT_REJECT_DELTA_BASE
    reject_delta_factor: float = DEFAULT_REJECT_DELTA_FACTOR
    reject_timeout_grace: float = DEFAULT_REJECT_TIMEOUT_GRACE
    mature_granularity: float = DEFAULT_MATURE_GRANULARITY
    prefetch: int = DEFAULT_PREFETCH
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_tries: int | None = None
    dead_letter_queue: str | None = None
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    pending_policy: str = "block"
    retry_base: float = DEFAULT_RETRY_BASE
    retry_cap: float = DEFAULT_RETRY_CAP
    retry_budget: float = DEFAULT_RETRY_BUDGET
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    op_timeout: float = DEFAULT_OP_TIMEOUT
    write_concern: WriteConcern | dict[str, Any] | None = None
    change_streams: bool | None = None
    hold_pushed: bool = False
    partitions: int = 1
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        # Every option's type, finiteness and range: the ranges are in OPTION_RANGES and
        # in the README's option table.
        v.count("bucket_max_size", self.bucket_max_size, lo=1, hi=65536, unit="items")
        v.count(
            "bucket_max_bytes", self.bucket_max_bytes, lo=1024, hi=HARD_MAX_BYTES, unit="bytes",
            note=" (MongoDB's 16 MiB document limit less room for the bucket's fields)",
        )  # fmt: skip
        for name, (lo, open_lo) in _TIME_OPTIONS.items():
            v.number(name, getattr(self, name), lo=lo, open_lo=open_lo)
        if self.lease < 3 * self.state_flush_period:
            raise ConfigurationError(
                f"lease ({self.lease} s) must be at least 3x state_flush_period "
                f"({self.state_flush_period} s) so leases are renewed before they run out."
            )
        v.count("prefetch", self.prefetch, lo=0, hi=MAX_PREFETCH, unit="buckets")
        if self.max_tries is not None:
            v.count("max_tries", self.max_tries, lo=1, hi=MAX_TRIES)
        if self.dead_letter_queue is not None:
            v.collection_name("dead_letter_queue", self.dead_letter_queue)
        v.count("max_pending_bytes", self.max_pending_bytes, lo=1024, unit="bytes")
        if self.max_pending_bytes < self.bucket_max_bytes:
            raise ConfigurationError(
                f"max_pending_bytes ({self.max_pending_bytes!r}) must be at least bucket_max_bytes "
                f"({self.bucket_max_bytes})."
            )
        v.choice("pending_policy", self.pending_policy, ("block", "raise"))
        v.write_concern(self.write_concern)
        v.flag("change_streams", self.change_streams, optional=True)
        v.flag("hold_pushed", self.hold_pushed)
        v.count(
            "partitions", self.partitions, lo=1, hi=MAX_PARTITIONS, unit="partitions",
            note=" (1: one claim range, today's layout; more: claims each search one partition)",
        )  # fmt: skip
        v.text("owner", self.owner)

    @classmethod
    def build(cls, **options: Any) -> QueueOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"Unknown queue option(s): {', '.join(unknown)}. Known options: {', '.join(sorted(known))}."
            )
        return cls(**options)

    def dead_letter_name(self, queue_name: str) -> str:
        """The dead-letter queue's name (``<name>.dlq`` unless ``dead_letter_queue``)."""
        return self.dead_letter_queue or queue_name + DLQ_SUFFIX

    def get_write_concern(self) -> WriteConcern | None:
        wc = self.write_concern
        return WriteConcern(**wc) if isinstance(wc, dict) else wc


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
