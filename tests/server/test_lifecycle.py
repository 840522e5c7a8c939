"""``bucketq serve`` through storage outages and shutdowns: ``/ready`` follows the
storage server, a 503 (never a 200) while nothing can be accepted, and SIGTERM under
load with the bucketq transport loses no acknowledged record."""

from __future__ import annotations

import signal
import threading
import uuid
from pathlib import Path

import httpx
from pymongo import MongoClient
from stored_logs import stored_logs

from bucketq.embedded import EmbeddedServer
from bucketq.server import _keys
from bucketq.stream import StreamQueue
from waiting import eventually

from .helpers import TLS, Serve, log_batch


def test_ready_and_503_follow_the_storage_server(storage: EmbeddedServer, tmp_path: Path) -> None:
    """The buffer's transport (bucketq) and storage live on the stopped server: both
    fail, so an ingest is a 503 with Retry-After, never a 200; all comes back after."""
    env = {"BUCKETQ_MONGODB_TIMEOUT_MS": "1000", "BUCKETQ_INGEST_TIMEOUT_MS": "2000",
           "RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "bucketq",
           "RESERVOIR_BUFFER_SHARDS": "2", "RESERVOIR_BUFFER_MAX_BATCH_AGE_MS": "200"}  # fmt: skip
    serve = Serve(storage.uri, "readiness", tmp_path / "serve.log", **env).start()
    with serve.stops_cleanly():
        with MongoClient(storage.uri) as client:
            key = _keys.create_key(client["readiness"], "ready")
        with serve.client(key) as c:
            assert c.get("/ready").status_code == 200
            assert c.post("/api/v1/ingest", json=log_batch(2, prefix="before")).status_code == 200

            storage.stop(keep_data=True)
            r = eventually(lambda: (r := c.get("/ready")).status_code == 503 and r,
                           what="/ready to fail with the storage server stopped")  # fmt: skip
            assert r.json()["detail"]["storage"].startswith("unreachable")
            assert c.get("/health").status_code == 200  # alive, not ready
            r = c.post("/api/v1/ingest", json=log_batch(2, prefix="during"))
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) > 0 and r.json()["request_id"]
            assert "key store" not in r.json()["message"]  # the key was seen: its state is kept
            assert c.get("/api/v1/logs").status_code == 503

            storage.start()
            eventually(
                lambda: c.get("/ready").status_code == 200, what="/ready after the storage restart"
            )

            def accepted_after() -> bool:
                # Right after the restart the transport may still be backing off from
                # the outage: a 503 then, retried as a client does (once, by its key).
                r = c.post("/api/v1/ingest", json=log_batch(2, prefix="after"),
                           headers={"Idempotency-Key": "after"})  # fmt: skip
                assert r.status_code in (200, 503), r.text
                return r.status_code == 200

            eventually(accepted_after, what="an ingest accepted after the restart")

            def stored() -> set[str]:
                return {x["message"] for x in c.get("/api/v1/logs").json()["logs"]}

            want = {"before-0", "before-1", "after-0", "after-1"}
            eventually(lambda: want <= stored(), what="the acknowledged records in storage")
        assert "Traceback" not in serve.output()


def test_sigterm_with_the_storage_gone_exits_1_and_says_what_was_kept(
    storage: EmbeddedServer, tmp_path: Path
) -> None:
    """The buffer's transport (bucketq) and storage live on a stopped server: the
    buffer's stop cannot finish, so the process gives up on it (graceful time + 5 s),
    logs that the pending records were kept by the transport, and exits 1 instead of
    hanging. A process started once storage is back stores every kept record."""
    env = {"RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "bucketq",
           "RESERVOIR_BUFFER_SHARDS": "2", "RESERVOIR_BUFFER_MAX_BATCH_SIZE": "10000",
           "RESERVOIR_BUFFER_MAX_BATCH_AGE_MS": "600000",  # held in the buffer until stop
           "RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS": "1000",
           "RESERVOIR_BUFFER_BUCKETQ_LEASE_MS": "3000"}  # kept records: back 3 s after  # fmt: skip
    serve = Serve(storage.uri, "gone", tmp_path / "serve.log", **env).start()
    try:
        with MongoClient(storage.uri) as client:
            key = _keys.create_key(client["gone"], "gone")
        with serve.client(key) as c:
            for i in range(3):
                r = c.post("/api/v1/ingest", json=log_batch(10, prefix=f"held{i}"))
                assert r.status_code == 200, r.text
        storage.stop(keep_data=True)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGTERM)
        code = serve.proc.wait(120)  # a generous bound: without the forced exit, never
        out = serve.output()
        # 1 both when the process ends by itself after giving up on the buffer and when
        # the forced exit ends it ("exiting (1)"): whichever comes first on this machine.
        assert code == 1, out[-3000:]
        assert "buffer stop did not finish" in out, out[-3000:]
        assert "30 records pending were kept by the transport for the next process" in out

        storage.start()
        serve.env["RESERVOIR_BUFFER_MAX_BATCH_AGE_MS"] = "200"
        serve.start()
        with MongoClient(storage.uri) as client:
            eventually(lambda: len(stored_logs(client["gone"], {"project_id": "gone"})) == 30,
                       timeout=60, what="the 30 kept records stored by the next process")  # fmt: skip
    finally:
        serve.terminate()


def test_open_breaker_writes_straight_to_storage(
    mongo_uri: str, mongo_client: MongoClient, tmp_path: Path
) -> None:
    """Memory transport, breaker threshold 1: the first request is buffered and opens
    the breaker; the next goes straight to storage (stored before its 200); SIGTERM
    drains the first and the report says nothing was lost."""
    database = f"bqs_brk_{uuid.uuid4().hex[:8]}"
    db = mongo_client[database]
    key = _keys.create_key(db, "brk")
    env = {"RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "memory",
           "RESERVOIR_BUFFER_PENDING_THRESHOLD": "1", "RESERVOIR_BUFFER_MAX_BATCH_AGE_MS": "3000"}  # fmt: skip
    serve = Serve(mongo_uri, database, tmp_path / "serve.log", **env).start()
    with serve.stops_cleanly():
        with serve.client(key) as c:
            assert c.post("/api/v1/ingest", json=log_batch(10, prefix="held")).status_code == 200
            assert c.post("/api/v1/ingest", json=log_batch(10, prefix="direct")).status_code == 200
            assert len(stored_logs(db, {"message": {"$regex": "^direct-"}})) == 10
            text = c.get("/metrics").text
        assert 'reservoir_buffer_enqueued_total{kind="log"' in text
        bypassed = [
            ln for ln in text.splitlines() if ln.startswith("reservoir_buffer_bypass_total{")
        ]
        assert sum(float(ln.rsplit(" ", 1)[1]) for ln in bypassed) == 10
        assert "reservoir_buffer_breaker_state 1.0" in text
    assert "lost=0" in serve.output() and "timed_out=False" in serve.output()
    assert len(stored_logs(db)) == 20
    mongo_client.drop_database(database)


def test_sigterm_under_load_with_the_bucketq_transport(
    mongo_uri: str, mongo_client: MongoClient, tmp_path: Path
) -> None:
    """Every record answered 200 before, during and after SIGTERM is in storage once
    the next process drained what the transport kept; the tee stream has each once."""
    database = f"bqs_term_{uuid.uuid4().hex[:8]}"
    db = mongo_client[database]
    key = _keys.create_key(db, "term")
    env = {
        "RESERVOIR_BUFFER_ENABLED": "true",
        "RESERVOIR_BUFFER_TRANSPORT": "bucketq",
        "RESERVOIR_BUFFER_SHARDS": "2",
        "RESERVOIR_BUFFER_MAX_BATCH_AGE_MS": "200",
        "RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS": "3000",
        "BUCKETQ_TEE_STREAM": "received",
    }
    serve = Serve(mongo_uri, database, tmp_path / "serve.log", **env).start()
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def client_loop(n: int) -> None:
        with httpx.Client(
            verify=TLS, base_url=serve.url, headers={"X-API-Key": key}, timeout=30
        ) as c:
            for i in range(10_000):
                if stop.is_set():
                    return
                batch = log_batch(10, prefix=f"c{n}-{i}")
                try:
                    r = c.post("/api/v1/ingest", json=batch)
                except httpx.TransportError:
                    return  # the server stopped listening
                if r.status_code == 200:
                    with lock:
                        acked.extend(x["message"] for x in batch["logs"])
                elif r.status_code != 503:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        eventually(lambda: len(acked) >= 300, what="300 records acknowledged")
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGTERM)
        code = serve.proc.wait(60)
        stop.set()
        for t in threads:
            t.join(60)
        assert code == 0, serve.output()
        assert not errors, errors[:3]
        out = serve.output()
        assert "buffer stopped: flushed=" in out and "lost=0" in out, out[-2000:]

        # A new process drains what the bucketq transport kept.
        serve.start()
        want = set(acked)
        eventually(lambda: len({r["message"] for r in stored_logs(db)} & want) == len(want),
                   timeout=60, what="every acknowledged record in storage")  # fmt: skip
    finally:
        stop.set()
        serve.terminate()
        for t in threads:
            t.join(60)

    # The tee stream got every acknowledged record (and nothing twice).
    q = StreamQueue(db, "received")
    consumer = q.consumer()
    teed: list[str] = []
    # Every acknowledged record, each batch waited for generously; then whatever else
    # is there at once (records the tee took but the client never saw answered).
    while (batch := consumer.next_batch(timeout=0 if want <= set(teed) else 30)) is not None:
        teed.extend(item["message"] for item in batch.items)
        consumer.ack(batch.seq)
    consumer.close()
    q.close()
    assert want <= set(teed) and len(teed) == len(set(teed))
    mongo_client.drop_database(database)
