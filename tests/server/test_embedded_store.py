"""``bucketq serve`` on its embedded store (no MongoDB URI): the store is locked down
(credentials it generates, private files: another local user reads nothing, a client
without the password is refused) and dies with its owner (after a SIGKILL of
``bucketq serve`` the store goes too, the next start on the directory works, and a start
on a directory a live ``bucketq serve`` holds says so at once)."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import alive
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from bucketq.embedded import (
    CREDENTIALS_FILE,
    LOCK_FILE,
    LOG_FILE,
    URI_FILE,
    EmbeddedServer,
    find_server_command,
)
from bucketq.errors import EmbeddedServerError
from waiting import eventually

from .helpers import ROOT

_LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")
NOBODY = 65534


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory other local users may enter (pytest's own tmp_path is 0700, which
    would hide the files whatever their modes): what protects them must be bucketq's."""
    base = Path(tempfile.mkdtemp(prefix="bucketq-embedded-"))
    base.chmod(0o755)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": str(home / "share")}
    env.pop("BUCKETQ_MONGODB_URI", None)
    return env


def _serve(home: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bucketq", "serve", "--port", "0", "--data", str(home / "data")],
            env=_env(home), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )  # fmt: skip


def _listening(proc: subprocess.Popen[bytes], log: Path) -> str:
    def url() -> str | None:
        text = log.read_text(errors="replace")
        if proc.poll() is not None:
            raise AssertionError(f"bucketq serve exited ({proc.returncode}):\n{text}")
        m = _LISTENING.search(text)
        return m.group(1) if m else None

    return eventually(url, 90, what="bucketq serve to listen")


def _bucketq(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bucketq", *args], env=_env(home),
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _readable_by_nobody(path: Path) -> bool:
    """Whether another local user (``nobody``) can read ``path``: run as that user."""
    out = subprocess.run(["cat", str(path)], user=NOBODY, capture_output=True, timeout=30)
    return out.returncode == 0


def test_serve_locks_down_its_embedded_store(home: Path) -> None:
    log = home / "serve.log"
    proc = _serve(home, log)
    try:
        _listening(proc, log)
        created = _bucketq(home, "keys", "create", "--project", "shop")
        assert created.returncode == 0, created.stderr  # no password typed: the URI file has it
        listed = _bucketq(home, "keys", "list")
        assert "shop" in listed.stdout, listed.stderr

        data, state = home / "data", home / "share" / "bucketq"
        uri_file = state / URI_FILE
        private = [uri_file, data / CREDENTIALS_FILE, data / LOG_FILE, data / LOCK_FILE]
        private += [p for p in data.iterdir() if p.name.startswith("WiredTiger")]
        for directory in (data, state):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        for path in private:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        assert (data / LOG_FILE).read_text()  # the server's log lives in the data directory

        uri = uri_file.read_text().strip()
        password = json.loads((data / CREDENTIALS_FILE).read_text())["password"]
        assert password in uri
        with MongoClient(uri) as client:
            assert client["bucketq"]["api_keys"].count_documents({"project": "shop"}) == 1
        # The attack: mint a key by inserting into api_keys without credentials.
        port = re.search(r"@[0-9.]+:(\d+)/", uri).group(1)  # type: ignore[union-attr]
        with MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true") as anonymous:
            with pytest.raises(OperationFailure) as refused:
                anonymous["bucketq"]["api_keys"].insert_one({"project": "eve", "hash": "x"})
            assert refused.value.code == 13  # Unauthorized
            with pytest.raises(OperationFailure):
                anonymous["bucketq"]["logs"].find_one()

        if os.geteuid() == 0:  # root can be another user: try as one
            control = home / "control"
            control.write_text("readable")
            control.chmod(0o644)
            assert _readable_by_nobody(control)  # the check can tell
            assert not any(_readable_by_nobody(p) for p in private)
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()
    assert not (home / "share" / "bucketq" / URI_FILE).exists()


def test_embedded_store_dies_with_serve_and_its_directory_is_guarded(home: Path) -> None:
    log = home / "serve.log"
    first = _serve(home, log)
    second = third = None
    try:
        _listening(first, log)
        assert _bucketq(home, "keys", "create", "--project", "kept").returncode == 0
        info = json.loads((home / "data" / LOCK_FILE).read_text())
        assert info["owner"] == first.pid and alive(info["server"])

        first.kill()
        first.wait()
        eventually(lambda: not alive(info["server"]), 60, what="the embedded server to exit")

        log2 = home / "serve2.log"
        second = _serve(home, log2)
        _listening(second, log2)
        assert f"bucketq process {first.pid} ended without stopping" in log2.read_text()
        listed = _bucketq(home, "keys", "list")
        assert "kept" in listed.stdout, listed.stderr  # same data, same credentials

        # A start on the directory the live second one holds: refused at once, named.
        log3 = home / "serve3.log"
        third = _serve(home, log3)
        code = third.wait(30)
        text = log3.read_text()
        assert code != 0 and "in use" in text and str(second.pid) in text, text
        assert second.poll() is None  # and the holder is untouched
    finally:
        for proc in (first, second, third):
            if proc is not None:
                _stop(proc)


@pytest.mark.parametrize("owner", range(3))
def test_a_server_tied_to_an_owner_of_many_threads_goes_when_the_owner_is_killed(
    tmp_path: Path, owner: int
) -> None:
    """The kernel signals the server again each time it passes to another thread of its
    dying owner: it goes all the same (a handler entered again while it ran left it
    running), and a write it acknowledged on disk (``j: true``, bucketq's default) is
    there at the next start."""
    data = tmp_path / "data"
    script = (
        "import sys, threading, time\n"
        "from bucketq.embedded import EmbeddedServer\n"
        "from pymongo import MongoClient\n"
        "s = EmbeddedServer(sys.argv[1]).start()\n"
        "MongoClient(s.uri, journal=True).bq.t.insert_one({'kept': 1})\n"
        "for _ in range(100):\n"
        "    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner_proc = subprocess.Popen([sys.executable, "-c", script, str(data)],
                                  stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        server_pid = int(owner_proc.stdout.readline())
    finally:
        owner_proc.kill()
        owner_proc.wait()
    eventually(lambda: not alive(server_pid), 60, what="the server to go with its owner")
    server = EmbeddedServer(data).start()
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=10_000) as client:
            assert client.bq.t.find_one({}, {"_id": 0}) == {"kept": 1}
    finally:
        server.stop()


def test_a_server_left_by_a_dead_owner_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    """Off the main thread (or off Linux) the server is not tied to its owner: when the
    owner dies, the next start on the directory stops what it left and starts."""
    data = tmp_path / "data"
    script = (
        "import sys, threading, os\n"
        "from bucketq.embedded import EmbeddedServer\n"
        "s = EmbeddedServer(sys.argv[1])\n"
        "t = threading.Thread(target=s.start); t.start(); t.join()\n"
        "print(s.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    orphan = int(out.stdout.split()[0])
    assert alive(orphan), out.stderr  # left running, its owner gone

    server = EmbeddedServer(data).start()  # failed at once before: the store was locked
    try:
        assert not alive(orphan)
        with MongoClient(server.uri, serverSelectionTimeoutMS=10_000) as client:
            assert client.admin.command("ping")["ok"] == 1
    finally:
        server.stop()


def test_a_missing_embedded_server_names_both_install_forms(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedServerError) as err:
        find_server_command()
    assert "pip install 'bucketq[embedded]'" in str(err.value)
    assert "pip install -e '.[embedded]'" in str(err.value)  # the form for a checkout


def test_lost_credentials_get_a_new_password_and_keep_the_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = EmbeddedServer(data, auth=True).start()
    try:
        with MongoClient(server.uri) as client:
            client["shop"]["logs"].insert_one({"message": "kept"})
    finally:
        server.stop()
    old_uri, port = server.uri, server.port
    (data / CREDENTIALS_FILE).unlink()

    server = EmbeddedServer(data, port=port, auth=True).start()  # the old URI's address
    try:
        assert server.uri != old_uri
        with MongoClient(server.uri) as client:
            assert client["shop"]["logs"].find_one({}, {"_id": 0}) == {"message": "kept"}
        with MongoClient(old_uri, serverSelectionTimeoutMS=10_000) as stale:
            with pytest.raises(OperationFailure):  # the old password is gone
                stale["shop"]["logs"].find_one()
    finally:
        server.stop()


def test_the_server_gets_its_settings_unless_the_environment_sets_them(
    monkeypatch, tmp_path: Path
) -> None:
    """The server keeps freed memory mapped (glibc's trim threshold) and starts one OpenBLAS
    thread (it multiplies no matrix), each unless the caller's environment says otherwise."""

    def started_with(name: str) -> dict[str, str]:
        """The environment of a server started on ``tmp_path / name`` (stopped again)."""
        server = EmbeddedServer(tmp_path / name).start()
        try:
            raw = Path(f"/proc/{server.pid}/environ").read_bytes().decode()
        finally:
            server.stop()
        return dict(x.split("=", 1) for x in raw.split("\0") if "=" in x)

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    env = started_with("a")
    assert env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "4096"

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    env = started_with("b")
    assert env["OPENBLAS_NUM_THREADS"] == "2"
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 20  # far above glibc's 128 KiB
