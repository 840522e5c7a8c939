"""docs/worker.md's first example walked as a new user would: ``bucketq store`` in one
terminal, the page's ``export`` line, its module (``emails.py``, named by its first line)
run with ``python emails.py`` (what it prints must be the lines the page shows), then its
``bucketq worker`` line on the same queue. A temporary HOME, no MongoDB URI but the store's.

What the walk changes, and why: ``bucketq store`` gets ``--port 0`` (the suite runs in
parallel; 27017 may be taken); the ``pip install`` line is left out (the test extra has
installed it); Ctrl-C is a SIGINT, and the command line's worker is stopped by SIGTERM
once it handled the item the walk pushed for it. Everything else is the page's text."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from pymongo import MongoClient

from bucketq import Queue
from bucketq.admin import Inspector
from waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "worker.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def page_blocks() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    intro = text[: text.index("\n## ")]
    return FENCE.findall(intro)


def command(block: str, starts: str) -> str:
    """The one line of ``block`` that starts with ``starts``, less its comment."""
    (line,) = [ln for ln in block.splitlines() if ln.startswith(starts)]
    return line.split("   #")[0].split("  #")[0].strip()


def test_the_worker_page_example_runs_as_written(tmp_path: Path) -> None:
    (store_sh, export_sh, module_py, shown, cli_sh) = (body for _, body in page_blocks())
    module = module_py.splitlines()[0].removeprefix("# ")  # the file the page names
    assert module == "emails.py" and f"`python {module}`" in PAGE.read_text()
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUCKETQ_", "XDG_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))  # fmt: skip

    store_line = command(store_sh, "bucketq store")
    assert store_line == "bucketq store"
    store = subprocess.Popen(["bash", "-c", f"exec {store_line} --port 0"], env=env,
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert store.stdout is not None
        printed = store.stdout.readline().strip()  # the store's URI: written before printed
        export = command(export_sh, "export BUCKETQ_MONGODB_URI=")
        got = subprocess.run(["bash", "-c", f'{export}; printf %s "$BUCKETQ_MONGODB_URI"'],
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
        assert got.stdout == printed
        env["BUCKETQ_MONGODB_URI"] = got.stdout

        (tmp_path / module).write_text(module_py)
        log = tmp_path / "python.log"
        with open(log, "w") as out:
            py = subprocess.Popen([sys.executable, module], env=env, cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        with MongoClient(printed) as client:
            inspector = Inspector(client["app"])
            # handled and its commit written: the stop then finds nothing in hand
            eventually(lambda: [(r.name, r.ready, r.leased) for r in inspector.queues()]
                       == [("emails", 0, 0)] and "sending to" in log.read_text(), 60,
                       what="the item handled and committed")  # fmt: skip
        py.send_signal(signal.SIGINT)  # Ctrl-C
        assert py.wait(60) == 0, log.read_text()
        assert log.read_text().splitlines() == shown.splitlines()

        # the command line's worker on the same queue: one more item for it
        with MongoClient(printed) as client, Queue(client["app"], "emails") as q:
            q.push({"to": "b@example.com", "subject": "again"}).wait()
        cli = command(cli_sh, "bucketq worker")
        assert "--database app" in cli
        cli_log = tmp_path / "cli.log"
        with open(cli_log, "w") as out:
            worker = subprocess.Popen(["bash", "-c", f"exec {cli}"], env=env, cwd=tmp_path,
                                      stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        eventually(lambda: "sending to b@example.com" in cli_log.read_text(), 60,
                   what="the command line's worker to handle the item")  # fmt: skip
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, cli_log.read_text()
        said = cli_log.read_text()
        assert "queue emails: worker started on database app: send_email, 8 sync handlers" in said
        assert "queue emails: worker stopped (SIGTERM): committed 1" in said
    finally:
        if store.poll() is None:
            store.send_signal(signal.SIGTERM)
        store.wait(60)
        if store.stdout is not None:
            store.stdout.close()
    assert not list((home / ".local" / "share" / "bucketq").iterdir())  # its URI file went
