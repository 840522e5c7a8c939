"""The brokers ``bucketq bench celery`` runs a Celery worker on, each behind one set of
verbs: its broker URL and transport options, whether it can be reached, how to remove
what a run left, and what its server loses when it dies if this bench cannot kill it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: The lease (bucketq) and visibility timeout (Redis) of the worker-kill runs: a killed
#: worker's messages come back after this long (their defaults: 30 s and 1 hour).
KILL_REDELIVERY = 5.0


def with_database(uri: str, db_name: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path="/" + db_name))


@dataclass(frozen=True)
class Where:
    """The servers of one run: a MongoDB URI (the run's database set), Redis, RabbitMQ."""

    mongodb: str
    redis: str = field(default_factory=lambda: os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    amqp: str = field(default_factory=lambda: os.environ.get("RABBITMQ_URL", DEFAULT_AMQP_URL))
    prefix: str = field(default_factory=lambda: f"bqbench{os.getpid()}:")


@dataclass(frozen=True)
class Broker:
    name: str
    kind: str  # "bucketq", "mongodb", "redis" or "amqp"
    #: Transport options of every run, and those the worker-kill run adds.
    options: dict[str, Any] = field(default_factory=dict)
    kill_options: dict[str, Any] = field(default_factory=dict)
    #: What a killed server loses, as its documentation says, where this bench does not kill
    #: it (a system service other people use); None: measured on the embedded server.
    documented_server_loss: str | None = None

    @property
    def on_mongodb(self) -> bool:
        return self.kind in ("bucketq", "mongodb")

    def url(self, where: Where) -> str:
        if self.kind == "bucketq":
            return "bucketq+" + where.mongodb
        if self.kind == "mongodb":
            return where.mongodb
        return where.redis if self.kind == "redis" else where.amqp

    def transport_options(self, where: Where, *, kill: bool = False) -> dict[str, Any]:
        opts = {**self.options, **(self.kill_options if kill else {})}
        if self.kind == "redis":
            opts["global_keyprefix"] = where.prefix  # the run's keys, removed at the end
        return opts

    def unreachable(self, where: Where) -> str | None:
        """Why this broker cannot be used now, or None."""
        from kombu import Connection

        if self.on_mongodb:
            return None
        try:
            with Connection(self.url(where), connect_timeout=3) as conn:
                conn.ensure_connection(max_retries=1)
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the reason
            return f"{self.url(where).split('@')[-1]} unreachable: {exc}"
        return None

    def persistence(self, where: Where) -> str:
        """How this server is set to persist, where that can be read (Redis's CONFIG GET)."""
        if self.kind != "redis":
            return ""
        try:
            import redis

            r = redis.Redis.from_url(where.redis, socket_timeout=3)
            aof = r.config_get("appendonly").get("appendonly")
            save = r.config_get("save").get("save")
        except Exception as exc:  # noqa: BLE001 - a server that refuses CONFIG: say so
            return f"this Redis did not say how it persists ({exc})"
        return f"this Redis: appendonly {aof}, save {save!r}"

    def clean(self, where: Where, queue: str) -> None:
        """Remove what a run left (MongoDB runs drop their database at the end)."""
        if self.kind == "redis":
            import redis

            r = redis.Redis.from_url(where.redis)
            keys = list(r.scan_iter(match=where.prefix + "*", count=1000))
            if keys:
                r.delete(*keys)
        elif self.kind == "amqp":
            from kombu import Connection

            with Connection(where.amqp, connect_timeout=3) as conn:
                ch = conn.channel()
                ch.queue_delete(queue)
                ch.exchange_delete(queue)


REDIS_SERVER_LOSS = (
    "Redis acknowledges "
    "a write once it is in memory; with its default snapshots (RDB) a crash loses what came "
    "after the last snapshot, with appendonly and appendfsync everysec up to about a "
    "second of writes (redis.io, Redis persistence)."
)
AMQP_SERVER_LOSS = (
    "Celery publishes "
    "persistent messages to durable queues without publisher confirms (confirm_publish is "
    "off by default), so a message RabbitMQ took but had not yet written to disk is lost; "
    "only a confirm says a message was persisted (rabbitmq.com, Consumer Acknowledgements "
    "and Publisher Confirms)."
)

BROKERS: dict[str, Broker] = {
    b.name: b
    for b in (
        Broker("bucketq", "bucketq", kill_options={"lease": KILL_REDELIVERY}),
        Broker(
            "bucketq, buffered publish",
            "bucketq",
            options={"publish_durable": False},
            kill_options={"lease": KILL_REDELIVERY},
        ),
        Broker("kombu MongoDB", "mongodb"),
        Broker(
            "Redis",
            "redis",
            # kombu sweeps for messages past their visibility timeout every 10 x 10 s by
            # default: every second here, so the window sees them come back.
            kill_options={
                "visibility_timeout": KILL_REDELIVERY,
                "unacked_restore_interval": 1,
                "unacked_restore_throttle": 1,
            },  # fmt: skip
            documented_server_loss=REDIS_SERVER_LOSS,
        ),
        Broker("RabbitMQ", "amqp", documented_server_loss=AMQP_SERVER_LOSS),
    )
}
