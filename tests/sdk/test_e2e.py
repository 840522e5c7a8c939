"""The SDK against real ``bucketq serve`` processes on loopback (a primary and a second
one as the fallback), MongoDB from the tests/conftest.py fixtures. Faults are real: ports
nothing listens on, servers stopped with SIGSTOP, a server started late on the SDK's port."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import processes
import pytest
from pymongo import MongoClient

from bucketq.embedded import EmbeddedServer
from bucketq.sdk import Client, IngestHandler, replay
from fast_settings import FAST_SDK

from .helpers import ROOT, Serve, dead_port, eventually, spilled


@pytest.fixture(scope="module")
def databases(mongo_client: MongoClient) -> Iterator[list[str]]:
    names = [f"bqsdk_{uuid.uuid4().hex[:8]}_{i}" for i in range(3)]
    yield names
    for n in names:
        mongo_client.drop_database(n)


@pytest.fixture(scope="module")
def primary(mongo_uri: str, databases: list[str], tmp_path_factory) -> Iterator[Serve]:
    s = Serve(mongo_uri, databases[0], tmp_path_factory.mktemp("primary") / "serve.log").start()
    yield s
    s.kill()


@pytest.fixture(scope="module")
def fallback(mongo_uri: str, databases: list[str], tmp_path_factory) -> Iterator[Serve]:
    s = Serve(mongo_uri, databases[1], tmp_path_factory.mktemp("fallback") / "serve.log").start()
    yield s
    s.kill()


@pytest.fixture(scope="module")
def pkey(primary: Serve) -> str:
    return primary.create_key("sdk-tests")  # through `bucketq keys create`, as a user would


@pytest.fixture(scope="module")
def fkey(fallback: Serve) -> str:
    return fallback.create_key("sdk-tests")


@pytest.fixture
def svc() -> str:
    """A service name of this test's own, to read back only its records."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def frozen(primary: Serve) -> Iterator[Serve]:
    """The primary, stopped with SIGSTOP (accepts connections, answers nothing) until the
    test is over or calls ``frozen.stop_signal(SIGCONT)``."""
    primary.stop_signal(signal.SIGSTOP)
    try:
        yield primary
    finally:
        primary.stop_signal(signal.SIGCONT)


def messages(server: Serve, key: str, svc: str) -> Counter:
    return Counter(r["message"] for r in server.logs(key, service=svc))


@contextmanager
def slow_storage(database: str, tmp_path: Path) -> Iterator[tuple[Serve, str, EmbeddedServer]]:
    """A ``bucketq serve`` on a MongoDB of its own that the test may freeze:
    its storage times out after 300 ms and it answers 503 with Retry-After 1 s. Yields
    the server, a key it knows and its MongoDB."""
    mongo = EmbeddedServer(standalone=True).start()
    serve = Serve(mongo.uri, database, tmp_path / "serve.log",
                  BUCKETQ_INGEST_TIMEOUT_MS="300", BUCKETQ_RETRY_AFTER_S="1")  # fmt: skip
    try:
        serve.start()
        yield serve, serve.create_key(database), mongo
    finally:
        serve.kill()
        mongo.stop()


def test_records_arrive_with_their_fields_from_a_library_logger(primary, pkey, svc, tmp_path):
    h = IngestHandler(primary.url, pkey, spill_dir=tmp_path, service=svc, **FAST_SDK)
    root = logging.getLogger()
    old = root.level
    root.addHandler(h)  # attached once, at the top: libraries' loggers propagate to it
    root.setLevel(logging.INFO)
    try:
        lib = logging.getLogger("x")  # what a library does: logging.getLogger(__name__)
        lib.info("charged %s", "EUR 12", extra={"order": "A-1", "amount": 12.5,
                                                "tags": ["a", "b"]})  # fmt: skip
        lib.warning("slow", extra={"trace_id": "0af7651916cd43dd8448eb211c80319c",
                                   "span_id": "b7ad6b7169203331"})  # fmt: skip
        try:
            {}["missing"]
        except KeyError:
            logging.getLogger("x.db").exception("lookup failed")
        lib.debug("below the root's level: not sent")
        assert h.processor.flush(30)
    finally:
        root.removeHandler(h)
        root.setLevel(old)
    c = Client(primary.url, pkey, spill_dir=tmp_path, service=svc, **FAST_SDK)
    assert c.log("critical", "disk full", mount="/var", free=0)
    assert c.flush(30)
    got = {r["message"]: r for r in primary.logs(pkey, service=svc)}
    assert sorted(got) == ["charged EUR 12", "disk full", "lookup failed", "slow"]
    r = got["charged EUR 12"]
    assert r["level"] == "info" and r["service"] == svc
    assert r["metadata"] == {"logger": "x", "order": "A-1", "amount": 12.5, "tags": ["a", "b"]}
    assert got["slow"]["level"] == "warn"
    assert (got["slow"]["trace_id"], got["slow"]["span_id"]) == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")  # fmt: skip
    exc = got["lookup failed"]["metadata"]["exception"]
    assert got["lookup failed"]["level"] == "error" and exc["type"] == "KeyError"
    assert "missing" in exc["traceback"] and got["lookup failed"]["metadata"]["logger"] == "x.db"
    assert got["disk full"]["level"] == "critical"
    assert got["disk full"]["metadata"] == {"mount": "/var", "free": 0}
    st = h.stats()
    assert (st["sent"], st["spilled"], st["lost_total"]) == (4, 0, 0)


def test_primary_down_the_fallback_gets_them(fallback, fkey, pkey, svc, tmp_path):
    c = Client(f"http://127.0.0.1:{dead_port()}", pkey, fallback_url=fallback.url,
               fallback_api_key=fkey, spill_dir=tmp_path, service=svc, **FAST_SDK)  # fmt: skip
    for i in range(40):
        c.log("info", f"fb-{i}", i=i)
    assert c.flush(30)
    st = c.stats()
    assert (st["to_fallback"], st["sent"], st["spilled"], st["primary_up"]) == (40, 0, 0, False)
    assert messages(fallback, fkey, svc) == Counter(f"fb-{i}" for i in range(40))


def test_both_down_spill_then_replay_delivers_every_record_exactly(primary, pkey, svc, tmp_path):
    c = Client(f"http://127.0.0.1:{dead_port()}", pkey, spill_dir=tmp_path, service=svc,
               fallback_url=f"http://127.0.0.1:{dead_port()}", **FAST_SDK)  # fmt: skip
    sent = []
    for i in range(250):
        fields = {"i": i, "user": f"u{i % 7}", "nested": {"deep": [i, str(i)]}}
        c.log(["info", "warn", "error"][i % 3], f"both-{i}", **fields)
        sent.append((f"both-{i}", ["info", "warn", "error"][i % 3], fields))
    assert c.flush(30)
    st = c.stats()
    assert (st["spilled"], st["sent"], st["to_fallback"], st["lost_total"]) == (250, 0, 0, 0)
    c.close(0)
    cmd = [sys.executable, "-m", "bucketq", "sdk", "replay", str(tmp_path), "--url",
           primary.url, "--api-key", pkey]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=primary.env)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sent 250 record(s)" in out.stdout
    got = primary.logs(pkey, service=svc)
    assert sorted((r["message"], r["level"], json.dumps(r["metadata"], sort_keys=True))
                  for r in got) == sorted(
        (m, lvl, json.dumps(f, sort_keys=True)) for m, lvl, f in sent)  # fmt: skip
    assert spilled(tmp_path) == []
    again = replay(tmp_path, primary.url, pkey)  # the same in Python: nothing is left to send
    assert (again.sent, again.kept, again.refused) == (0, 0, 0)
    assert len(primary.logs(pkey, service=svc)) == 250


def test_primary_back_replays_its_own_spill(mongo_uri, databases, svc, tmp_path):
    late = Serve(mongo_uri, databases[2], tmp_path / "late.log")
    key = late.create_key("late")
    port = dead_port()
    c = Client(f"http://127.0.0.1:{port}", key, spill_dir=tmp_path / "spill", service=svc,
               **FAST_SDK)  # fmt: skip
    try:
        for i in range(120):
            c.log("info", f"late-{i}", i=i)
        assert c.flush(30)
        assert c.stats()["spilled"] == 120
        late.start(port)  # the primary comes up on the SDK's port
        eventually(lambda: c.stats()["replayed"] == 120, 60, what="120 replayed")
        c.log("info", "after")
        assert c.flush(30)
        got = messages(late, key, svc)
        assert got == Counter([f"late-{i}" for i in range(120)] + ["after"])
        assert spilled(tmp_path / "spill") == []
        st = c.stats()
        assert (st["primary_up"], st["sent"], st["lost_total"]) == (True, 1, 0)
    finally:
        c.close(0)
        late.kill()


def test_a_refused_batch_goes_to_the_spill_with_the_servers_reason(primary, pkey, svc, tmp_path):
    bad_key = Client(primary.url, "bq_" + "0" * 64, spill_dir=tmp_path, service=svc, **FAST_SDK)
    bad_key.log("info", "who am I")
    assert bad_key.flush(30)
    bad_field = Client(primary.url, pkey, spill_dir=tmp_path, service=svc, **FAST_SDK)
    bad_field.log("info", "bad trace", trace_id="t" * 129)  # text ids up to 128 characters
    assert bad_field.flush(30)
    reasons = {r["log"]["message"]: r for r in spilled(tmp_path)}
    assert reasons["who am I"]["reason"].startswith("HTTP 401")
    assert "Unknown API key" in reasons["who am I"]["reason"]
    assert reasons["bad trace"]["reason"].startswith(("HTTP 400", "HTTP 422"))
    assert "logs[0].trace_id" in reasons["bad trace"]["reason"]
    assert all(r["retry"] is False for r in reasons.values())
    for c in (bad_key, bad_field):
        st = c.stats()
        assert (st["refused"], st["spilled"], st["sent"], st["primary_up"]) == (1, 1, 0, True)
    assert primary.logs(pkey, service=svc) == []


def test_queue_full_spills_add_returns_false_and_the_caller_never_waits(frozen, pkey, svc,
                                                                         tmp_path):  # fmt: skip
    c = Client(frozen.url, pkey, spill_dir=tmp_path, service=svc, queue_size=20, batch_size=10,
               timeout=120, **FAST_SDK)  # fmt: skip
    results = [c.log("info", f"full-{i}") for i in range(500)]  # the server answers nothing
    st = c.stats()
    assert results.count(False) == st["queue_full"] > 0
    assert st["queued"] + st["queue_full"] == 500 and st["sent"] == 0
    assert st["spilled"] >= st["queue_full"]
    frozen.stop_signal(signal.SIGCONT)
    # The requests in flight are answered; the spill goes out once the queue has room.
    eventually(lambda: c.stats()["sent"] + c.stats()["replayed"] == 500, 60, what="500 sent")
    assert messages(frozen, pkey, svc) == Counter(f"full-{i}" for i in range(500))
    assert c.stats()["lost_total"] == 0


def test_drain_worker_sends_to_the_fallback_from_90_percent(frozen, fallback, pkey, fkey, svc,
                                                            tmp_path):  # fmt: skip
    c = Client(frozen.url, pkey, fallback_url=fallback.url, fallback_api_key=fkey,
               spill_dir=tmp_path, service=svc, queue_size=100, batch_size=5, timeout=120,
               **FAST_SDK)  # fmt: skip
    for i in range(120):
        c.log("info", f"dr-{i}")
    eventually(lambda: c.stats()["drains"] >= 1 and c.stats()["fill_percentage"] <= 10, 60,
               what="a drain down to 10%")  # fmt: skip
    # 90%+ of 100 drained to 10% (the drain's batch may still be in flight: wait for it)
    eventually(lambda: c.stats()["to_fallback"] >= 80, 60, what="80+ answered by the fallback")
    frozen.stop_signal(signal.SIGCONT)
    eventually(lambda: c.stats()["pending"] == 0, 60, what="nothing pending")
    eventually(lambda: c.stats()["sent"] + c.stats()["to_fallback"] + c.stats()["replayed"]
               == 120, 60, what="all 120 delivered")  # fmt: skip
    on_primary, on_fallback = messages(frozen, pkey, svc), messages(fallback, fkey, svc)
    assert sum(on_fallback.values()) == c.stats()["to_fallback"]
    assert on_primary + on_fallback == Counter(f"dr-{i}" for i in range(120))


def test_a_drain_waits_for_a_fallback_that_asked_to_wait(frozen, pkey, svc, tmp_path):
    """The fallback's storage is slow: it answers the drain's batch 503 with Retry-After.
    The next drain waits for the fallback; it does not send to the primary, which is the
    one not answering (a drain sent there hung for the whole timeout, and the fallback got
    nothing: the flake of the test above under load)."""
    with slow_storage("bqsdk_dw", tmp_path) as (fb, fkey, storage):
        warm = Client(fb.url, fkey, spill_dir=tmp_path / "warm", service=svc, **FAST_SDK)
        assert warm.log("info", "before") and warm.flush(30)  # the server knows the key now
        c = Client(frozen.url, pkey, fallback_url=fb.url, fallback_api_key=fkey,
                   spill_dir=tmp_path / "spill", service=svc, queue_size=100, batch_size=5,
                   timeout=120, **FAST_SDK)  # fmt: skip
        with processes.frozen(storage.pid):
            for i in range(120):
                c.log("info", f"dw-{i}")
            eventually(lambda: (c.stats()["last_error"] or "").startswith("fallback: HTTP 503"),
                       60, what="the fallback asking to wait")  # fmt: skip
        eventually(lambda: c.stats()["to_fallback"] >= 80, 60, what="80+ answered by the fallback")
        frozen.stop_signal(signal.SIGCONT)
        eventually(lambda: c.stats()["pending"] == 0, 60, what="nothing pending")
        eventually(lambda: c.stats()["sent"] + c.stats()["to_fallback"] + c.stats()["replayed"]
                   == 120, 60, what="all 120 delivered (the queue's overflow replayed)")  # fmt: skip
        # A 503 after the storage timeout is "not acknowledged", not "not stored": a
        # record may be on the fallback twice (see the 503 test), never missing.
        got = set(messages(frozen, pkey, svc)) | set(messages(fb, fkey, svc))
        assert got == {"before"} | {f"dw-{i}" for i in range(120)}


def test_two_configurations_are_isolated(frozen, fallback, fkey, pkey, svc, tmp_path):
    stuck = Client(frozen.url, pkey, spill_dir=tmp_path, service=svc, queue_size=50,
                   timeout=120, **FAST_SDK)  # fmt: skip
    fine = Client(fallback.url, fkey, spill_dir=tmp_path, service=svc, **FAST_SDK)
    assert stuck.processor is not fine.processor
    for i in range(300):
        stuck.log("info", f"stuck-{i}")
        fine.log("info", f"fine-{i}")
    assert fine.flush(60)
    a, b = stuck.stats(), fine.stats()
    assert (b["sent"], b["queue_full"], b["spilled"], b["retried"]) == (300, 0, 0, 0)
    assert a["sent"] == 0 and a["queue_full"] > 0 and a["pending"] > 0
    assert a["spill_dir"] != b["spill_dir"]
    assert messages(fallback, fkey, svc) == Counter(f"fine-{i}" for i in range(300))
    assert stuck.close(0) is False  # what it holds goes to its own spill, nothing is lost
    assert stuck.stats()["spilled"] + stuck.stats()["sent"] >= 300 - stuck.stats()["pending"]
    assert stuck.stats()["lost_total"] == 0


class _Proxy:
    """A reverse proxy on loopback in front of ``upstream``. While ``broken`` it answers
    every request 200 with what a misconfigured endpoint sends, in turn: its HTML page, a
    JSON cut short, a JSON of its own, the right shape with the wrong count; then it
    forwards each request and its answer."""

    WRONG = (b"<!doctype html><title>Maintenance</title><p>Back soon.</p>",
             b'{"received": 10', b'{"status": "ok"}', b'{"received": 1, "timestamp": "t"}')  # fmt: skip

    def __init__(self, upstream: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        self.broken = True
        self.answered = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _answer(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                import urllib.error
                import urllib.request

                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else None
                if proxy.broken:
                    wrong = proxy.WRONG[proxy.answered % len(proxy.WRONG)]
                    proxy.answered += 1
                    html = wrong.startswith(b"<")
                    self._answer(200, wrong, "text/html" if html else "application/json")
                    return
                keep = ("Content-Type", "X-API-Key", "Idempotency-Key")
                req = urllib.request.Request(upstream + self.path, data=body, method=method,
                                             headers={k: self.headers[k] for k in keep
                                                      if self.headers[k]})  # fmt: skip
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        status, got, ctype = r.status, r.read(), r.headers["Content-Type"]
                except urllib.error.HTTPError as e:
                    status, got, ctype = e.code, e.read(), e.headers["Content-Type"]
                self._answer(status, got, ctype or "application/json")

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_2xx_that_is_not_the_services_answer_is_spilled_then_replayed(primary, pkey, svc,
                                                                        tmp_path):  # fmt: skip
    """A proxy in front of the service answers 200 with its maintenance page (and other
    bodies that are not the service's answer): no record counts as sent; every one is in
    the spill with the reason, and arrives once the proxy forwards again."""
    proxy = _Proxy(primary.url)
    c = Client(proxy.url, pkey, spill_dir=tmp_path, service=svc, batch_size=50, **FAST_SDK)
    try:
        for i in range(200):
            c.log("info", f"proxied-{i}")
        assert c.flush(30)
        st = c.stats()
        assert (st["sent"], st["spilled"], st["lost_total"]) == (0, 200, 0)
        assert st["invalid"] == 200
        lines = spilled(tmp_path)
        assert len(lines) == 200 and all(x["retry"] for x in lines)
        reasons = {x["reason"] for x in lines}
        assert all("is the URL right?" in r and proxy.url in r for r in reasons), reasons
        assert any("not JSON (it starts: '<!doctype html>" in r for r in reasons), reasons
        assert primary.logs(pkey, service=svc) == []
        proxy.broken = False
        eventually(lambda: c.stats()["replayed"] == 200, 60, what="200 replayed")
        assert messages(primary, pkey, svc) == Counter(f"proxied-{i}" for i in range(200))
        assert spilled(tmp_path) == [] and c.stats()["sent"] == 0
    finally:
        c.close(0)
        proxy.close()


def test_503_with_retry_after_is_retried_not_spilled(svc, tmp_path):
    """Storage frozen with SIGSTOP: the server answers 503 with Retry-After; the SDK waits
    that long and sends the batch again, spills nothing, and every record arrives."""
    with slow_storage("bqsdk_ra", tmp_path) as (serve, key, storage):
        c = Client(serve.url, key, spill_dir=tmp_path / "spill", service=svc, timeout=120,
                   **FAST_SDK)  # fmt: skip
        c.log("info", "before")
        assert c.flush(30) and c.stats()["sent"] == 1  # the server knows the key now
        with processes.frozen(storage.pid):
            for i in range(20):
                c.log("info", f"ra-{i}")
            eventually(lambda: c.stats()["retried"] >= 20, 90, what="20 records retried")
            st = c.stats()
            assert (st["spilled"], st["primary_up"], st["sent"]) == (0, True, 1)
            assert st["last_error"].startswith("primary: HTTP 503")
        eventually(lambda: c.stats()["sent"] == 21, 60, what="21 sent")
        # Every record arrives. A 503 after the storage timeout means "not acknowledged", not
        # "not stored": the frozen insert can still land, so a record may be there twice
        # (the SDK re-sends the same body with the same Idempotency-Key; whether the
        # server's storage uses it is the server's part).
        got = messages(serve, key, svc)
        assert set(got) == {"before"} | {f"ra-{i}" for i in range(20)}
        assert c.stats()["spilled"] == 0


EXIT_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from bucketq.sdk import IngestHandler
    url, key, svc, spill = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO, handlers=[
        IngestHandler(url, key, service=svc, spill_dir=spill, batch_wait=30)])
    for i in range(200):
        logging.getLogger("job").info("last-%d", i)
    # no close, no flush: the exit hook sends what is queued
    """
)


def test_exit_flush_delivers_the_last_records(primary, pkey, svc, tmp_path):
    subprocess.run([sys.executable, "-c", EXIT_SCRIPT, primary.url, pkey, svc, str(tmp_path)],
                   check=True, timeout=120, cwd=ROOT, env=primary.env)  # fmt: skip
    assert messages(primary, pkey, svc) == Counter(f"last-{i}" for i in range(200))
    assert spilled(tmp_path) == []


SPILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from bucketq.sdk import Client
    url, key, svc, spill, n, shutdown_timeout = sys.argv[1:7]
    c = Client(url, key, service=svc, spill_dir=spill, shutdown_timeout=float(shutdown_timeout))
    for i in range(int(n)):
        c.log("info", f"{svc}-{i}")
    # no close: the exit hook spills or sends, and replays what an earlier program left
    """
)


def test_a_spill_left_by_an_exited_program_is_sent_by_the_next_short_lived_one(
    mongo_uri, databases, svc, tmp_path
):
    late = Serve(mongo_uri, databases[2], tmp_path / "late.log")
    key = late.create_key("late")
    url = f"http://127.0.0.1:{dead_port()}"
    spill = tmp_path / "spill"

    def run(service: str, n: int, shutdown_timeout: float) -> str:
        out = subprocess.run([sys.executable, "-c", SPILL_SCRIPT, url, key, service, str(spill),
                              str(n), str(shutdown_timeout)], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=late.env)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stderr

    try:
        # A program exits while nothing listens (its exit waits out a short
        # shutdown_timeout): its records stay on disk, and it says where and how to send them.
        said = run(svc, 30, 0.3)
        assert len(spilled(spill)) == 30
        assert "records stay in the spill" in said and "bucketq sdk replay" in said
        late.start(int(url.rsplit(":", 1)[1]))
        # Another program (another service name) sending to the same server with the same
        # key, alive for less than a monitor tick, sends them on its way out. Its exit
        # returns once nothing is pending: the long bound is for a busy machine, where a
        # short one spills its own record (sent, but not confirmed in time).
        run(svc + "-b", 1, 60)
        assert messages(late, key, svc) == Counter(f"{svc}-{i}" for i in range(30))
        assert messages(late, key, svc + "-b") == Counter([f"{svc}-b-0"])
        assert spilled(spill) == []
    finally:
        late.kill()
