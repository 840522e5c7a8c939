"""kombu's virtual transport on bucketq queues: one ``Queue`` per kombu queue name.

kombu's virtual channel takes a message off its store when it delivers it, keeps it in
memory until it is acknowledged (``QoS``), and puts it back when the channel closes; a
process that dies loses what it held. bucketq hands an item out under its bucket's lease
instead, so the mapping is:

- ``basic_publish`` -> ``push`` (the ``eta`` header as the item's mature time, so a
  countdown or a retry's countdown waits in MongoDB, not in a worker's memory);
- a delivery -> ``reserve``; the delivery tag names the reserved message;
- ``basic_ack`` -> ``commit``; ``basic_reject(requeue=True)`` and a channel closing with
  messages unacknowledged -> ``rollback`` with no delay; ``basic_reject(requeue=False)``
  -> ``commit`` (the message is dropped, as AMQP drops it without a dead-letter exchange);
- a worker that dies: its buckets' leases run out and every item it had not acknowledged
  is delivered again, ``tries`` + 1 (``redelivered`` in the message's delivery info).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from queue import Empty
from typing import Any

from kombu.transport import virtual
from pymongo import MongoClient
from pymongo import timeout as pymongo_timeout
from pymongo.errors import ConnectionFailure, PyMongoError

from .. import bucket
from .._version import version
from ..errors import BucketQError, OperationFailed, ServerUnavailable
from ..queue import Message, Queue
from . import _core as core

log = logging.getLogger("bucketq.celery")

#: The most messages one delivery call reserves when the consumer sets no prefetch limit.
MAX_BATCH = 64


class QoS(virtual.QoS):
    """kombu's unacknowledged-message bookkeeping, where acknowledging commits and
    rejecting rolls back in bucketq (see the module docstring)."""

    def ack(self, delivery_tag: Any) -> None:
        self.channel._commit(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if requeue:
            self.channel._rollback(delivery_tag)
        else:
            self.channel._commit(delivery_tag, rejected=True)
        self._quick_ack(delivery_tag)


class Channel(virtual.Channel):
    """A kombu channel whose queues are bucketq queues of the connection's database."""

    QoS = QoS
    supports_fanout = False
    #: Bodies are stored as they are (BSON holds text and bytes), not as base64.
    body_encoding = None  # type: ignore[assignment]

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        #: delivery tag -> (queue, reserved message), until acknowledged or rejected.
        self._held: dict[int, tuple[Queue, Message]] = {}
        self._tags = itertools.count(1)
        self._no_ack_queues: set[str] = set()
        self._turn = 0

    # -- what bucketq refuses ---------------------------------------------------------------

    def exchange_declare(self, exchange: Any = None, type: str = "direct", *args: Any,
                         **kwargs: Any) -> Any:  # fmt: skip
        core.check_exchange_type(exchange or "", type or "direct")
        return super().exchange_declare(exchange, type, *args, **kwargs)

    def queue_declare(self, queue: Any = None, passive: bool = False, **kwargs: Any) -> Any:
        core.check_queue_arguments(queue or "", kwargs.get("arguments"))
        return super().queue_declare(queue, passive, **kwargs)

    def prepare_message(self, body: Any, priority: Any = None, *args: Any, **kwargs: Any) -> Any:
        core.check_priority(priority)
        return super().prepare_message(body, priority, *args, **kwargs)

    def _lookup(self, exchange: Any, routing_key: Any, default: Any = None) -> Any:
        found = super()._lookup(exchange, routing_key, default)
        if not found:
            raise core.unroutable(exchange, routing_key)
        return found

    # -- publish ------------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.connection.queue(queue).push(
            message,
            mature=core.eta_of(message),
            durable=self.connection.options.publish_durable,
        )

    # -- deliver ------------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: Any) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        self._no_ack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        msgs = self.connection.queue(queue).reserve_many(1, timeout=0)
        if not msgs:
            return None
        message = self.Message(self._hand_out(queue, msgs[0], no_ack), channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        msgs = self.connection.queue(queue).reserve_many(1, timeout=0)
        if not msgs:
            raise Empty()
        return self._hand_out(queue, msgs[0], queue in self._no_ack_queues)

    def _get_many(self, queues: list[str], timeout: float | None = None) -> None:
        """Deliver what is ready in the first of ``queues`` (taken in turn) that has
        something, up to the consumer's prefetch room; else wait on one of them (up to
        ``polling_interval``, shorter with several queues): a message stored meanwhile
        ends the wait. Raises Empty when nothing came."""
        if not queues:
            raise Empty()
        room = self.qos.can_consume_max_estimate()
        n = MAX_BATCH if room is None else max(1, min(room, MAX_BATCH))
        start = self._turn % len(queues)
        self._turn += 1
        order = queues[start:] + queues[:start]
        for name in order:
            msgs = self.connection.queue(name).reserve_many(n, timeout=0)
            if msgs:
                return self._deliver_all(name, msgs)
        wait = self.connection.options.polling_interval
        if len(queues) > 1:
            wait = min(wait, core.MULTI_QUEUE_WAIT)
        if timeout is not None:
            wait = min(wait, timeout)
        msgs = self.connection.queue(order[0]).reserve_many(n, timeout=wait)
        if msgs:
            return self._deliver_all(order[0], msgs)
        raise Empty()

    def _deliver_all(self, queue: str, msgs: list[Message]) -> None:
        no_ack = queue in self._no_ack_queues
        for i, msg in enumerate(msgs):
            try:
                self.connection._deliver(self._hand_out(queue, msg, no_ack), queue)
            except BaseException:
                # The rest were reserved and not handed to anyone: give them back now.
                q = self.connection.queue(queue)
                for rest in msgs[i + 1 :]:
                    q.rollback(rest, 0)
                raise

    def _hand_out(self, queue: str, msg: Message, no_ack: bool) -> dict[str, Any]:
        """The kombu message of a reserved item, with a delivery tag of its own (an item
        delivered twice gets two), remembered until acknowledged; committed at once when
        its consumer acknowledges nothing (``no_ack``)."""
        raw = msg.payload
        props = dict(raw.get("properties") or {})
        info = dict(props.get("delivery_info") or {})
        info["redelivered"] = msg.tries > 0
        tag = next(self._tags)
        props.update(delivery_tag=tag, delivery_info=info)
        q = self.connection.queue(queue)
        if no_ack:
            q.commit(msg)
        else:
            self._held[tag] = (q, msg)
        return {**raw, "properties": props}

    # -- acknowledge ----------------------------------------------------------------------------

    def _commit(self, tag: Any, *, rejected: bool = False) -> None:
        held = self._held.pop(tag, None)
        if held is None:
            return
        q, msg = held
        if not q.commit(msg):
            log.warning(
                "message %s of queue %s was %s after this worker stopped holding it (its "
                "lease ran out, or it was given back); it is delivered again",
                msg.id, q.name, "rejected" if rejected else "acknowledged",
            )  # fmt: skip

    def _rollback(self, tag: Any) -> None:
        held = self._held.pop(tag, None)
        if held is None:
            return
        q, msg = held
        try:
            q.rollback(msg, 0)
        except BucketQError as exc:  # closed or forked: its lease gives it back
            log.info("message %s of queue %s not given back now (%s); it is delivered again "
                     "when its lease runs out", msg.id, q.name, exc)  # fmt: skip

    def _restore(self, message: Any) -> None:
        """A message unacknowledged when the channel closes, or rejected with requeue: roll
        it back in bucketq (kombu's own puts a copy back)."""
        self._rollback(message.delivery_tag)

    def _restore_at_beginning(self, message: Any) -> None:
        self._rollback(message.delivery_tag)

    # -- sizes ----------------------------------------------------------------------------------

    def _size(self, queue: str) -> int:
        return self.connection.queue(queue).size()

    def _purge(self, queue: str) -> int:
        return self.connection.purge(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)


class Transport(virtual.Transport):
    """bucketq as a kombu transport (Celery's broker): ``bucketq://HOST[:PORT]/DATABASE``
    or ``bucketq+<MongoDB URI>``; ``broker_transport_options`` are bucketq's queue options
    and the broker's own (``BrokerOptions``)."""

    Channel = Channel
    can_parse_url = True  # the URL is a MongoDB URI: pymongo parses it
    #: The channel waits in ``reserve``, woken by a push or a change stream: kombu's sleep
    #: between empty polls is not needed.
    polling_interval = 0
    default_port = 27017  # type: ignore[assignment]
    driver_type = "bucketq"
    driver_name = "bucketq"
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=core.EXCHANGE_TYPES, heartbeats=False
    )
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors, ConnectionFailure, ServerUnavailable,
    )  # fmt: skip
    channel_errors = (*virtual.Transport.channel_errors, OperationFailed)  # type: ignore[assignment]

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.polling_interval = 0
        self.options = core.broker_options(client.transport_options)
        self.uri, self.database = core.mongodb_uri(
            client.hostname, userid=client.userid, password=client.password, port=client.port
        )
        self._mongo: MongoClient | None = None
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()

    def driver_version(self) -> str:
        return version()

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        shown = uri if include_password else core.sanitized(uri, mask)
        return shown if shown.startswith(f"{core.ALIAS}://") else f"{core.ALIAS}+{shown}"

    def establish_connection(self) -> Any:
        with self._lock:
            if self._mongo is None:
                mongo: MongoClient = MongoClient(self.uri, appname="bucketq-celery")
                try:
                    wait = getattr(self.client, "connect_timeout", None) or 5
                    with pymongo_timeout(float(wait)):
                        mongo.admin.command("ping")
                except PyMongoError:
                    mongo.close()
                    raise
                self._mongo = mongo
        return super().establish_connection()

    def queue(self, name: str) -> Queue:
        """The bucketq queue of a kombu queue (one per name and connection)."""
        q = self._queues.get(name)
        if q is None:
            with self._lock:
                q = self._queues.get(name)
                if q is None:
                    if self._mongo is None:
                        raise ServerUnavailable(
                            "The bucketq broker connection is closed; open a new one."
                        )
                    q = Queue(self._mongo[self.database], name, **self.options.queue)
                    self._queues[name] = q
        return q

    def purge(self, name: str) -> int:
        """Delete the stored messages of queue ``name`` that no consumer holds (delayed
        ones too); messages being handled stay. Returns how many were deleted. Each bucket
        is deleted only if it is as it was read (its lease and live count), so a bucket a
        worker claims meanwhile is kept."""
        q = self.queue(name)
        q.flush()
        col = q.db[q.name]
        deleted = 0
        flt = bucket.not_leased(bucket.to_datetime(time.time()))
        for doc in col.find(flt, {"live": 1, "lease": 1}):
            same = {"_id": doc["_id"], "live": doc.get("live"), "lease": doc.get("lease")}
            if col.delete_one(same).deleted_count:
                deleted += int(doc.get("live") or 0)
        return deleted

    def close_connection(self, connection: Any) -> None:
        """Close the channels (unacknowledged messages are rolled back), then the queues
        (their open buckets written, held buckets released), then the client."""
        try:
            super().close_connection(connection)
        finally:
            with self._lock:
                queues, self._queues = list(self._queues.values()), {}
                mongo, self._mongo = self._mongo, None
            for q in queues:
                try:
                    q.close()
                except BucketQError as exc:
                    log.warning("closing queue %s: %s (its leases give back what it held)",
                                q.name, exc)  # fmt: skip
            if mongo is not None:
                mongo.close()
