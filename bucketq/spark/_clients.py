"""The Spark data source's MongoDB clients: one per process, cached here, so the reader
and writer objects Spark pickles hold only plain options.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from ..bucket.codec import CODEC_OPTIONS
from ..bucket.deadline import client_timeouts
from ..bucket.writes import durable_write_concern
from ..stream import StreamQueue
from ..stream import core as score

if TYPE_CHECKING:
    from ._options import Options


_clients: dict[str, MongoClient] = {}
_clients_lock = threading.Lock()


def client(uri: str) -> MongoClient:
    with _clients_lock:
        c = _clients.get(uri)
        if c is None:
            c = _clients[uri] = MongoClient(uri, appname="bucketq-spark", **client_timeouts(uri))
        return c


_streams: dict[tuple[Any, ...], StreamQueue] = {}


def stream(o: Options) -> StreamQueue:
    """This process's ``StreamQueue`` for the options (its consumer, numbering and
    staged writes are what the data source uses)."""
    key = (os.getpid(), o.uri, o.database, o.queue, tuple(sorted(o.stream_options.items())))
    sq = _streams.get(key)
    if sq is None:
        sq = StreamQueue(client(o.uri)[o.database], o.queue, **o.stream_options)
        sq = _streams.setdefault(key, sq)
    return sq


def col(o: Options):
    return _collection(o, o.queue)


def meta_col(o: Options):
    return _collection(o, score.meta_name(o.queue))


def _collection(o: Options, name: str):
    """``name`` in the options' database; its writes (a task's buckets, a query's offsets
    and acks) on disk unless the URI's write concern says ``j`` (as a queue's)."""
    c = client(o.uri)
    wc = durable_write_concern(None, c.write_concern)
    return c[o.database].get_collection(name, codec_options=CODEC_OPTIONS, write_concern=wc)
