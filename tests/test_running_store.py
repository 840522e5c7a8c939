"""Commands without a MongoDB URI find a running ``bucketq store`` by the one rule they
find ``bucketq serve``'s embedded store by: while it runs, its URI (with its generated
password) is in the running store's URI file; when it stops the file goes, unless a
store started since wrote its own, or the store it replaced still runs. Real processes,
each test with a home of its own."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pymongo import MongoClient

from bucketq import Queue
from bucketq.embedded import URI_FILE

ROOT = Path(__file__).resolve().parents[1]

TASKS = """\
def send_email(msg):
    print("sending", msg.payload, flush=True)
"""


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home),
           "XDG_DATA_HOME": str(home / "share")}  # fmt: skip
    for k in ("BUCKETQ_MONGODB_URI", "BUCKETQ_DATABASE"):
        env.pop(k, None)
    return env


def _bucketq(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bucketq", *args], env=_env(home), cwd=home,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@contextmanager
def _store(home: Path, log: str) -> Iterator[subprocess.Popen[str]]:
    """``bucketq store`` on a free port; stopped (SIGTERM) at the end if still running."""
    with open(home / log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bucketq", "store", "--port", "0"],
                                env=_env(home), cwd=home, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        yield proc
    finally:
        _stop(proc)


def _uri(proc: subprocess.Popen[str]) -> str:
    """The URI the store prints on its first line (EOF if it died: then the test fails)."""
    assert proc.stdout is not None
    uri = proc.stdout.readline().strip()
    assert uri.startswith("mongodb://bucketq:"), uri  # with the generated password
    return uri


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return code


def test_commands_find_a_running_store_and_say_so_once_it_stopped(tmp_path: Path) -> None:
    uri_file = tmp_path / "share" / "bucketq" / URI_FILE
    (tmp_path / "tasks.py").write_text(TASKS)
    with _store(tmp_path, "store.log") as store:
        # typed at once, while the store may still be starting: the command waits for it
        listed = _bucketq(tmp_path, "queues", "list", "--database", "app", "--json")
        assert listed.returncode == 0, listed.stderr
        uri = _uri(store)
        assert uri_file.read_text().strip() == uri
        assert stat.S_IMODE(uri_file.stat().st_mode) == 0o600

        with MongoClient(uri) as client, Queue(client["app"], "emails") as q:
            q.push({"to": "a@example.com"}).wait()
        listed = _bucketq(tmp_path, "queues", "list", "--database", "app", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [(r["name"], r["ready"]) for r in json.loads(listed.stdout)] == [("emails", 1)]

        ran = _bucketq(tmp_path, "worker", "tasks:send_email", "--queue", "emails",
                       "--database", "app", "--max-items", "1")  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "sending {'to': 'a@example.com'}\n"
        assert "queue emails: worker started on database app: send_email" in ran.stderr
        assert "worker stopped (max_items (1) handled): committed 1" in ran.stderr

        assert _stop(store) == 0, (tmp_path / "store.log").read_text()
    assert not uri_file.exists()
    gone = _bucketq(tmp_path, "queues", "list", "--database", "app")
    assert gone.returncode == 1
    assert gone.stderr.strip() == (
        "bucketq queues: error: No MongoDB to read: give --mongodb-uri, set "
        "BUCKETQ_MONGODB_URI, or start the embedded store first (`bucketq store`, or "
        "`bucketq serve`)."
    )


def test_the_store_started_last_is_found_and_the_one_before_comes_back(tmp_path: Path) -> None:
    uri_file = tmp_path / "share" / "bucketq" / URI_FILE

    def found() -> str:
        return uri_file.read_text().strip()

    with ExitStack() as stack:
        first = stack.enter_context(_store(tmp_path, "first.log"))
        first_uri = _uri(first)
        second = stack.enter_context(_store(tmp_path, "second.log"))
        second_uri = _uri(second)
        assert found() == second_uri != first_uri  # the one started last

        assert _stop(second) == 0
        assert found() == first_uri  # the first still runs: commands find it again
        listed = _bucketq(tmp_path, "queues", "list", "--json")
        assert listed.returncode == 0, listed.stderr

        third = stack.enter_context(_store(tmp_path, "third.log"))
        third_uri = _uri(third)
        assert _stop(first) == 0
        assert found() == third_uri  # not the first's to remove

        assert _stop(third) == 0  # the store it replaced (the first) is gone: nothing back
    assert not uri_file.exists()
