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
  is delivered again, ``tries`` + 1 (``redelivered`` in the message's delivery info);
- a worker's shutdown beginning (Celery's ``worker_shutting_down`` signal) or its
  consumer cancelled -> nothing more is delivered, and ``pause(release=True)``: what it
  holds and has not delivered goes back at once, no try counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import weakref
from queue import Empty
from typing import Any

from celery import signals
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

#: The channels of this process (for Celery's shutdown signal).
_CHANNELS: weakref.WeakSet[Channel] = weakref.WeakSet()


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
        #: Set when the worker's shutdown begins: nothing more is delivered.
        self._stopping = False
        _CHANNELS.add(self)

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
        consumed = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.connection.take_again(queue)
        return consumed

    def basic_cancel(self, consumer_tag: Any) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        self._no_ack_queues.discard(queue)
        cancelled = super().basic_cancel(consumer_tag)
        conn = self.connection
        if queue is not None and conn is not None:
            if not any(queue in ch._active_queues for ch in conn.channels):
                conn.give_back(queue)
        return cancelled

    def stop_delivering(self) -> None:
        """The worker's shutdown began: deliver nothing more. Only a flag (Celery's signal
        handler calls it); ``give_back`` does the rest."""
        self._stopping = True

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
        """Deliver one message: from the first of ``queues`` (taken in turn) that has one
        ready, else the first to get one within a wait on one of them (up to
        ``polling_interval``, shorter with several queues). Raises Empty when nothing
        came.

        One at a time: Celery's consumer blocks in each delivery while its pool is busy
        (prefork), so a batch would hold messages no task runs on, which the queue
        cannot give back at shutdown; one left in the queue's memory it can."""
        wait = self.connection.options.polling_interval
        if len(queues) > 1:
            wait = min(wait, core.MULTI_QUEUE_WAIT)
        if timeout is not None:
            wait = min(wait, timeout)
        if self._stopping or not queues:
            # Celery's loop drains once more after it saw the stop: wait as a wait for
            # a message would (kombu calls again at once), and deliver nothing.
            time.sleep(wait)
            raise Empty()
        start = self._turn % len(queues)
        self._turn += 1
        order = queues[start:] + queues[:start]
        for name in order:
            msgs = self.connection.queue(name).reserve_many(1, timeout=0)
            if msgs:
                return self._deliver_one(name, msgs[0])
        msgs = self.connection.queue(order[0]).reserve_many(1, timeout=wait)
        if msgs:
            return self._deliver_one(order[0], msgs[0])
        raise Empty()

    def _deliver_one(self, queue: str, msg: Message) -> None:
        if self._stopping:
            # Taken as the shutdown began: not delivered, and released with the queue
            # when the connection closes (no try counted).
            log.info("message %s of queue %s not delivered: the worker is stopping",
                     msg.id, queue)  # fmt: skip
            raise Empty()
        self.connection._deliver(self._hand_out(queue, msg, queue in self._no_ack_queues), queue)

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

    def give_back(self, name: str) -> None:
        """No consumer of this connection takes from queue ``name`` now (cancelled, or the
        worker is stopping): it hands out nothing more, and gives back what it holds and
        has not delivered (at once; a bucket with tasks running here once they are
        acknowledged), no try counted, so other workers get it."""
        q = self._queues.get(name)
        if q is not None:  # no queue object: it holds nothing
            q.pause(release=True)

    def take_again(self, name: str) -> None:
        """A consumer of queue ``name`` again (after ``give_back``): it claims again."""
        q = self._queues.get(name)
        if q is not None:
            q.resume()

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
        (their open buckets written, held buckets released at once: with the channels
        closed nothing here consumes, so nothing is waited for), then the client."""
        try:
            super().close_connection(connection)
        finally:
            with self._lock:
                queues, self._queues = list(self._queues.values()), {}
                mongo, self._mongo = self._mongo, None
            for q in queues:
                try:
                    q.drain(timeout=0)
                except BucketQError as exc:
                    log.warning("closing queue %s: %s (its leases give back what it held)",
                                q.name, exc)  # fmt: skip
                with contextlib.suppress(BucketQError):  # said above
                    q.close()  # its workers stop, whether the drain could reach MongoDB or not
            if mongo is not None:
                # Its server sessions are ended as a courtesy (the server drops them by
                # itself later): a store that is gone must not hold the worker's exit for
                # a server selection timeout, once for each of Celery's connections.
                with pymongo_timeout(core.CLOSE_TIMEOUT):
                    mongo.close()


def _stop_delivering(**_: Any) -> None:
    """Celery's ``worker_shutting_down``, sent from its SIGTERM/SIGINT/SIGQUIT handler
    before its loop sees the stop (which may be a task's length later: the loop waits in
    a delivery while the pool is busy, and then drains once more). Here only flags are
    set; the queues are paused from a thread, as they take locks the interrupted main
    thread may hold."""
    channels = [ch for ch in list(_CHANNELS) if ch._consumers and ch.connection is not None]
    for ch in channels:
        ch.stop_delivering()
    if channels:
        threading.Thread(
            target=_give_back, args=(channels,), name="bucketq-celery-stop", daemon=True
        ).start()


def _give_back(channels: list[Channel]) -> None:
    for ch in channels:
        conn = ch.connection
        if conn is None:
            continue  # closed meanwhile: its close released what it held
        for name in list(ch._active_queues):
            conn.give_back(name)


signals.worker_shutting_down.connect(_stop_delivering, weak=False, dispatch_uid="bucketq.celery")
