"""The streaming read: offsets are sequence numbers of a stream, read in gapless ranges."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError
from ..stream import StreamConsumer
from ..stream import core as score
from ._clients import col, stream
from ._options import Options
from ._rows import ARROW_BATCH_ROWS, Columns

log = logging.getLogger("bucketq.spark")


def incarnation_message(queue: str, checkpoint: str, stream: str) -> str:
    """What a query whose checkpoint came from another incarnation of its stream is told."""
    return (
        f"This query's checkpoint was made reading stream {queue!r} incarnation {checkpoint}, "
        f"but the stream {queue!r} of this database is incarnation {stream}: it was made "
        "again since (dropped and made anew, or a fresh store, such as the embedded one "
        "`bucketq pipeline` starts without --uri), and its sequence numbers are not the "
        "checkpoint's. Reading on would skip its records or read them twice, so the query "
        "stops. Start the query with a new checkpoint location to read this stream from its "
        "start, or point it at the store the checkpoint was made with."
    )


class StreamSource:
    """The driver side of a streaming read: the stream's one consumer (a fenced epoch)
    per query run, opened at the first call. Executors read the planned ranges.

    An offset is a seq and the stream's incarnation (``stream.core``): a checkpoint's
    offset from another incarnation of the queue (dropped and made again, or on a fresh
    store) names numbers that are not this stream's; reading on from it would skip
    records or read them twice, so :meth:`check` fails naming both incarnations. An
    offset without an incarnation (a checkpoint made before offsets had one) is taken as
    this stream's, with a warning; the query's next offsets carry it."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self._consumer: StreamConsumer | None = None
        self._warned = False

    @property
    def consumer(self) -> StreamConsumer:
        if self._consumer is None:
            self._consumer = stream(self.o).consumer()  # fences every older consumer
        return self._consumer

    @property
    def holes_closed(self) -> int:
        return self._consumer.holes_closed if self._consumer is not None else 0

    def initial(self) -> int:
        meta = self.consumer.check_epoch()
        return score.check_resume(self.o.queue, self.o.starting_after, meta)

    def offset(self, seq: int) -> dict[str, Any]:
        """The offset through ``seq`` of this stream."""
        return {"seq": seq, "incarnation": self.consumer.incarnation}

    def check(self, offset: dict[str, Any]) -> int:
        """The seq of ``offset`` (a checkpoint's, or one this source made), once it is
        known to be this stream's; see the class's text."""
        given = offset.get("incarnation")
        current = self.consumer.incarnation
        if given is None:
            if not self._warned:
                self._warned = True
                log.warning(
                    "this query's checkpoint has offsets without a stream incarnation (made by "
                    "an older bucketq): they are taken as stream %s's, incarnation %s; if the "
                    "queue was made again since (or the store is a fresh one), stop the query "
                    "and start it with a new checkpoint location",
                    v.printable(self.o.queue), current,
                )  # fmt: skip
        elif given != current:
            raise ConfigurationError(incarnation_message(self.o.queue, str(given), current))
        return int(offset["seq"])

    def latest(self, start: int, max_rows: int | None) -> int:
        """The highest seq reachable from ``start`` without a gap (holes past their grace
        are closed on the way), no further than ``max_rows`` items."""
        c = self.consumer
        if start < c.acked:
            raise ConfigurationError(
                f"Stream {self.o.queue!r} is acknowledged through {c.acked}, past this query's "
                f"checkpoint ({start}): another consumer took those buckets. Start the query "
                "from a new checkpoint (with startingAfter) or stop the other consumer."
            )
        return c.reachable(start, max_rows)

    def target(self) -> int:
        """Where a ``Trigger.AvailableNow`` run stops: the highest seq reachable without
        a gap from the acknowledged position, now."""
        return self.consumer.reachable(self.consumer.acked)

    def commit(self, end: int) -> None:
        """Acknowledge through ``end`` (fenced) and delete what is acknowledged."""
        self.consumer.write_ack(end)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def read_seq_range(o: Options, lo: int, hi: int) -> Iterator[Any]:
    """``pyarrow.RecordBatch``es of the buckets ``lo < seq <= hi``; every number must be
    there (bucket or tombstone): latestOffset only ever hands out gapless ranges."""
    cols = Columns(o.payload_format)
    expect = lo + 1
    for doc in col(o).find({"_id": {"$gt": lo, "$lte": hi}}).sort("_id", 1):
        if doc["_id"] != expect or score.is_staged(doc):
            break
        expect += 1
        cols.add_stream(doc)
        if len(cols) >= ARROW_BATCH_ROWS:
            yield cols.record_batch()
    if len(cols):
        yield cols.record_batch()
    if expect != hi + 1:
        raise ConfigurationError(
            f"Stream {o.queue!r}: bucket {expect} of the planned range {lo + 1}..{hi} is gone; "
            "another consumer acknowledged it. Only one consumer may read a stream."
        )
