"""The Celery broker's decisions, with no kombu and no I/O: the broker URL as a MongoDB
URI, transport options as queue options, a message's ETA as its mature time, and what
bucketq refuses (with the words that say what to do instead)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus, unquote

from pymongo import uri_parser

from .. import _validate as v
from ..errors import ConfigurationError, NotSupported
from ..queue import QueueOptions

log = logging.getLogger("bucketq.celery")

#: The URL scheme: ``bucketq://host/db``, and ``bucketq+`` before any MongoDB URI.
ALIAS = "bucketq"
#: What kombu imports for it (``site-packages/_bucketq_kombu.py`` names the same).
TARGET = "bucketq.celery:Transport"
#: The database of a broker URL without one (``bucketq://host``).
DEFAULT_DATABASE = "celery"
#: How long a task may run unacknowledged, past its lease, before its message is
#: delivered again (Redis's ``visibility_timeout`` is one hour too). Its worker's lease is
#: renewed meanwhile; a worker that dies lets its messages go after ``lease`` alone.
DEFAULT_REJECT_TIMEOUT_GRACE = 3600.0
#: Seconds a connection's close waits for MongoDB to end its client's sessions.
CLOSE_TIMEOUT = 2.0
#: How long one wait for a message lasts before the worker's loop looks at its other
#: duties (a message stored meanwhile ends the wait at once), and with several queues
#: how long each wait lasts before the next queue is looked at.
DEFAULT_WAIT = 1.0
MULTI_QUEUE_WAIT = 0.1

#: The exchange types bucketq routes: direct, by routing key, to the queues the
#: publishing process declared (Celery declares the queue it sends to).
EXCHANGE_TYPES = frozenset({"direct"})
#: Queue arguments bucketq cannot honour (priorities, per-queue TTLs, RabbitMQ's types).
REFUSED_QUEUE_ARGUMENTS = ("x-max-priority", "x-message-ttl", "x-expires", "x-queue-type")


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    """Celery's ``broker_transport_options`` on bucketq: the options of each queue
    (``bucketq.queue.QueueOptions``, checked when the connection opens), and the
    broker's own."""

    #: Keyword arguments of every ``Queue`` this broker opens.
    queue: dict[str, Any] = field(default_factory=dict)
    #: A publish returns once the message is stored (journaled, by the queue's write
    #: concern); False: at once, stored within ``bucket_max_wait`` (a crash meanwhile
    #: loses it).
    publish_durable: bool = v.option(True, v.flag)
    #: The longest wait for a message in one call (see ``DEFAULT_WAIT``).
    polling_interval: float = v.option(DEFAULT_WAIT, v.number, open_lo=True)

    def __post_init__(self) -> None:
        v.check_options(self)


#: Names kombu reads itself: its virtual channel's (``Channel.from_transport_options``) and
#: its connection's retry policy (``Connection._extract_failover_opts``; Celery puts its
#: publish retry policy there).
KOMBU_OPTIONS = frozenset({
    "body_encoding", "deadletter_queue", "max_retries", "interval_start", "interval_step",
    "interval_max", "connect_retries_timeout", "errback", "callback",
})  # fmt: skip
_QUEUE_FIELDS = frozenset(f.name for f in fields(QueueOptions) if f.init)
_BROKER_FIELDS = frozenset(f.name for f in fields(BrokerOptions) if f.name != "queue")


def broker_options(transport_options: dict[str, Any] | None) -> BrokerOptions:
    """Split ``broker_transport_options``: bucketq's queue options (checked now, so a bad
    value fails the connection, not the first push), the broker's own, and
    ``visibility_timeout`` (Redis's and SQS's name for "a message not acknowledged in this
    long is delivered again": ``lease + reject_timeout_grace`` here). Other names are
    another transport's (an app moving from Redis keeps its options): logged, ignored."""
    given = dict(transport_options or {})
    queue: dict[str, Any] = {
        "reject_timeout_grace": DEFAULT_REJECT_TIMEOUT_GRACE,
    }
    own: dict[str, Any] = {}
    ignored = []
    for name, value in given.items():
        if name in _QUEUE_FIELDS:
            queue[name] = value
        elif name in _BROKER_FIELDS:
            own[name] = value
        elif name not in KOMBU_OPTIONS and name != "visibility_timeout":
            ignored.append(name)
    if "visibility_timeout" in given:
        if "reject_timeout_grace" in given:
            raise ConfigurationError(
                "Give visibility_timeout or reject_timeout_grace in broker_transport_options, "
                "not both: on bucketq a message is delivered again lease + "
                "reject_timeout_grace seconds after it was delivered unacknowledged."
            )
        visibility = v.number("visibility_timeout", given["visibility_timeout"], open_lo=True)
        lease = queue.get("lease", QueueOptions().lease)
        queue["reject_timeout_grace"] = max(0.0, visibility - float(lease))
    if ignored:
        log.warning(
            "broker_transport_options %s are not bucketq's and are ignored (bucketq's: "
            "visibility_timeout, %s, and the queue options %s)",
            ", ".join(sorted(ignored)), ", ".join(sorted(_BROKER_FIELDS)),
            ", ".join(sorted(_QUEUE_FIELDS)),
        )  # fmt: skip
    QueueOptions.build(**queue)  # every queue option checked once, here
    return BrokerOptions(queue=queue, **own)


def mongodb_uri(
    hostname: str | None,
    *,
    userid: str | None = None,
    password: str | None = None,
    port: int | None = None,
) -> tuple[str, str]:
    """The MongoDB URI and database of a broker URL. kombu hands the transport
    ``bucketq://rest`` whole (it parses no URL for it), or with ``bucketq+`` already cut
    off, the MongoDB URI itself (``mongodb://...`` or ``mongodb+srv://...``); a bare host
    name comes with ``userid``, ``password`` and ``port`` beside it."""
    text = (hostname or "localhost").strip()
    if text.startswith(f"{ALIAS}://"):
        uri = "mongodb://" + text[len(ALIAS) + 3 :]
    elif text.startswith(("mongodb://", "mongodb+srv://")):
        uri = text
    elif "://" in text:
        raise ConfigurationError(
            f"The broker URL {text.split('://', 1)[0]}://... is not bucketq's: give "
            "bucketq://HOST[:PORT]/DATABASE, or bucketq+ followed by any MongoDB URI "
            "(bucketq+mongodb://... or bucketq+mongodb+srv://...)."
        )
    else:
        auth = ""
        if userid:
            auth = quote_plus(userid) + (f":{quote_plus(password)}" if password else "") + "@"
        uri = f"mongodb://{auth}{text}" + (f":{port}" if port else "") + "/"
    if uri.endswith("://"):
        uri += "localhost"
    if uri.startswith("mongodb://"):  # checked now; an SRV name is looked up by the client
        try:
            uri_parser.parse_uri(uri, validate=False)
        except Exception as exc:
            raise ConfigurationError(f"The broker URL is not a valid MongoDB URI: {exc}") from exc
    path = uri.split("://", 1)[1].split("?", 1)[0]
    database = unquote(path.split("/", 1)[1]) if "/" in path else ""
    return uri, database or DEFAULT_DATABASE


def sanitized(uri: str, mask: str = "**") -> str:
    """A broker URL to show: its password replaced by ``mask``."""
    head, sep, rest = uri.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return uri
    auth, at, tail = rest.partition("@")
    user = auth.split(":", 1)[0]
    return f"{head}://{user}:{mask}@{tail}" if ":" in auth else uri


def eta_of(message: dict[str, Any]) -> datetime | None:
    """When a Celery message may run (``apply_async(countdown=...)``, ``eta=...``, a
    retry's countdown): the ``eta`` header of Celery's message protocol 2, an ISO 8601
    time; naive means UTC. None: now."""
    eta = (message.get("headers") or {}).get("eta")
    if eta is None:
        return None
    if isinstance(eta, datetime):
        when = eta
    else:
        try:
            when = datetime.fromisoformat(str(eta))
        except ValueError as exc:
            raise ConfigurationError(
                f"The message's eta header {eta!r} is not an ISO 8601 time."
            ) from exc
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def check_priority(priority: Any) -> None:
    """bucketq has no priorities: a message that asks for one is refused, not sent at the
    wrong priority."""
    if priority not in (None, 0):
        raise NotSupported(
            f"bucketq has no message priorities (this message asks for priority {priority!r}): "
            "send it without one (unset task_default_priority and the task's priority), or "
            "route urgent tasks to a queue of their own with workers of their own."
        )


def check_exchange_type(exchange: str, type: str) -> None:
    """Only direct exchanges: fan-out (Celery's remote control, broadcast queues) and topic
    (Celery's events, topic routing) need a broker that copies or matches messages
    across processes, which bucketq does not."""
    if type in EXCHANGE_TYPES:
        return
    if type == "fanout":
        raise NotSupported(
            f"bucketq has no fan-out exchanges (exchange {exchange!r}): Celery's remote "
            "control (celery inspect/control, app.control, revoke) and Broadcast queues need "
            "one. Use them on a broker that has fan-out (RabbitMQ, Redis); on bucketq, "
            "`bucketq queues` shows what each queue holds."
        )
    if type == "topic":
        raise NotSupported(
            f"bucketq has no topic exchanges (exchange {exchange!r}): Celery's events "
            "(worker -E, worker_send_task_events, task_send_sent_event; monitors such as "
            "Flower) and topic routing need one. Turn events off, and route tasks by queue "
            "name (task_routes, apply_async(queue=...))."
        )
    raise NotSupported(
        f"bucketq routes only by queue name (direct exchanges); exchange {exchange!r} is of "
        f"type {type!r}."
    )


def check_queue_arguments(queue: str, arguments: dict[str, Any] | None) -> None:
    """Refuse queue arguments bucketq cannot honour."""
    refused = sorted(set(arguments or {}) & set(REFUSED_QUEUE_ARGUMENTS))
    if refused:
        raise NotSupported(
            f"Queue {queue!r} is declared with {', '.join(refused)}, which bucketq does not "
            "honour (no priorities, no per-queue expiry, one kind of queue): declare it "
            "without (unset task_queue_max_priority and the queue's max_priority)."
        )


def unroutable(exchange: str, routing_key: str) -> NotSupported:
    """A message that matches no queue: AMQP would drop it; bucketq refuses it, so nothing
    is lost without a word."""
    return NotSupported(
        f"No queue is bound to exchange {exchange!r} with routing key {routing_key!r} in "
        "this process, so the message would be dropped; bucketq routes by queue name: "
        "publish with queue=NAME (Celery declares it), or declare the queue and its binding "
        "in this process first."
    )
