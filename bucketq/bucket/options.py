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
# are seconds, at most ``MAX_OPTION_SECONDS``: 30 days); the README's option table agrees.


@dataclass(frozen=True, slots=True)
class CommonOptions:
    """The options a bucket queue and a stream share: packing, pushing, waiting."""

    #: Whose options these are, in messages.
    KIND: ClassVar[str] = "queue"

    bucket_max_size: int = v.option(DEFAULT_BUCKET_MAX_SIZE, v.count, lo=1, hi=65536, unit="items")
    bucket_max_bytes: int = v.option(
        DEFAULT_BUCKET_MAX_BYTES, v.count, lo=1024, hi=HARD_MAX_BYTES, unit="bytes",
        note=" (MongoDB's 16 MiB document limit less room for the bucket's fields)",
    )  # fmt: skip
    bucket_max_wait: float = v.option(DEFAULT_BUCKET_MAX_WAIT, v.number)
    max_pending_bytes: int = v.option(DEFAULT_MAX_PENDING_BYTES, v.count, lo=1024, unit="bytes")
    retry_base: float = v.option(DEFAULT_RETRY_BASE, v.number, open_lo=True)
    retry_cap: float = v.option(DEFAULT_RETRY_CAP, v.number, open_lo=True)
    retry_budget: float = v.option(DEFAULT_RETRY_BUDGET, v.number)
    poll_interval: float = v.option(DEFAULT_POLL_INTERVAL, v.number, open_lo=True)
    op_timeout: float = v.option(DEFAULT_OP_TIMEOUT, v.number, open_lo=True)
    write_concern: WriteConcern | dict[str, Any] | None = None
    change_streams: bool | None = v.option(None, v.flag, optional=True)

    def __post_init__(self) -> None:
        v.check_options(self)
        v.write_concern(self.write_concern)
        if self.max_pending_bytes < self.bucket_max_bytes:
            raise ConfigurationError(
                f"max_pending_bytes ({self.max_pending_bytes!r}) must be at least bucket_max_bytes "
                f"({self.bucket_max_bytes})."
            )

    def get_write_concern(self) -> WriteConcern | None:
        wc = self.write_concern
        return WriteConcern(**wc) if isinstance(wc, dict) else wc

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

    state_flush_period: float = v.option(DEFAULT_STATE_FLUSH_PERIOD, v.number, open_lo=True)
    lease: float = v.option(DEFAULT_LEASE, v.number, open_lo=True)
    reject_delta_base: float = v.option(DEFAULT_REJECT_DELTA_BASE, v.number)
    reject_delta_factor: float = v.option(DEFAULT_REJECT_DELTA_FACTOR, v.number)
    reject_timeout_grace: float = v.option(DEFAULT_REJECT_TIMEOUT_GRACE, v.number)
    mature_granularity: float = v.option(DEFAULT_MATURE_GRANULARITY, v.number, open_lo=True)
    prefetch: int = v.option(DEFAULT_PREFETCH, v.count, lo=0, hi=MAX_PREFETCH, unit="buckets")
    max_tries: int | None = v.option(None, v.maybe(v.count), lo=1, hi=MAX_TRIES)
    dead_letter_queue: str | None = v.option(None, v.maybe(v.collection_name))
    pending_policy: str = v.option("block", v.choice, options=("block", "raise"))
    drain_timeout: float = v.option(DEFAULT_DRAIN_TIMEOUT, v.number)
    hold_pushed: bool = v.option(False, v.flag)
    partitions: int = v.option(
        1, v.count, lo=1, hi=MAX_PARTITIONS, unit="partitions",
        note=" (1: one claim range, today's layout; more: claims each search one partition)",
    )  # fmt: skip
    claim: str = v.option("auto", v.choice, options=("auto", "find_and_modify", "find_then_update"))
    owner: str = v.option(factory=_owner, check=v.text)

    def __post_init__(self) -> None:
        CommonOptions.__post_init__(self)
        if self.lease < 3 * self.state_flush_period:
            raise ConfigurationError(
                f"lease ({self.lease} s) must be at least 3x state_flush_period "
                f"({self.state_flush_period} s) so leases are renewed before they run out."
            )

    def dead_letter_name(self, queue_name: str) -> str:
        """The dead-letter queue's name (``<name>.dlq`` unless ``dead_letter_queue``)."""
        return self.dead_letter_queue or queue_name + DLQ_SUFFIX


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
