"""docs/celery.md's example walked as a new user without a MongoDB would: ``bucketq
store`` in one terminal, the page's ``export`` line, its ``tasks.py``, ``celery -A tasks
worker``, the task sent with the page's ``python -c`` line, and ``bucketq queues list
--database celery`` with no URI (it finds the running store). A temporary HOME.

What the walk changes, and why: ``bucketq store`` gets ``--port 0`` (the suite runs in
parallel); ``celery`` is started as the other tests here start it, with the ``.pth`` line
bucketq's wheel installs (``conftest.py``), and with ``--loglevel=INFO``, so that the walk
sees it say it is ready before sending; the worker is stopped with SIGTERM. Everything
else is the page's text."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def command(block: str, starts: str) -> str:
    """The one line of ``block`` that starts with ``starts``, less its comment."""
    (line,) = [ln for ln in block.splitlines() if ln.startswith(starts)]
    return line.split("   #")[0].split("  #")[0].strip()


def test_the_celery_page_example_runs_on_bucketq_store(tmp_path: Path, site_dir: Path) -> None:
    text = (ROOT / "docs" / "celery.md").read_text()
    intro = text[: text.index("\n## ")]
    tasks_py, run_sh, store_sh, export_sh = (body for _, body in FENCE.findall(intro))
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUCKETQ_", "XDG_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))  # fmt: skip
    (tmp_path / "tasks.py").write_text(tasks_py)

    store_line = command(store_sh, "bucketq store")
    assert store_line == "bucketq store"
    store = subprocess.Popen(["bash", "-c", f"exec {store_line} --port 0"], env=env,
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, text=True)  # fmt: skip
    worker = None
    try:
        assert store.stdout is not None
        printed = store.stdout.readline().strip()
        export = command(export_sh, "export BUCKETQ_MONGODB_URI=")
        got = subprocess.run(["bash", "-c", f'{export}; printf %s "$BUCKETQ_MONGODB_URI"'],
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
        assert got.stdout == printed
        exported = {**env, "BUCKETQ_MONGODB_URI": got.stdout}

        assert command(run_sh, "celery") == "celery -A tasks worker"
        launch = (
            f"import site, sys; site.addsitedir({str(site_dir)!r}); sys.argv[0] = 'celery'; "
            "from celery.__main__ import main; main()"
        )
        log = tmp_path / "worker.log"
        with open(log, "w") as out:
            worker = subprocess.Popen([sys.executable, "-c", launch, "-A", "tasks", "worker",
                                       "--loglevel=INFO"],
                                      env=exported, cwd=tmp_path, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        eventually(lambda: " ready." in log.read_text() or worker.poll() is not None, 120,
                   what="the worker to say it is ready")  # fmt: skip
        assert worker.poll() is None, log.read_text()[-3000:]

        send = command(run_sh, "python -c")
        sent = subprocess.run(["bash", "-c", send], env=exported, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert (sent.returncode, sent.stdout) == (0, "5\n"), sent.stderr

        # no export here: the command finds the running store by itself
        listed = subprocess.run(["bucketq", "queues", "list", "--database", "celery", "--json"],
                                env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [r["name"] for r in json.loads(listed.stdout)] == ["celery"]
    finally:
        if worker is not None and worker.poll() is None:
            # To its main process only, as `kill -TERM` of its pid: a SIGTERM to the whole
            # group also kills the pool's processes, one may die holding the pool's queue
            # lock, and billiard's shutdown then waits on it for ever.
            worker.terminate()
            try:
                worker.wait(60)
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
        if store.poll() is None:
            store.send_signal(signal.SIGTERM)
        store.wait(60)
        if store.stdout is not None:
            store.stdout.close()
