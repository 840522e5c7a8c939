"""Build a transport, or a whole buffer, from a :class:`BufferConfig`."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from ._config import BufferConfig, from_env
from ._reservoir import Reservoir
from ._transport import MemoryTransport, PassthroughTransport, Transport


def create_transport(
    config: BufferConfig, *, db: Any = None, redis: Any = None, **options: Any
) -> Transport:
    """The transport ``config.transport`` names. ``db`` (a pymongo ``AsyncDatabase``) is
    used by ``bucketq`` (else ``config.mongodb_uri``); ``redis`` (a
    ``redis.asyncio.Redis``) by ``redis`` (else ``config.redis_url``). Extra ``options``
    go to the transport's constructor."""
    name = config.transport
    if name == "memory":
        return MemoryTransport(capacity=config.memory_capacity, **options)
    if name == "passthrough":
        return PassthroughTransport(capacity=config.memory_capacity, **options)
    if name == "redis":
        from ._redis import RedisTransport

        if redis is None and not config.redis_url:
            raise ConfigurationError("The redis transport needs REDIS_URL (or a redis client).")
        return RedisTransport(redis, url=config.redis_url or None, prefix=config.stream_prefix,
                              claim_idle=config.claim_idle_ms / 1000, **options)  # fmt: skip
    if name == "bucketq":
        from ._bucketq import BucketqTransport

        if db is None:
            if not config.mongodb_uri:
                raise ConfigurationError(
                    "The bucketq transport needs a MongoDB database: pass db=, or set BUCKETQ_MONGODB_URI."
                )
            from pymongo import AsyncMongoClient

            from ..bucket.deadline import client_timeouts

            uri = config.mongodb_uri
            db = AsyncMongoClient(uri, **client_timeouts(uri)).get_default_database("bucketq")
        queue_options = {
            "lease": config.bucketq_lease_ms / 1000,
            **options.pop("queue_options", {}),
        }
        return BucketqTransport(db, prefix=config.stream_prefix, queue_options=queue_options,
                                commit_window=config.bucketq_commit_window_ms / 1000, **options)  # fmt: skip
    raise ConfigurationError(
        f"Unknown transport {name!r}; use memory, redis, bucketq or passthrough."
    )


def wrap_reservoir(
    reservoir: Reservoir,
    config: BufferConfig | None = None,
    *,
    db: Any = None,
    redis: Any = None,
    registry: Any = None,
) -> Reservoir:
    """``reservoir`` itself when the buffer is off (``RESERVOIR_BUFFER_ENABLED`` unset),
    else a :class:`BufferedReservoir` around it (not started yet). Reads the environment
    when ``config`` is None; an invalid value raises here, at start."""
    from ._buffered import BufferedReservoir

    cfg = from_env() if config is None else config
    if not cfg.enabled:
        return reservoir
    return BufferedReservoir(
        reservoir, create_transport(cfg, db=db, redis=redis), cfg, registry=registry
    )
