"""The queues under test, each behind the same five verbs so one loop drives them all.

bucketq's ``Queue`` / ``AsyncQueue`` (item by item, and through the ``_many`` calls), its
per-element baseline ``ElementQueue`` / ``AsyncElementQueue``, and the Python peers that
store one document per message:
mongo-taskqueue (``mongotq.TaskQueue``) and kombu's MongoDB transport (a
``SimpleQueue`` on ``kombu.Connection(..., transport="mongodb")``). The peers come
from PyPI (the ``bench`` extra) and are imported only in the process that drives them.

Every contender's writes wait for the journal: bucketq's by its default write concern,
the peers' by ``journal=true`` added to their URI (:func:`journaled`). Two more rows,
``bucketq Queue (w:1)`` and ``per-element ElementQueue (w:1)``, are bucketq's two queues
at the old default, ``w: 1`` without ``j`` (:data:`WEAK_WRITE_CONCERN`): beside their
durable twins they show what the journal costs each (``twin_of``).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: The write concern of the comparison rows: bucketq's default before writes waited for
#: the journal (acknowledged in memory; a killed server can lose the last ~100 ms).
WEAK_WRITE_CONCERN = {"w": 1}
#: How the report names each write concern.
DURABLE_LABEL, WEAK_LABEL = "durable", "w:1"

#: The collection (bucketq, mongo-taskqueue) or kombu queue every contender uses.
QUEUE_NAME = "bench"


class Handle:
    """One worker's open queue. The contract every contender keeps:

    - ``push(payload)`` stores or buffers one item;
    - ``flush()`` returns once every item this handle pushed is stored under the
      write concern, and every commit it made is written (a no-op where ``push`` and
      ``commit`` are already acknowledged writes);
    - ``reserve(timeout)`` returns a message with a ``.payload`` (the pushed dict) or
      ``None`` when nothing came within ``timeout`` seconds;
    - ``commit(msg)`` marks the message done;
    - ``close()`` releases everything (outside the measured time).

    A contender with ``per_call`` > 0 also has ``push_many(payloads)``,
    ``reserve_many(max_items, timeout)`` (a list, empty when nothing came) and
    ``commit_many(msgs)``. The async flavour has the same names as coroutines (``close`` too).
    """

    push: Any
    flush: Any
    reserve: Any
    commit: Any
    close: Any
    push_many: Any = None
    reserve_many: Any = None
    commit_many: Any = None


class Contender:
    """A queue under test: its display name, what it is, and how a worker opens it.

    ``open(uri, db_name)`` runs in the worker process before the clocks start and
    returns a :class:`Handle` (for ``is_async``: ``open_async`` returns one). ``prepare``
    runs once in the parent before the workers start, for what must not race.
    ``remaining(uri, db_name)`` runs in the parent after the consumers finished and
    returns how many items the queue still holds (0 when every item was consumed): a
    count kept by the workers cannot see an item they never received.
    """

    name: str = ""
    per_element: bool = False
    is_async: bool = False
    #: Items per ``push_many`` / ``reserve_many`` call; 0: one item per call.
    per_call: int = 0
    #: PyPI distributions whose versions the report states.
    distributions: tuple[str, ...] = ()
    #: Modules the worker imports to drive it (from the ``bench`` extra).
    modules: tuple[str, ...] = ()
    #: A sentence the report prints about how this contender was driven.
    note: str = ""
    #: Whether it takes queue options (``bucketq bench --partitions``).
    takes_options: bool = False
    #: The contender it is at :data:`WEAK_WRITE_CONCERN` ("" for a durable contender).
    twin_of: str = ""

    @property
    def write_concern(self) -> str:
        """:data:`DURABLE_LABEL` or :data:`WEAK_LABEL`: how its writes are acknowledged."""
        return WEAK_LABEL if self.twin_of else DURABLE_LABEL

    def prepare(self, uri: str, db_name: str) -> None:
        pass

    def open(self, uri: str, db_name: str, **options: Any) -> Handle:
        raise NotImplementedError

    async def open_async(self, uri: str, db_name: str, **options: Any) -> Handle:
        raise NotImplementedError

    def remaining(self, uri: str, db_name: str) -> int:
        raise NotImplementedError


def _count(uri: str, db_name: str, pipeline_or_filter: Any, *collections: str) -> int:
    """Sum over ``collections``: documents matching a filter (a dict), or the ``n`` of the
    single group a pipeline (a list) returns."""
    from pymongo import MongoClient

    client: MongoClient = MongoClient(uri)
    with client:
        db, total = client[db_name], 0
        for name in collections:
            if isinstance(pipeline_or_filter, list):
                total += sum(int(r["n"]) for r in db[name].aggregate(pipeline_or_filter))
            else:
                total += db[name].count_documents(pipeline_or_filter)
        return total


# -- bucketq --------------------------------------------------------------------------------


class _BucketqHandle(Handle):
    def __init__(self, queue: Any, client: Any) -> None:
        self.queue, self.client = queue, client
        self.push, self.flush, self.reserve, self.commit = (
            queue.push,
            queue.flush,
            queue.reserve,
            queue.commit,
        )
        self.push_many, self.reserve_many, self.commit_many = (
            getattr(queue, "push_many", None),
            getattr(queue, "reserve_many", None),
            getattr(queue, "commit_many", None),
        )

    def close(self) -> None:
        self.queue.close()
        self.client.close()


class _AsyncBucketqHandle(_BucketqHandle):
    async def close(self) -> None:  # type: ignore[override]
        await self.queue.close()
        await self.client.close()


#: Items per call of the contenders marked (_many calls), which use ``push_many`` of
#: this many payloads, ``reserve_many(PER_CALL, timeout)`` then ``commit_many`` of what
#: came.
PER_CALL = 1000


class BucketqContender(Contender):
    def __init__(
        self,
        name: str,
        cls_name: str,
        *,
        per_element: bool,
        is_async: bool,
        per_call: int = 0,
        twin_of: str = "",
    ) -> None:
        self.name, self.cls_name, self.per_element, self.is_async, self.per_call = (
            name,
            cls_name,
            per_element,
            is_async,
            per_call,
        )
        self.twin_of = twin_of
        self.distributions = ("bucketq", "pymongo")
        self.takes_options = not per_element
        if per_call:
            self.note = (
                "bucketq Queue / AsyncQueue (_many calls): the same queues, with the same options, as "
                f"the per-item rows, driven through the _many calls: push_many of {per_call:,} payloads "
                f"at a time, then reserve_many({per_call:,}, timeout) and commit_many of what came "
                "back. The rows without '(_many calls)' call push, reserve and commit once per item."
            )

    def _cls(self) -> Any:
        from .. import queue

        return getattr(queue, self.cls_name)

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {**options, "write_concern": WEAK_WRITE_CONCERN} if self.twin_of else options

    def open(self, uri: str, db_name: str, **options: Any) -> Handle:
        from pymongo import MongoClient

        client: MongoClient = MongoClient(uri)
        client.admin.command("ping")  # connect before the clock starts
        q = self._cls()(client[db_name], QUEUE_NAME, **self._options(options))
        return _BucketqHandle(q, client)

    async def open_async(self, uri: str, db_name: str, **options: Any) -> Handle:
        from pymongo import AsyncMongoClient

        client: AsyncMongoClient = AsyncMongoClient(uri)
        await client.admin.command("ping")
        q = self._cls()(client[db_name], QUEUE_NAME, **self._options(options))
        return _AsyncBucketqHandle(q, client)

    def remaining(self, uri: str, db_name: str) -> int:
        """Items in the queue and its dead-letter queue: the ``live`` count of every bucket
        document (a finished bucket is deleted), or the documents of a per-element queue."""
        from ..bucket.options import DLQ_SUFFIX

        names = (QUEUE_NAME, QUEUE_NAME + DLQ_SUFFIX)
        if self.per_element:
            return _count(uri, db_name, {}, *names)
        return _count(uri, db_name, [{"$group": {"_id": None, "n": {"$sum": "$live"}}}], *names)


# -- the peers ------------------------------------------------------------------------------


def journaled(uri: str) -> str:
    """``uri`` with ``journal=true`` unless it says ``journal`` itself: a peer's writes then
    wait for the journal, as bucketq's do by default (like with like)."""
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k.lower() == "journal" for k, _ in query):
        return uri
    return urlunsplit(parts._replace(query=urlencode([*query, ("journal", "true")])))


class _Peer(Contender):
    """A Python peer, named in its class statement: one PyPI distribution (the ``bench``
    extra), one module the worker imports, one document per message (so it competes
    with the per-element baseline)."""

    per_element = True

    def __init_subclass__(cls, *, name: str, distribution: str, module: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.name, cls.distributions, cls.modules = name, (distribution,), (module,)


# -- mongo-taskqueue ------------------------------------------------------------------------


class _TaskQueueHandle(Handle):
    POLL = 0.02  # TaskQueue.next() does not wait: poll like a worker loop would

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.push = queue.append  # one insert_one, acknowledged
        self.commit = queue.on_success  # one update_one: status "successful" (the document stays)

    def flush(self) -> None:
        """append() and on_success() are acknowledged writes: nothing is buffered."""

    def reserve(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            task = self.queue.next()  # one findAndModify
            if task is not None or time.monotonic() >= deadline:
                return task
            time.sleep(self.POLL)

    def close(self) -> None:
        self.queue.close()


class TaskQueueContender(
    _Peer, name="mongo-taskqueue TaskQueue", distribution="mongo-taskqueue", module="mongotq"
):
    note = (
        "mongo-taskqueue: append() per item, next() + on_success() to consume; completed tasks "
        "stay in the collection with status 'successful' (its design), so its claims never get cheaper."
    )

    def _queue(self, uri: str, db_name: str) -> Any:
        from mongotq import get_task_queue

        return get_task_queue(
            database_name=db_name, collection_name=QUEUE_NAME, host=journaled(uri), ttl=-1
        )

    def prepare(self, uri: str, db_name: str) -> None:
        self._queue(uri, db_name).close()  # creates the collection and indexes once, not racing

    def open(self, uri: str, db_name: str, **options: Any) -> Handle:
        q = self._queue(uri, db_name)
        q.database.command("ping")
        return _TaskQueueHandle(q)

    def remaining(self, uri: str, db_name: str) -> int:
        """Tasks not completed (completed ones stay, with status 'successful')."""
        from mongotq.task import STATUS_SUCCESSFUL

        return _count(uri, db_name, {"status": {"$ne": STATUS_SUCCESSFUL}}, QUEUE_NAME)


# -- kombu ----------------------------------------------------------------------------------


def with_database(uri: str, db_name: str) -> str:
    """The URI with its database path set to ``db_name`` (kombu takes the database from it)."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path="/" + db_name))


class _KombuHandle(Handle):
    def __init__(self, conn: Any, queue: Any) -> None:
        self.conn, self.queue = conn, queue
        self.push = queue.put  # routing lookup (find) + one insert_one, acknowledged
        self._empty = queue.Empty

    def flush(self) -> None:
        """put() returns after an acknowledged insert; ack() writes nothing (get deleted it)."""

    def reserve(self, timeout: float) -> Any:
        try:
            return self.queue.get(timeout=timeout)  # one findAndModify (find_one_and_delete)
        except self._empty:
            return None

    @staticmethod
    def commit(msg: Any) -> None:
        msg.ack()

    def close(self) -> None:
        self.queue.close()
        self.conn.release()


class KombuContender(_Peer, name="kombu MongoDB transport", distribution="kombu", module="kombu"):
    note = (
        "kombu: SimpleQueue on the mongodb transport; put() looks up the exchange's routes (find) "
        "then inserts; get() deletes the message as it delivers it (find_one_and_delete), "
        "so ack() writes nothing and a consumer that dies holding a message loses it."
    )

    def _open(self, uri: str, db_name: str) -> tuple[Any, Any]:
        from kombu import Connection

        conn = Connection(with_database(journaled(uri), db_name), transport="mongodb")
        return conn, conn.SimpleQueue(QUEUE_NAME)

    def prepare(self, uri: str, db_name: str) -> None:
        conn, q = self._open(uri, db_name)  # creates collections and indexes once, not racing
        q.close()
        conn.release()

    def open(self, uri: str, db_name: str, **options: Any) -> Handle:
        return _KombuHandle(*self._open(uri, db_name))

    def remaining(self, uri: str, db_name: str) -> int:
        """Messages left in the transport's messages collection (get() deletes them)."""
        from kombu.transport.mongodb import Channel

        return _count(uri, db_name, {}, Channel.messages_collection)


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        BucketqContender("bucketq Queue", "Queue", per_element=False, is_async=False),
        BucketqContender("bucketq AsyncQueue", "AsyncQueue", per_element=False, is_async=True),
        BucketqContender(
            "bucketq Queue (_many calls)",
            "Queue",
            per_element=False,
            is_async=False,
            per_call=PER_CALL,
        ),
        BucketqContender(
            "bucketq AsyncQueue (_many calls)",
            "AsyncQueue",
            per_element=False,
            is_async=True,
            per_call=PER_CALL,
        ),
        BucketqContender(
            "bucketq Queue (w:1)",
            "Queue",
            per_element=False,
            is_async=False,
            twin_of="bucketq Queue",
        ),
        BucketqContender(
            "per-element ElementQueue", "ElementQueue", per_element=True, is_async=False
        ),
        BucketqContender(
            "per-element AsyncElementQueue", "AsyncElementQueue", per_element=True, is_async=True
        ),
        BucketqContender(
            "per-element ElementQueue (w:1)",
            "ElementQueue",
            per_element=True,
            is_async=False,
            twin_of="per-element ElementQueue",
        ),
        TaskQueueContender(),
        KombuContender(),
    )
}
