"""The ``redis`` transport: one Redis stream per shard, read through a consumer group.

Keys (``prefix`` is ``RESERVOIR_BUFFER_STREAM_PREFIX``)::

    <prefix>:<shard>           stream of envelopes (field ``e``: Extended JSON)
    <prefix>:<shard>:delayed   sorted set of requeued and dispatch-delayed envelopes,
                               scored by due time
    <prefix>:dlq               stream of dead-lettered envelopes, with shard and reason

Acked entries are deleted from the stream in the same MULTI/EXEC as the XACK, so the
stream's length is exactly what is pending (LogTide counted acked entries as pending).
A requeue moves the envelope to the delayed set in one MULTI/EXEC with its ack; an
enqueue with a dispatch delay is one ZADD to that set. A Lua script moves due ones to
the stream atomically (each member once, whichever consumer runs it, in any process). A dead-letter writes the DLQ entry and acks in
one MULTI/EXEC. Deliveries left unacknowledged for ``claim_idle`` seconds (their
consumer died) are taken over with XAUTOCLAIM; while a batch is being written, its
consumer re-claims it (XCLAIM JUSTID) every third of ``claim_idle``, so a slow storage
write is not taken over by another consumer.

Durability is Redis's: run it with ``appendonly yes`` to survive a Redis restart.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from typing import Any

from bson import json_util

from .. import _validate as v
from .._deps import require
from ..errors import TransportError, TransportTimeout, TransportUnavailable
from ._config import DEFAULT_STREAM_PREFIX
from ._policy import dead_entry, replayed_entry
from ._transport import Delivery, Transport

log = logging.getLogger("bucketq.reservoir.redis")

_JSON = json_util.RELAXED_JSON_OPTIONS.with_options(tz_aware=True, tzinfo=UTC)
DEFAULT_CLAIM_IDLE = 60.0
DEFAULT_GROUP = "flush"
#: How long a Redis command (and a connection attempt) of a client built from ``url``
#: may wait for an answer: longer than the 200 ms blocking reads of ``dequeue``. A
#: server that stops answering then fails the call with TransportTimeout.
DEFAULT_SOCKET_TIMEOUT = 5.0

# Move due envelopes from the delayed set back into the stream, atomically.
_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, m in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'e', m)
  redis.call('ZREM', KEYS[1], m)
end
return #due
"""


def encode(entry: dict[str, Any]) -> str:
    return json_util.dumps(entry, json_options=_JSON)


def decode(raw: bytes | str) -> dict[str, Any]:
    return json_util.loads(raw, json_options=_JSON)


class RedisTransport(Transport):
    """Redis Streams with consumer groups. Pass a ``redis.asyncio.Redis`` client (it
    stays yours) or a ``url``; ``claim_idle`` seconds is how long a delivery may stay
    unacknowledged before another consumer takes it over (make it longer than your
    slowest storage write). A client built from ``url`` waits at most ``socket_timeout``
    seconds for each answer; give a client of your own a ``socket_timeout`` too, or a
    Redis that stops answering hangs the calls."""

    name = "redis"
    durable = True

    def __init__(
        self,
        client: Any = None,
        *,
        url: str | None = None,
        prefix: str = DEFAULT_STREAM_PREFIX,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
        claim_idle: float = DEFAULT_CLAIM_IDLE,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        claim_idle = v.number("claim_idle", claim_idle, lo=0.0, hi=None, open_lo=True)
        socket_timeout = v.number("socket_timeout", socket_timeout, lo=0.0, hi=None, open_lo=True)
        prefix = v.text("prefix", prefix) or prefix
        self._redis_mod = require("redis", "reservoir")
        require("redis.asyncio", "reservoir")
        if client is None:
            if not url:
                raise TransportUnavailable(
                    "The redis transport needs a client or a URL (REDIS_URL)."
                )
            client = self._redis_mod.asyncio.Redis.from_url(
                url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
            )
            self._own_client = True
        else:
            self._own_client = False
        self.r = client
        self.prefix = prefix
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.claim_idle = claim_idle
        # While a batch is written, its deliveries are claimed again (idle time reset)
        # this often, so a storage write slower than claim_idle is not taken over.
        self.keepalive_interval = claim_idle / 3
        self.shards = 0
        self._promote: Any = None
        self._last_claim: dict[int, float] = {}

    # -- keys and errors --------------------------------------------------------------

    def stream(self, shard: int) -> str:
        return f"{self.prefix}:{shard}"

    def delayed(self, shard: int) -> str:
        return f"{self.prefix}:{shard}:delayed"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}:dlq"

    def _translate(self, exc: Exception, what: str) -> TransportError:
        errors = self._redis_mod.exceptions
        if isinstance(exc, errors.TimeoutError):
            return TransportTimeout(f"Redis timed out during {what}: {exc}")
        if isinstance(exc, errors.ConnectionError):
            return TransportUnavailable(f"Redis is unreachable ({what}): {exc}. Check REDIS_URL.")
        return TransportError(f"Redis failed during {what}: {exc}")

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except self._redis_mod.exceptions.RedisError as exc:
            raise self._translate(exc, what) from exc

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, shards: int) -> None:
        self.shards = shards
        self._promote = self.r.register_script(_PROMOTE)
        for s in range(shards):
            try:
                await self.r.xgroup_create(self.stream(s), self.group, id="0", mkstream=True)
            except self._redis_mod.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise self._translate(exc, "XGROUP CREATE") from exc
            except self._redis_mod.exceptions.RedisError as exc:
                raise self._translate(exc, "XGROUP CREATE") from exc

    async def stop(self) -> None:
        if self._own_client:
            self._own_client = False
            await self.r.aclose()

    # -- produce -----------------------------------------------------------------------

    async def enqueue_many(
        self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0
    ) -> None:
        if not entries:
            return
        if delay > 0:
            # A microsecond apart, so the promote script streams them in this order.
            due = time.time() + delay
            members = {encode(e): due + i * 1e-6 for i, e in enumerate(entries)}
            await self._call("ZADD", self.r.zadd(self.delayed(shard), members))
            return
        pipe = self.r.pipeline(transaction=False)
        key = self.stream(shard)
        for e in entries:
            pipe.xadd(key, {"e": encode(e)})
        await self._call("XADD", pipe.execute())

    # -- consume -----------------------------------------------------------------------

    @staticmethod
    def _deliveries(rows: Any) -> list[Delivery]:
        out = []
        for msg_id, fields in rows or ():
            if not fields:
                continue
            out.append(Delivery(decode(fields[b"e"]), msg_id))
        return out

    async def _reclaim(self, shard: int, count: int) -> list[Delivery]:
        now = time.monotonic()
        if now - self._last_claim.get(shard, -1e18) < min(self.claim_idle / 2, 5.0):
            return []
        self._last_claim[shard] = now
        res = await self._call(
            "XAUTOCLAIM",
            self.r.xautoclaim(self.stream(shard), self.group, self.consumer,
                              int(self.claim_idle * 1000), start_id="0-0", count=count),
        )  # fmt: skip
        got = self._deliveries(res[1])
        if got:
            log.warning(
                "shard %d: took over %d deliveries left unacknowledged by a dead consumer",
                shard,
                len(got),
            )
        return got

    async def dequeue(self, shard: int, max_batch: int, max_wait: float) -> list[Delivery]:
        deadline = time.monotonic() + max_wait
        out = await self._reclaim(shard, max_batch)
        stream = self.stream(shard)
        while len(out) < max_batch:
            await self._call(
                "promote",
                self._promote(keys=[self.delayed(shard), stream], args=[time.time(), 1000]),
            )
            remaining = deadline - time.monotonic()
            block = int(min(remaining, 0.2) * 1000)
            res = await self._call(
                "XREADGROUP",
                self.r.xreadgroup(self.group, self.consumer, {stream: ">"}, count=max_batch - len(out),
                                  block=block if block >= 1 else None),
            )  # fmt: skip
            for _, rows in res or ():
                out.extend(self._deliveries(rows))
            if remaining <= 0.001:
                break
        return out

    async def keepalive(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        """XCLAIM ... JUSTID to this consumer: resets the deliveries' idle time."""
        if deliveries:
            await self._call(
                "XCLAIM",
                self.r.xclaim(self.stream(shard), self.group, self.consumer, 0,
                              [d.token for d in deliveries], justid=True),
            )  # fmt: skip

    async def ack(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        ids = [d.token for d in deliveries]
        pipe = self.r.pipeline(transaction=True)
        pipe.xack(self.stream(shard), self.group, *ids)
        pipe.xdel(self.stream(shard), *ids)
        await self._call("ack", pipe.execute())

    async def requeue(self, shard: int, deliveries: Sequence[Delivery], delay: float) -> None:
        if not deliveries:
            return
        due = time.time() + max(delay, 0.0)
        ids = [d.token for d in deliveries]
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(self.delayed(shard), {encode(d.entry): due for d in deliveries})
        pipe.xack(self.stream(shard), self.group, *ids)
        pipe.xdel(self.stream(shard), *ids)
        await self._call("requeue", pipe.execute())

    async def dead_letter(
        self, shard: int, deliveries: Sequence[Delivery], reason: str | None = None
    ) -> int:
        if not deliveries:
            return 0
        ids = [d.token for d in deliveries]
        pipe = self.r.pipeline(transaction=True)
        pipe.xlen(self.dlq)
        for d in deliveries:
            entry = dead_entry(d.entry, shard, reason or d.entry.get("error") or "dead-lettered")
            if self.dlq_max:  # exact MAXLEN: the oldest beyond the bound go, counted below
                pipe.xadd(self.dlq, {"e": encode(entry)}, maxlen=self.dlq_max, approximate=False)
            else:
                pipe.xadd(self.dlq, {"e": encode(entry)})
        pipe.xlen(self.dlq)
        pipe.xack(self.stream(shard), self.group, *ids)
        pipe.xdel(self.stream(shard), *ids)
        res = await self._call("dead-letter", pipe.execute())
        dropped = int(res[0]) + len(deliveries) - int(res[len(deliveries) + 1])
        if dropped > 0:
            await self._call("DLQ dropped count", self.r.incrby(self.dlq_dropped_key, dropped))
        return max(dropped, 0)

    @property
    def dlq_dropped_key(self) -> str:
        return f"{self.prefix}:dlq:dropped"

    async def dlq_dropped(self) -> int:
        return int(await self._call("GET", self.r.get(self.dlq_dropped_key)) or 0)

    async def pending(self) -> dict[int, int]:
        pipe = self.r.pipeline(transaction=False)
        for s in range(self.shards):
            pipe.xlen(self.stream(s))
            pipe.zcard(self.delayed(s))
        res = await self._call("pending", pipe.execute())
        return {s: int(res[2 * s]) + int(res[2 * s + 1]) for s in range(self.shards)}

    # -- DLQ -----------------------------------------------------------------------------

    async def dlq_inspect(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = await self._call("XRANGE", self.r.xrange(self.dlq, count=limit))
        return [dict(decode(f[b"e"]), dlq_id=i.decode()) for i, f in rows]

    async def dlq_replay(
        self, limit: int | None = None, shard_of: Callable[[Mapping[str, Any]], int] | None = None
    ) -> int:
        rows = await self._call("XRANGE", self.r.xrange(self.dlq, count=limit))
        if not rows:
            return 0
        pipe = self.r.pipeline(transaction=True)
        for _, f in rows:
            dead = decode(f[b"e"])
            shard = shard_of(dead) if shard_of is not None else int(dead["shard"])
            pipe.xadd(self.stream(shard), {"e": encode(replayed_entry(dead))})
        pipe.xdel(self.dlq, *[i for i, _ in rows])
        await self._call("replay", pipe.execute())
        return len(rows)

    async def dlq_purge(self) -> int:
        pipe = self.r.pipeline(transaction=True)
        pipe.xlen(self.dlq)
        pipe.delete(self.dlq)
        pipe.delete(self.dlq_dropped_key)
        res = await self._call("purge", pipe.execute())
        return int(res[0])

    async def dlq_size(self) -> int:
        return int(await self._call("XLEN", self.r.xlen(self.dlq)))
