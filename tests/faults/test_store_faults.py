"""The store itself dies or its disk fails, for real, and nothing acknowledged is lost.

- SIGKILL of the embedded server under a queue producer (default write concern), three
  times, the server restarted by its supervisor: every item whose receipt said stored is
  in the queue afterwards.
- SIGKILL of the store under an ingest load against a real ``bucketq serve``: serve
  notices (one line), reaps it, restarts it by itself, answers 503 + Retry-After
  meanwhile, and every record of every request it answered 200 is there afterwards.
- A full data directory (a small tmpfs filled to the brim) and an unwritable one (every
  file immutable, ``chattr +i``: what root cannot write either): 503s, the store's output
  still drained while its log cannot be written, and recovery once the disk takes writes
  again. Where the machine cannot mount or ``chattr`` (not root, no such file system)
  those tests skip with the reason; with ``CI=true`` they fail.
- A store that cannot be restarted: ``bucketq serve`` exits non-zero.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import state
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern
from server.helpers import ROOT, TLS, Serve, create_key

from bucketq.embedded import LOCK_FILE, EmbeddedServer
from bucketq.supervisor import StoreSupervisor
from fast_settings import FAST_FAULTS
from waiting import eventually

from .conftest import ids, read_lines, run_worker, stored_items

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: How often a test kills the store.
KILLS = 3


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this fault must be made for real)")
    pytest.skip(reason)


def reaped(pid: int) -> bool:
    """``pid`` is gone and not a zombie: its parent waited for it."""
    return state(f"/proc/{pid}/stat") is None


# -- a queue producer --------------------------------------------------------------------


def test_no_acknowledged_push_is_lost_when_the_store_is_killed(tmp_path: Path) -> None:
    """The producer uses the default write concern: no option says j."""
    server = EmbeddedServer(tmp_path / "data").start()
    store = StoreSupervisor(server, backoff_s=0.05).start()
    acked_f = tmp_path / "acked.txt"
    n = 4000
    try:
        opts = {**FAST_FAULTS, "bucket_max_size": 25}
        assert "write_concern" not in opts
        prod = run_worker("push", server.uri, "bq", "q", acked_f, "--count", str(n),
                          "--batch", "25", "--pause", "0.01", options=opts)  # fmt: skip
        for k in range(KILLS):
            eventually(lambda k=k: len(read_lines(acked_f)) >= (k + 1) * n // (KILLS + 2),
                       timeout=120, what="the producer to push on")  # fmt: skip
            assert prod.poll() is None, "the producer ended before the kill"
            pid = server.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            eventually(lambda pid=pid: store.state.up and server.pid != pid and reaped(pid),
                       timeout=120, what="the store to be restarted")  # fmt: skip
        assert prod.wait(300) == 0, "the producer failed"
        acked = ids(acked_f)
        with MongoClient(server.uri) as client:
            stored = stored_items(client["bq"]["q"])
        lost = sorted(set(acked) - set(stored))
        print(f"\nstore killed {KILLS}x under a producer: acked={len(acked)} stored={len(stored)} "
              f"lost={len(lost)}")  # fmt: skip
        assert len(acked) == n
        assert not lost, f"{len(lost)} items whose receipts said stored are gone: {lost[:10]}"
        assert max(stored.values()) == 1, "an item was stored twice"
    finally:
        store.close(keep_data=False)


# -- bucketq serve -----------------------------------------------------------------------


class Load:
    """``clients`` threads posting batches of ``records`` log records until stopped; every
    record's message names its request (``r<request>-<index>``), and every answer is kept."""

    def __init__(self, url: str, key: str, *, clients: int = 3, records: int = 50) -> None:
        self.url, self.key, self.records = url, key, records
        self.answers: dict[int, int | str] = {}
        #: Answers that break the contract (a 503 without Retry-After).
        self.problems: list[str] = []
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def ok(self) -> int:
        return sum(1 for code in list(self.answers.values()) if code == 200)

    def accepted(self) -> set[str]:
        """The message of every record of every request answered 200."""
        return {
            f"r{req}-{i}"
            for req, code in list(self.answers.items())
            if code == 200
            for i in range(self.records)
        }

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.url, headers={"X-API-Key": self.key}, timeout=60, verify=TLS
        ) as c:
            while not self._stop.is_set():
                req = next(self._ids)
                logs = [{"time": "2024-05-01T10:00:00Z", "service": "load", "level": "info",
                         "message": f"r{req}-{i}"} for i in range(self.records)]  # fmt: skip
                try:
                    r = c.post("/api/v1/ingest", json={"logs": logs})
                except httpx.HTTPError as exc:
                    self.answers[req] = type(exc).__name__
                    continue
                self.answers[req] = r.status_code
                if r.status_code == 503:
                    if not r.headers.get("retry-after"):
                        self.problems.append(f"a 503 without Retry-After: {r.text}")
                    self._stop.wait(0.2)
                elif r.status_code != 200:
                    self.problems.append(f"{r.status_code}: {r.text}")


def stored_messages(serve: Serve, key: str) -> Counter[str]:
    """Every log message of the key's project, read back through the API, page by page."""
    seen: Counter[str] = Counter()
    cursor = None
    with serve.client(key) as c:
        while True:
            params: dict[str, Any] = {"limit": 1000, "service": "load"}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/api/v1/logs", params=params)
            assert page.status_code == 200, page.text
            body = page.json()
            seen.update(r["message"] for r in body["logs"])
            cursor = body.get("next_cursor")
            if not cursor:
                return seen


def store_pid(data: Path) -> int | None:
    """The store's pid its lock file names (None while the file is rewritten)."""
    try:
        return int(json.loads((data / LOCK_FILE).read_text())["server"])
    except (OSError, ValueError, KeyError):
        return None


def ready(serve: Serve) -> dict[str, Any] | None:
    """``/ready``'s body once it says ready."""
    with serve.client() as c:
        r = c.get("/ready")
    return r.json() if r.status_code == 200 else None


@contextlib.contextmanager
def embedded_serve(tmp_path: Path, data: Path, *args: str, **env: str) -> Iterator[Serve]:
    """``bucketq serve`` on its embedded store in ``data``, restarting it quickly."""
    env = {"XDG_DATA_HOME": str(tmp_path / "share"), "BUCKETQ_STORE_RESTART_BACKOFF_MS": "100",
           "BUCKETQ_INGEST_TIMEOUT_MS": "3000", **env}  # fmt: skip
    serve = Serve("", "", tmp_path / "serve.log", "--data", str(data), *args, **env)
    serve.start(timeout=120)
    try:
        yield serve
    finally:
        serve.terminate()


def test_serve_restarts_a_killed_store_by_itself_and_loses_no_record_it_answered_200(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with embedded_serve(tmp_path, data) as serve:
        key = create_key(serve, "shop")
        with Load(serve.url, key) as load:
            for k in range(2):
                eventually(lambda k=k: load.ok() >= 10 * (k + 1), timeout=120,
                           what="requests answered 200")  # fmt: skip
                pid = running_store(data)
                os.kill(pid, signal.SIGKILL)
                eventually(lambda pid=pid: reaped(pid), timeout=30, what="the store reaped")
                body = eventually(lambda: ready(serve), timeout=120, what="serve ready again")
                assert body["detail"]["store"].startswith("up (pid "), body
                assert running_store(data) != pid
            after = load.ok()
            eventually(lambda: load.ok() >= after + 10, timeout=120, what="200s after the kills")
        accepted = load.accepted()
        stored = stored_messages(serve, key)
        missing = sorted(accepted - set(stored))
        refused = sum(1 for code in load.answers.values() if code == 503)
        print(f"\nstore killed 2x under ingest: {load.ok()} requests answered 200, {refused} "
              f"answered 503; records acknowledged={len(accepted)} stored={len(stored)} "
              f"missing={len(missing)}")  # fmt: skip
        assert not missing, f"{len(missing)} records of requests answered 200 are gone"
        assert max(stored.values()) == 1, "a record was stored twice"
        assert not load.problems, load.problems[:5]
        out = serve.output()
        assert out.count("is down: died by SIGKILL") == 2, out[-3000:]
        assert out.count("the embedded server is back") == 2, out[-3000:]
        # One line per state change, never one per request, no driver topology dumps.
        assert "Topology Description" not in out
        noisy = [ln for ln in out.splitlines() if " WARNING " in ln or " ERROR " in ln]
        print("\n".join(noisy))
        assert len(noisy) <= 12, "\n".join(noisy)
        with serve.stops_cleanly():
            pass


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_answers_503_while_its_store_restarts_and_exits_1_when_it_cannot(
    tmp_path: Path, workers: int
) -> None:
    """The store's port taken by someone else: every restart fails. Meanwhile requests get
    503 + Retry-After at once and /ready names the state (with --workers, every worker
    reads it from the parent); then serve gives up, exit 1."""
    data = tmp_path / "data"
    env = {"BUCKETQ_STORE_RESTARTS": "3", "BUCKETQ_STORE_RESTART_BACKOFF_MS": "1000"}
    with embedded_serve(tmp_path, data, "--workers", str(workers), **env) as serve:
        key = create_key(serve, "shop")
        pid, port = running_store(data), store_port(data)
        squatter = socket.socket()
        try:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            os.kill(pid, signal.SIGKILL)
            eventually(lambda: reaped(pid), timeout=30, what="the store reaped")
            eventually(lambda: _bind(squatter, port), timeout=30, what="the port to be free")
            squatter.listen(1)
            down = eventually(lambda: _not_ready(serve), timeout=60, what="/ready to say why")
            assert down["detail"]["store"].startswith("restarting (attempt "), down
            assert (
                "died by SIGKILL" in down["detail"]["store"]
                or "restart failed" in (down["detail"]["store"])
            ), down
            with serve.client(key) as c:
                r = c.post("/api/v1/ingest", json={"logs": [{"time": "2024-05-01T10:00:00Z",
                           "service": "s", "level": "info", "message": "m"}]})  # fmt: skip
            assert r.status_code == 503 and r.headers["retry-after"], r.text
            assert "The embedded store is" in r.json()["message"], r.text
            assert serve.proc is not None
            code = serve.proc.wait(180)
        finally:
            squatter.close()
        out = serve.output()
        assert code == 1, out[-3000:]
        assert "could not be restarted in 3 attempts" in out, out[-3000:]
        assert out.count("is down: died by SIGKILL") == 1
        assert not alive_store(data), "the store outlived serve"


def store_port(data: Path) -> int:
    return int(json.loads((data / LOCK_FILE).read_text())["port"])


def alive_store(data: Path) -> bool:
    pid = store_pid(data)
    return pid is not None and state(f"/proc/{pid}/stat") not in (None, "Z")


def running_store(data: Path) -> int:
    """The pid of the store serving ``data`` (waits out a lock file being rewritten)."""
    return eventually(lambda: store_pid(data), what="the store's pid in its lock file")


def _bind(sock: Any, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


# -- bucketq store -----------------------------------------------------------------------


def test_bucketq_store_restarts_its_store_and_exits_1_when_it_keeps_dying(tmp_path: Path) -> None:
    """With --restarts 1 the first death is ridden out (same URI), the second within a
    minute of it is one failed restart too many: exit 1, the store not left behind."""
    data = tmp_path / "data"
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bucketq", "store", "--port", "0", "--data", str(data),
             "--restarts", "1", "--restart-backoff", "0.05"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": str(tmp_path / "share")},
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        uri = proc.stdout.readline().strip()
        assert uri.startswith("mongodb://"), uri
        with MongoClient(uri, serverSelectionTimeoutMS=30_000) as client:
            # journaled, as bucketq's writes: a w:1 write without j may die with the store
            client.get_database("t", write_concern=WriteConcern(j=True))["x"].insert_one({"i": 1})
            first = running_store(data)
            os.kill(first, signal.SIGKILL)
            # back once the supervisor says so (its restart checks the new store answers: a
            # kill before that is a failed restart, not a second death)
            eventually(lambda: "the embedded server is back" in errors.read_text(), timeout=60,
                       what="the store restarted")  # fmt: skip
            assert reaped(first)
            assert client["t"]["x"].count_documents({}) == 1  # same port, same data
        # (closed before the store dies for good: a client's close waits for a server)
        second = running_store(data)
        os.kill(second, signal.SIGKILL)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    err = errors.read_text()
    assert code == 1, err
    assert err.count("is down: died by SIGKILL") == 2, err
    assert "could not be restarted in 1 attempts" in err, err
    assert reaped(second)


# -- a disk that does not take writes ----------------------------------------------------


def _chatter(client: MongoClient, n: int) -> None:
    """``n`` commands the embedded server answers with an error and logs with a traceback
    (over 1 KB each): more output than a pipe holds (64 KiB) while nobody reads it."""
    from pymongo.errors import OperationFailure

    for _ in range(n):
        with pytest.raises(OperationFailure):
            client["t"].command({"insert": 123, "documents": [{}]})


@pytest.mark.parametrize("how", ["immutable", "full"])
def test_the_store_outlives_a_log_file_it_cannot_write(tmp_path: Path, how: str, caplog) -> None:
    """Its output is drained (dropped and counted) while the log cannot be written, said
    once; and written again, said once, when it can. The store answers throughout."""
    with contextlib.ExitStack() as stack:
        if how == "full":
            logs = stack.enter_context(small_tmpfs(1))
        else:
            logs = tmp_path / "logs"
            logs.mkdir()
            chattr_works(logs)
        log = logs / "secantusd.log"
        server = EmbeddedServer(tmp_path / "data", log_path=log).start()
        stack.callback(server.stop)
        client: MongoClient = MongoClient(server.uri, socketTimeoutMS=20_000)
        stack.callback(client.close)
        caplog.set_level("WARNING", logger="bucketq.embedded")
        if how == "full":
            ballast = fill(logs)
        else:
            assert immutable(log, True)
            stack.callback(immutable, log, False)
        _chatter(client, 150)  # a blocked pipe would make these time out
        eventually(lambda: server.log_dropped >= 150, what="the lines to be dropped, counted")
        assert client.admin.command("ping")["ok"] == 1
        if how == "full":
            ballast.unlink()
        else:
            immutable(log, False)

        def written_again() -> bool:
            _chatter(client, 1)  # a line to write (tried again a second after a failure)
            return "is written again" in caplog.text

        eventually(written_again, interval=0.2, what="the log to be written again")
        text = log.read_text(errors="replace")
        assert "lines of the server's output are missing here" in text
        assert caplog.text.count("cannot be written") == 1, caplog.text
        assert caplog.text.count("is written again") == 1, caplog.text


# -- a data directory that does not take writes -------------------------------------------


@contextlib.contextmanager
def small_tmpfs(size_mb: int = 48) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB, mounted for the block (root, and mount permitted)."""
    where = Path(tempfile.mkdtemp(prefix="bucketq-fs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs",
                           str(where)], capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        where.rmdir()
        _missing(f"cannot mount a small tmpfs to fill ({done.stderr.strip()}): needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def fill(where: Path) -> Path:
    """Fill the file system of ``where`` to the last byte; returns the ballast to remove."""
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return ballast


def immutable(path: Path, on: bool) -> bool:
    """``chattr -R +i`` (or ``-i``) on ``path``: even root cannot write those files."""
    flag = "+i" if on else "-i"
    return subprocess.run(["chattr", "-R", flag, str(path)], capture_output=True).returncode == 0


def chattr_works(where: Path) -> None:
    probe = where / "probe"
    probe.write_text("x")
    try:
        if not immutable(probe, True):
            _missing(f"chattr +i does not work on {where} (its file system has no immutable flag)")
        try:
            with open(probe, "a") as f:
                f.write("y")
        except OSError:
            return
        _missing(f"chattr +i on {where} does not stop writes here")
    finally:
        immutable(probe, False)
        probe.unlink()


def until_refused(serve: Serve, key: str, load: Load) -> None:
    """Post big batches until one is answered 503 (the store failed to write)."""
    body = {"logs": [{"time": "2024-05-01T10:00:00Z", "service": "big", "level": "info",
                      "message": "x" * 4000} for _ in range(100)]}  # fmt: skip

    def refused() -> bool:
        with serve.client(key) as c:
            r = c.post("/api/v1/ingest", json=body)
        return r.status_code == 503

    eventually(refused, timeout=120, what="a 503 once the disk takes no writes")


def _disk_fault(tmp_path: Path, data: Path, break_disk: Any, mend_disk: Any) -> None:
    with embedded_serve(tmp_path, data, BUCKETQ_STORE_RESTARTS="50") as serve:
        key = create_key(serve, "shop")
        with Load(serve.url, key, clients=2, records=20) as load:
            eventually(lambda: load.ok() >= 5, timeout=120, what="requests answered 200")
            break_disk()
            until_refused(serve, key, load)
            down = eventually(lambda: _not_ready(serve), timeout=60, what="/ready to say why")
            assert "store" in down["detail"], down
            mend_disk()
            eventually(lambda: ready(serve), timeout=180, what="serve ready again")
            after = load.ok()
            eventually(lambda: load.ok() >= after + 5, timeout=120, what="200s after recovery")
        accepted = load.accepted()
        stored = stored_messages(serve, key)
        missing = sorted(accepted - set(stored))
        print(f"\ndisk fault: {load.ok()} requests answered 200; records acknowledged="
              f"{len(accepted)} missing={len(missing)}; /ready said {down['detail']}")  # fmt: skip
        assert not missing, f"{len(missing)} records of requests answered 200 are gone"
        assert not load.problems, load.problems[:5]
        # A log file that failed during the fault is tried again at least a second later.
        # Whether it failed depends on the server's output then (on a full tmpfs a line
        # that fits the file's last page is still written);
        # test_the_store_outlives_a_log_file_it_cannot_write breaks the log itself.
        if "cannot be written" in serve.output():
            try:
                eventually(lambda: "is written again" in serve.output(), timeout=60,
                           what="the store's log file written again")  # fmt: skip
            except AssertionError as exc:
                raise AssertionError(f"{exc}:\n{serve.output()[-4000:]}") from None
        out = serve.output()
        assert "Topology Description" not in out
        with serve.stops_cleanly():
            pass


def _not_ready(serve: Serve) -> dict[str, Any] | None:
    with serve.client() as c:
        r = c.get("/ready")
    return r.json() if r.status_code == 503 else None


def test_a_full_data_directory_gives_503s_and_recovers_when_space_returns(tmp_path: Path) -> None:
    with small_tmpfs() as fs:
        data = fs / "data"
        ballast: list[Path] = []
        _disk_fault(tmp_path, data, lambda: ballast.append(fill(fs)),
                    lambda: ballast[0].unlink())  # fmt: skip


def test_an_unwritable_data_directory_gives_503s_and_recovers(tmp_path: Path) -> None:
    """Every file of the data directory immutable (its log file too): the store cannot
    write its journal and its log lines cannot be written, yet its output is drained."""
    chattr_works(tmp_path)
    data = tmp_path / "data"
    try:
        _disk_fault(tmp_path, data, lambda: immutable(data, True), lambda: immutable(data, False))
    finally:
        immutable(data, False)
