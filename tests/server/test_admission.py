"""Admission control, store-call deadlines, bounded metrics and the key cache of a real
``bucketq serve``: what a client sees, never timing.

A client here waits up to 30 s for an answer: a request the service leaves hanging
fails the test by the client's timeout, not by a measured time."""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from processes import frozen
from pymongo import MongoClient

from bucketq.embedded import EmbeddedServer
from bucketq.server import _keys
from waiting import eventually

from .helpers import TLS, Serve, log_batch

CLIENT_TIMEOUT = 30.0  # the helper client's too
pytestmark = pytest.mark.xdist_group("admission")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def random_key() -> str:
    return _keys.KEY_PREFIX + secrets.token_hex(32)


# -- a frozen store --------------------------------------------------------------------------


def test_a_frozen_store_is_a_503_in_time_and_unknown_keys_evict_no_known_one(
    storage: EmbeddedServer, tmp_path: Path
) -> None:
    """Storage frozen (SIGSTOP): a key never seen (cold cache), a read and readiness
    answer 503 + Retry-After instead of hanging; a flood of invented keys is answered
    without a lookup storm, and the known key, more than the cache's size of unknown
    keys later, still works (the memory buffer accepts its records)."""
    env = {"BUCKETQ_INGEST_TIMEOUT_MS": "1000", "BUCKETQ_READ_TIMEOUT_MS": "1000",
           "BUCKETQ_KEY_CACHE_SIZE": "10", "BUCKETQ_KEY_LOOKUPS_PER_S": "5",
           "BUCKETQ_BODY_TIMEOUT_MS": "1000",
           "RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "memory"}  # fmt: skip
    serve = Serve(storage.uri, "frozen", tmp_path / "serve.log", **env).start()
    with serve.stops_cleanly():
        with MongoClient(storage.uri) as client:
            known = _keys.create_key(client["frozen"], "known")
            cold = _keys.create_key(client["frozen"], "cold")
        with serve.client(known) as c:
            assert c.post("/api/v1/ingest", json=log_batch(1, prefix="before")).status_code == 200
            _body_that_never_arrives_is_a_408(serve, known)
            assert storage.pid is not None
            with frozen(storage.pid):
                r = c.post("/api/v1/ingest", json=log_batch(1), headers={"X-API-Key": cold})
                assert r.status_code == 503, r.text
                assert int(r.headers["Retry-After"]) > 0 and "key store" in r.json()["message"]

                r = c.get("/api/v1/logs")
                assert r.status_code == 503, r.text
                assert int(r.headers["Retry-After"]) > 0
                assert c.get("/ready").status_code == 503
                assert c.get("/health").status_code == 200
                # An idempotency key is claimed in the store before the records are taken.
                r = c.post("/api/v1/ingest", json=log_batch(1, prefix="idem"),
                           headers={"Idempotency-Key": "during-the-freeze"})  # fmt: skip
                assert r.status_code == 503, r.text
                assert "idempotency key store" in r.json()["message"]
                assert int(r.headers["Retry-After"]) > 0

                before = _lookups_sent(c.get("/metrics").text)
                t0 = time.monotonic()
                with ThreadPoolExecutor(8) as pool:
                    answers = list(pool.map(lambda _: _ingest_with(serve, random_key()), range(40)))
                elapsed = time.monotonic() - t0
                text = c.get("/metrics").text
                assert {s for s, _ in answers} <= {429, 503}, answers
                assert all(int(ra) > 0 for _, ra in answers)
                assert 429 in {s for s, _ in answers}  # refused without a lookup

                # 40 unknown keys later (the cache keeps 10 of each kind), the known key
                # still resolves from its last known state: the buffer takes the records.
                r = c.post("/api/v1/ingest", json=log_batch(3, prefix="during"))
                assert r.status_code == 200, r.text
            sent = _lookups_sent(text) - before
            # The lookups that reached the database during the flood stay within the token
            # bucket (5 + 5 per second of the flood; 2 more: the known key's refreshes
            # started before it, counted when they give up), not one per invented key.
            assert sent <= 2 + 5 + 5 * elapsed, text
            assert metric(text, "bucketq_key_lookups_total", result="refused") >= 1

            # resumed: the cold key works, and what was accepted during the freeze is stored
            def cold_accepted() -> bool:
                r = c.post("/api/v1/ingest", json=log_batch(1, prefix="after"),
                           headers={"X-API-Key": cold})  # fmt: skip
                assert r.status_code in (200, 429, 503), r.text
                return r.status_code == 200

            eventually(cold_accepted, what="the cold key to work once storage answers")

            def stored() -> set[str]:
                r = c.get("/api/v1/logs")
                return {x["message"] for x in r.json()["logs"]} if r.status_code == 200 else set()

            want = {"before-0", "during-0", "during-1", "during-2"}
            eventually(lambda: want <= stored(), what="the records accepted during the freeze")
        assert "Traceback" not in serve.output()


def _lookups_sent(text: str) -> float:
    """Key lookups that reached the database (counted when they ended)."""
    return sum(metric(text, "bucketq_key_lookups_total", result=x)
               for x in ("found", "unknown", "failed"))  # fmt: skip


def _ingest_with(serve: Serve, key: str) -> tuple[int, str]:
    with serve.client(key) as c:
        r = c.post("/api/v1/ingest", json=log_batch(1))
        return r.status_code, r.headers.get("Retry-After", "")


def _body_that_never_arrives_is_a_408(serve: Serve, key: str) -> None:
    """A head promising 1,000 bytes, then 10: 408 once BUCKETQ_BODY_TIMEOUT_MS passed,
    and the connection is closed."""
    with _connect(serve) as s:
        s.sendall(_head("POST", "/api/v1/ingest", key, length=1000) + b'{"logs": [')
        status, headers = _read_head(s)
        assert status == 408 and headers.get("connection") == "close", (status, headers)
        assert _closed(s)


# -- connections, heads, bodies, in flight ---------------------------------------------------

LIMITS = {"BUCKETQ_MAX_CONNECTIONS": "8", "BUCKETQ_HEADER_TIMEOUT_MS": "2000",
          "BUCKETQ_MAX_REQUESTS_IN_FLIGHT": "2", "BUCKETQ_MAX_BODY_BYTES": "20000",
          "BUCKETQ_MAX_RECORDS_IN_FLIGHT": "3"}  # fmt: skip


@pytest.fixture(scope="module")
def limited(
    mongo_uri: str, mongo_client: MongoClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Serve, str]]:
    """A ``bucketq serve`` with small connection and in-flight limits, and a key of it."""
    db = f"bqa_{secrets.token_hex(5)}"
    s = Serve(mongo_uri, db, tmp_path_factory.mktemp("limited") / "serve.log", **LIMITS).start()
    try:
        yield s, _keys.create_key(mongo_client[db], "limited")
    finally:
        s.terminate()
        mongo_client.drop_database(db)


@contextmanager
def _connect(serve: Serve) -> Iterator[socket.socket]:
    host, port = serve.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=CLIENT_TIMEOUT)
    try:
        yield s
    finally:
        s.close()


def _head(method: str, path: str, key: str = "", length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    if key:
        lines.append(f"X-API-Key: {key}")
    if length is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_head(s: socket.socket) -> tuple[int, dict[str, str]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(
        (k.strip().lower(), v.strip()) for k, _, v in (h.partition(":") for h in head[1:])
    )
    return int(head[0].split()[1]), headers


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (reads to its end; a hang fails by the timeout)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_silent_and_slow_header_connections_are_closed(limited: tuple[Serve, str]) -> None:
    serve, _ = limited
    with _connect(serve) as silent, _connect(serve) as slow, _connect(serve) as partial:
        partial.sendall(b"POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\n")
        # the slow client: one header byte at a time, each in time for no idle timer
        done = threading.Event()

        def trickle() -> None:
            line = b"X-Padding: " + b"a" * 10_000
            for i in range(len(line)):
                if done.is_set():
                    return
                try:
                    slow.sendall(line[i : i + 1])
                except OSError:
                    return
                time.sleep(0.05)  # the client's pace, not a wait for the server

        slow.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n")
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            assert _closed(silent) and _closed(partial) and _closed(slow)
        finally:
            done.set()
        t.join()
    r = httpx.get(serve.url + "/metrics", verify=TLS, timeout=CLIENT_TIMEOUT)
    assert r.status_code == 200  # the service answers as before


def test_a_413_closes_the_connection_without_reading_the_rest(limited: tuple[Serve, str]) -> None:
    serve, key = limited
    with _connect(serve) as s:
        s.sendall(_head("POST", "/api/v1/ingest", key, length=50_000_000) + b"[" * 30_000)
        status, headers = _read_head(s)
        assert status == 413 and headers.get("connection") == "close", (status, headers)
        assert _closed(s)


def test_requests_past_the_in_flight_limit_get_503_at_once(limited: tuple[Serve, str]) -> None:
    """Two requests whose bodies have not arrived are in flight (the limit); a third is
    answered 503 + Retry-After, and its connection closed."""
    serve, key = limited
    with _connect(serve) as a, _connect(serve) as b:
        for s in (a, b):
            s.sendall(_head("POST", "/api/v1/ingest", key, length=1000) + b'{"logs": [')

        def third() -> tuple[int, dict[str, str]] | None:
            with _connect(serve) as s:
                body = b'{"logs": []}'
                s.sendall(_head("POST", "/api/v1/ingest", key, length=len(body)) + body)
                status, headers = _read_head(s)
            # the two held requests reach the app shortly after their heads are read
            return (status, headers) if status == 503 else None

        status, headers = eventually(third, what="a third request to be refused")
        assert int(headers["retry-after"]) > 0 and headers.get("connection") == "close"
    r = httpx.get(serve.url + "/metrics", verify=TLS, timeout=CLIENT_TIMEOUT)
    assert metric(r.text, "bucketq_admission_refused_total", reason="requests") >= 1


def test_records_past_the_in_flight_limit_get_503_at_once(limited: tuple[Serve, str]) -> None:
    """Two requests of two records at once: the second, while the first waits for
    storage, would pass BUCKETQ_MAX_RECORDS_IN_FLIGHT (3) and is refused with a 503."""
    serve, key = limited

    def burst() -> list[tuple[int, str, str]] | None:
        def send(_: int) -> tuple[int, str, str]:
            with serve.client(key) as c:
                r = c.post("/api/v1/ingest", json=log_batch(2))
                return r.status_code, r.headers.get("Retry-After", ""), r.text

        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(send, range(8)))
        assert {s for s, _, _ in got} <= {200, 503}, got
        refused = [g for g in got if g[0] == 503 and "BUCKETQ_MAX_RECORDS_IN_FLIGHT" in g[2]]
        return refused or None

    refused = eventually(burst, what="a request refused for the records in flight")
    assert all(int(ra) > 0 for _, ra, _ in refused)


def test_connections_past_the_cap_get_503_and_are_closed(limited: tuple[Serve, str]) -> None:
    """Eight connections held with part of a head (the cap); a request on a ninth is
    answered 503 + Retry-After and closed. The held ones are closed by the head timeout:
    an attempt where one was closed before the ninth was answered is made again."""
    serve = limited[0]

    def attempt() -> tuple[int, dict[str, str]] | None:
        held = [socket.create_connection(_addr(serve), timeout=CLIENT_TIMEOUT) for _ in range(8)]
        try:
            for s in held:
                s.sendall(b"GET /health HTTP/1.1\r\n")
            with _connect(serve) as s:
                s.sendall(_head("GET", "/health"))
                status, headers = _read_head(s)
                assert _closed(s)
            if status == 503:
                return status, headers
            return None  # the cap was not reached: a held one was closed already
        finally:
            for s in held:
                s.close()

    status, headers = eventually(attempt, what="a request over the connection cap")
    assert int(headers["retry-after"]) > 0 and headers.get("connection") == "close"
    eventually(lambda: httpx.get(serve.url + "/health", verify=TLS).status_code == 200,
               what="connections accepted again")  # fmt: skip


def _addr(serve: Serve) -> tuple[str, int]:
    host, port = serve.url.removeprefix("http://").split(":")
    return host, int(port)


def test_invented_methods_and_paths_do_not_grow_metrics(limited: tuple[Serve, str]) -> None:
    serve = limited[0]
    with httpx.Client(verify=TLS, base_url=serve.url) as c:
        before = len(c.get("/metrics").content)
        for i in range(200):
            c.request(f"INVENT{i}", f"/api/v1/ingest/{i}")
            c.request(f"X{i}", "/health")
            c.get(f"/nowhere/{i}")
        text = c.get("/metrics").text
    assert not re.search(r'method="(INVENT|X)\d+"', text)
    assert not re.search(r"nowhere/\d", text)
    assert 'method="other"' in text
    # a handful of new series (method "other", the unmatched route, their statuses)
    assert len(text.encode()) - before < 20_000, len(text.encode()) - before


def test_the_record_gate_refuses_what_storage_cannot_get_through_in_half_the_budget() -> None:
    from bucketq.errors import Overloaded
    from bucketq.server._admission import RecordGate

    now = [0.0]
    gate = RecordGate(10_000, 5, clock=lambda: now[0])
    # storage gets through 1,000 records a second (measured while busy)
    for _ in range(3):
        with gate.admit(500, budget=5.0):
            now[0] += 0.5
    assert gate.rate == 1000
    with gate.admit(2000, budget=5.0):  # alone: always let through
        with gate.admit(400, budget=5.0):  # 2,400 ahead-and-own: 2.4 s < 2.5 s
            with pytest.raises(Overloaded, match="Storage is behind") as e:
                gate.admit(200, budget=5.0).__enter__()  # 2.6 s > half the budget
            assert e.value.status == 503 and e.value.retry_after == 5
        now[0] += 1.0
    assert gate.in_flight == 0
    with pytest.raises(Overloaded, match="BUCKETQ_MAX_RECORDS_IN_FLIGHT"):
        with gate.admit(9_000), gate.admit(1_001):
            pass
