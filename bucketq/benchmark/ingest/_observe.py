"""What the benchmark sees of storage and of the MongoDB server while a mode runs.

:class:`StorageWatcher` follows a change stream on the storage's log buckets in a thread
and stamps each inserted record of the run (by its ``metadata.bench_req``)
with the ``time.monotonic()`` at which it became visible; with the generator's
acceptance times that gives the end-to-end latency of every record, not a sample.
:class:`Observer` is the benchmark's own MongoDB client: it counts every request it
sends (commands, heartbeats, connection handshakes) so that they can be taken out of
the server's ``serverStatus`` counters, which then say what the API server sent.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pymongo import MongoClient, monitoring
from pymongo.errors import PyMongoError

#: The storage collection of the log buckets (``MongoReservoir``'s default).
LOGS_COLLECTION = "log_buckets"
#: ``serverStatus.opcounters`` keys, and the command names that land in each (the rest
#: counts under "command").
OPCOUNTERS = ("insert", "query", "update", "delete", "getmore", "command")
_OPCOUNTER_OF = {"insert": "insert", "find": "query", "update": "update", "delete": "delete",
                 "getMore": "getmore"}  # fmt: skip


class _Counter(
    monitoring.CommandListener,
    monitoring.ServerHeartbeatListener,
    monitoring.ConnectionPoolListener,
):
    """Every request this client sends to the server, by opcounter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_opcounter = dict.fromkeys(OPCOUNTERS, 0)
        self.requests = 0

    def _add(self, counter: str) -> None:
        with self.lock:
            self.by_opcounter[counter] += 1
            self.requests += 1

    def started(self, event: Any) -> None:
        if isinstance(event, monitoring.CommandStartedEvent):
            self._add(_OPCOUNTER_OF.get(event.command_name, "command"))
        elif isinstance(event, monitoring.ServerHeartbeatStartedEvent):
            self._add("command")

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass

    def connection_created(self, event: Any) -> None:
        self._add("command")  # the handshake's hello

    # the rest of the pool events are of no interest
    def pool_created(self, event: Any) -> None: ...
    def pool_ready(self, event: Any) -> None: ...
    def pool_cleared(self, event: Any) -> None: ...
    def pool_closed(self, event: Any) -> None: ...
    def connection_ready(self, event: Any) -> None: ...
    def connection_closed(self, event: Any) -> None: ...
    def connection_check_out_started(self, event: Any) -> None: ...
    def connection_check_out_failed(self, event: Any) -> None: ...
    def connection_checked_out(self, event: Any) -> None: ...
    def connection_checked_in(self, event: Any) -> None: ...

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self.lock:
            return self.requests, dict(self.by_opcounter)


class Observer:
    """The benchmark's MongoDB client, counting its own requests. Heartbeats are polled
    rarely (every 60 s) so that they are few and all counted."""

    def __init__(self, uri: str) -> None:
        self.counter = _Counter()
        self.client: MongoClient = MongoClient(
            uri,
            event_listeners=[self.counter],
            heartbeatFrequencyMS=60_000,
            serverMonitoringMode="poll",
            serverSelectionTimeoutMS=30_000,
        )

    def server_counters(self) -> dict[str, Any]:
        """``serverStatus``'s request counters (``network.numRequests``, ``opcounters``)
        minus every request this client sent so far (this ``serverStatus`` included)."""
        st = self.client.admin.command("serverStatus")
        mine, mine_by = self.counter.snapshot()
        ops = st.get("opcounters") or {}
        return {
            "requests": int((st.get("network") or {}).get("numRequests", 0)) - mine,
            "opcounters": {k: int(ops.get(k, 0)) - mine_by[k] for k in OPCOUNTERS},
        }

    def close(self) -> None:
        self.client.close()


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": after["requests"] - before["requests"],
        "opcounters": {k: after["opcounters"][k] - before["opcounters"][k] for k in OPCOUNTERS},
    }


class StorageWatcher:
    """Follows inserts into ``db[LOGS_COLLECTION]`` of one run (``metadata.bench_run``) and
    keeps ``(request number, record index, monotonic time seen)`` per record."""

    def __init__(self, client: MongoClient, db: str, run_id: str) -> None:
        self.col = client[db][LOGS_COLLECTION]
        self.run_id = run_id
        self.seen: list[tuple[int, int, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bucketq-bench-watch", daemon=True)

    def start(self, timeout: float = 30.0) -> StorageWatcher:
        self._thread.start()
        if not self._ready.wait(timeout):
            self.error = self.error or f"the change stream did not open within {timeout:.0f} s"
        return self

    @property
    def available(self) -> bool:
        return self.error is None

    def _run(self) -> None:
        from ...reservoir import unpack_bucket

        pipeline: list[dict[str, Any]] = [
            {"$match": {"operationType": "insert"}},
            {"$project": {"fullDocument.b": 1}},
        ]
        try:
            with self.col.watch(pipeline, max_await_time_ms=100) as stream:
                self._ready.set()
                while not self._stop.is_set():
                    change = stream.try_next()
                    if change is None:
                        continue
                    now = time.monotonic()
                    for rec in unpack_bucket(change["fullDocument"]):
                        meta = rec.get("metadata") or {}
                        if meta.get("bench_run") == self.run_id:
                            self.seen.append((int(meta["bench_req"]), int(meta["bench_rec"]), now))
        except (PyMongoError, KeyError, TypeError, ValueError) as exc:
            # A standalone server has no change streams: no end-to-end figures then.
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()

    def wait_for(self, n: int, timeout: float) -> bool:
        """Until ``n`` records were seen (True), or ``timeout`` passed or the stream failed."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < n:
            if self.error or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
