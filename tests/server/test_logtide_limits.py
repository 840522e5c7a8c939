"""What LogTide's routes promise beyond the SDK's happy path, against a real ``bucketq
serve``: a project's retention setting deletes its buckets past it (and no other
project's), the live stream's limits answer 429 and 503 with ``Retry-After``, and a reader
that stops reading is dropped and its place freed."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from pymongo import AsyncMongoClient, MongoClient

from bucketq.reservoir import LogStore, new_record_ids
from bucketq.server import _keys, from_env
from bucketq.server._admission import StreamSlots
from bucketq.server._routes.logtide import EventStream
from waiting import eventually

from .helpers import ROOT, TLS, Serve

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def lim(
    mongo_uri: str, server_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    """One stream a project, two in all; a reader that takes nothing for 1 s is dropped."""
    s = Serve(mongo_uri, server_db, Path(tmp_path_factory.mktemp("lim")) / "serve.log",
              BUCKETQ_STREAMS_PER_PROJECT="1", BUCKETQ_MAX_STREAMS="2",
              BUCKETQ_STREAM_SEND_TIMEOUT_MS="1000", BUCKETQ_STREAM_HEARTBEAT_MS="200").start()  # fmt: skip
    yield s
    s.terminate()


@pytest.fixture
def key(mongo_client: MongoClient, server_db: str) -> str:
    return _keys.create_key(mongo_client[server_db], f"lim-{uuid.uuid4().hex[:8]}")


def _stream_status(serve: Serve, key: str) -> int:
    """Open a stream, read its first event when it is one, close it: its status."""
    with httpx.Client(verify=TLS, base_url=serve.url, timeout=10, headers={"X-API-Key": key}) as h:
        with h.stream("GET", "/api/v1/logs/stream") as r:
            if r.status_code == 200:
                assert next(r.iter_lines()).startswith("data: ")
            return r.status_code


def _refused(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert "live streams" in r.json()["message"]


def test_stream_limits_per_project_429_and_in_all_503(
    lim: Serve, mongo_client: MongoClient, server_db: str
) -> None:
    db = mongo_client[server_db]
    a, b, c = (_keys.create_key(db, f"lim-{uuid.uuid4().hex[:8]}") for _ in range(3))
    with httpx.Client(verify=TLS, base_url=lim.url, timeout=10) as h:
        with h.stream("GET", "/api/v1/logs/stream", headers={"X-API-Key": a}) as first:
            assert first.status_code == 200
            _refused(h.get("/api/v1/logs/stream", headers={"X-API-Key": a}), 429)
            with h.stream("GET", "/api/v1/logs/stream", params={"token": b}) as second:
                assert second.status_code == 200
                _refused(h.get("/api/v1/logs/stream", headers={"X-API-Key": c}), 503)
    # Both closed by their readers: each place is free again.
    for k in (a, b, c):
        assert eventually(lambda k=k: _stream_status(lim, k) == 200, 15, what="a free place")


def test_a_reader_that_stops_reading_is_dropped_and_its_place_freed(lim: Serve, key: str) -> None:
    host, port = lim.url.removeprefix("http://").split(":")
    slow = socket.socket()
    # A small receive window: the service's sends stall once a little is unread.
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(15)
    slow.connect((host, int(port)))
    slow.sendall(
        f"GET /api/v1/logs/stream HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += slow.recv(1024)
    assert head.startswith(b"HTTP/1.1 200")
    # From here the reader takes nothing while large records keep coming.
    big = "x" * 60_000
    with httpx.Client(verify=TLS, base_url=lim.url, timeout=30, headers={"X-API-Key": key}) as h:

        def freed() -> bool:
            now = datetime.now(UTC).isoformat()
            batch = {"logs": [{"time": now, "service": "api", "level": "info",
                               "message": f"{i} {big}"} for i in range(40)]}  # fmt: skip
            assert h.post("/api/v1/ingest", json=batch).status_code == 200
            # The project's one place: taken while the slow stream is open.
            return _stream_status(lim, key) == 200

        eventually(freed, 60, what="the slow reader's place to be freed")
    # Its connection was dropped: what is left to read ends, by a close or a reset.
    ended = False
    try:
        while slow.recv(65536):
            pass
        ended = True
    except ConnectionResetError:
        ended = True
    finally:
        slow.close()
    assert ended
    out = lim.output()
    assert "connection dropped" in out and "without completing response" not in out


async def test_a_stream_that_never_starts_holds_no_place() -> None:
    svc = SimpleNamespace(streams=StreamSlots(1, 1, 1.0), config=from_env({}))

    async def chunks():
        yield b"data: {}\n\n"

    EventStream(svc, "p", chunks())  # made, never answered: takes nothing
    assert svc.streams.open == {}

    async def gone(_msg: dict) -> None:
        raise OSError("the client is gone")

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {}

    await EventStream(svc, "p", chunks())({"type": "http"}, receive, gone)
    assert svc.streams.open == {}


async def test_a_projects_retention_deletes_its_buckets_past_it_and_no_other_projects(
    mongo_uri: str, mongo_client: MongoClient, db_name: str, tmp_path: Path
) -> None:
    db = mongo_client[db_name]
    short, long_, default = "ret-short", "ret-long", "ret-default"
    keys = {p: _keys.create_key(db, p) for p in (short, long_, default)}
    # Records of ten days ago, in buckets written then (as a serve running since would have).
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    then = datetime.now(UTC) - timedelta(days=10)
    try:
        store = LogStore(client[db_name])
        await store.create_indexes()
        docs = [{"_id": rid, "project_id": p, "time": then + timedelta(seconds=i),
                 "service": "api", "level": "info", "message": f"{p} {i}"}
                for p in keys for i, rid in enumerate(new_record_ids(30))]  # fmt: skip
        assert await store.write(docs, list(range(len(docs)))) == []
    finally:
        await client.close()
    db["log_buckets"].update_many({"b": {"$exists": True}}, {"$set": {"w": then}})

    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "bucketq", "keys", *args], capture_output=True, text=True,
            env=serve.env, cwd=ROOT, timeout=60, check=True).stdout  # fmt: skip

    serve = Serve(mongo_uri, db_name, tmp_path / "serve.log")
    cli("retention", "--project", short, "--days", "5")
    cli("retention", "--project", long_, "--days", "30")
    listed = {line.split()[1]: line.split()[2] for line in cli("list").splitlines()[1:]}
    assert listed == {short: "5d", long_: "30d", default: "90d"}

    def total(s: Serve, project: str) -> int:
        with s.client(keys[project]) as h:
            r = h.get("/api/v1/logs", params={"limit": 1})
            assert r.status_code == 200, r.text
            return int(r.json()["total"])

    with serve.start().stops_cleanly():
        # The serve's sweep at its start: the 5-day project's buckets go, whole.
        eventually(lambda: db["log_buckets"].count_documents({"p": short, "b": {"$exists": True}}) == 0,
                   30, what="the short retention's buckets deleted")  # fmt: skip
        assert total(serve, short) == 0
        assert total(serve, long_) == 30 and total(serve, default) == 30


def test_sigterm_ends_open_streams_and_the_server_stops_cleanly(
    mongo_uri: str, mongo_client: MongoClient, server_db: str, tmp_path: Path
) -> None:
    """A reader that never leaves does not hold up a graceful stop: its stream ends (the
    response completes, LogTide's client reconnects) and serve exits 0, no task cancelled
    at the graceful-shutdown deadline."""
    serve = Serve(mongo_uri, server_db, tmp_path / "serve.log").start()
    key = _keys.create_key(mongo_client[server_db], f"lim-{uuid.uuid4().hex[:8]}")
    with serve.stops_cleanly():
        with httpx.Client(
            verify=TLS, base_url=serve.url, timeout=60, headers={"X-API-Key": key}
        ) as h:
            with h.stream("GET", "/api/v1/logs/stream") as r:
                lines = r.iter_lines()
                assert next(lines).startswith('data: {"type":"connected"')
                assert serve.proc is not None
                serve.proc.terminate()
                rest = list(lines)  # to the response's end: the server ended it
    assert all(not x or x.startswith((":", "data: ")) for x in rest), rest
    out = serve.output()
    assert "graceful shutdown exceeded" not in out and "Traceback" not in out, out[-3000:]
