"""Real Celery workers on bucketq against the test's MongoDB.

``celery_env`` gives a test its broker URL (``bucketq+`` and the MongoDB URI with the
test's database), Celery's MongoDB result backend on the same database, and a directory
for the tasks' run records. ``start_worker(...)`` runs ``celery -A celery_app worker`` in a
process group of its own (prefork pool), with the ``.pth`` line bucketq's wheel installs
(``site.addsitedir`` of a directory laid out as site-packages is): the app imports nothing
of bucketq.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from waiting import eventually

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

pytest.importorskip(
    "celery", reason="the celery extra is not installed: pip install 'bucketq[celery]'"
)


#: Queue options of the transport tests' connections: short periods, a 2 s lease.
FAST = {"lease": 2.0, "state_flush_period": 0.1, "poll_interval": 0.2, "bucket_max_wait": 0.05}


def with_database(uri: str, db_name: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path="/" + db_name))


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory laid out as the wheel lays site-packages out for the alias: the files
    pyproject.toml force-includes, under the names it gives them."""
    d = tmp_path_factory.mktemp("site")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = conf["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for src, dst in included.items():
        shutil.copy(ROOT / src, d / dst)
    return d


@dataclass
class CeleryEnv:
    broker: str
    backend: str
    out: Path
    site: Path
    procs: list[Worker] = field(default_factory=list)
    apps: list = field(default_factory=list)

    def app(self, **options):
        from celery_broker.celery_app import make_app

        app = make_app(self.broker, self.backend, str(self.out), options)
        self.apps.append(app)
        return app

    def start_worker(self, name: str, *args: str, **options) -> Worker:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "BQ_TEST_BROKER": self.broker,
            "BQ_TEST_BACKEND": self.backend,
            "BQ_TEST_OUT": str(self.out),
            "BQ_TEST_TRANSPORT_OPTIONS": json.dumps(options),
        }
        launch = (
            f"import site, sys; site.addsitedir({str(self.site)!r}); sys.argv[0] = 'celery'; "
            "from celery.__main__ import main; main()"
        )
        log = self.out / f"worker-{name}.log"
        cmd = [sys.executable, "-c", launch, "-A", "celery_app", "worker", "-n", f"{name}@%h",
               "--pool=prefork", "--loglevel=INFO", "--without-heartbeat", *args]  # fmt: skip
        with open(log, "wb") as f:
            proc = subprocess.Popen(cmd, env=env, cwd=self.out, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        w = Worker(proc, log)
        self.procs.append(w)
        return w


@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> Worker:
        eventually(lambda: " ready." in self.text() or self.proc.poll() is not None,
                   what="the worker to say it is ready")  # fmt: skip
        assert self.proc.poll() is None, self.text()[-3000:]
        return self

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes (a machine or container lost)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture
def celery_env(mongo_uri: str, db, tmp_path: Path, site_dir: Path) -> Iterator[CeleryEnv]:
    env = CeleryEnv(
        broker="bucketq+" + with_database(mongo_uri, db.name),
        backend=with_database(mongo_uri, db.name),
        out=tmp_path,
        site=site_dir,
    )
    try:
        yield env
    finally:
        for w in env.procs:
            w.stop()
        for app in env.apps:
            app.close()
        # Celery's app.close() only drops its pool, kombu's, shared by apps of one broker:
        # close them all, so their queues write what they buffered and release what they hold.
        from kombu import pools

        pools.reset()
