"""``bucketq bench celery``: a real Celery worker on bucketq beside Celery's other brokers.

For each broker (bucketq; bucketq with buffered publish; kombu's MongoDB transport on the
same MongoDB; Redis; RabbitMQ), one after the other in one run, with the same app
(``task_acks_late`` and ``task_reject_on_worker_lost``, no result backend) and one
``celery worker`` process (prefork, ``--concurrency``, default 2) on a queue of its own:

- throughput: the worker running, one process sends ``--n`` tasks with ``delay()`` one
  after the other; publish/s is the sending alone, end-to-end/s is from the first send
  to the last task done (each task appends a line to a file of its pool process);
- a killed worker: ``--kill-n`` tasks of 50 ms wait in the broker, a worker starts, and
  after a fifth of them it is killed with its pool (SIGKILL to its process group); a
  second worker starts; counted after ``--window`` seconds: tasks done, lost (never
  done), run twice. bucketq's lease and Redis's visibility timeout are 5 s in this part
  (their defaults: 30 s and 1 hour: what a dead worker held comes back that much later),
  and kombu looks for Redis's expired messages every second (by default every 100 s);
- a killed server, where this bench can kill it (the embedded MongoDB it starts, for
  bucketq and kombu's MongoDB transport): ``--kill-n`` tasks sent (every send returned),
  the server SIGKILLed and started again on its data, then a worker: tasks lost. Redis and
  RabbitMQ are services other people use here: never killed; their rows say what their
  documentation says they lose, labelled as such.

MongoDB is ``--mongodb-uri`` / ``$BUCKETQ_MONGODB_URI`` (then no server is killed), else
an embedded server this bench starts. Redis is ``$REDIS_URL`` (default 127.0.0.1:6379/0),
RabbitMQ ``$RABBITMQ_URL`` (default guest at 127.0.0.1:5672); a broker that cannot be
reached is reported as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ... import _validate as v
from ._brokers import BROKERS, KILL_REDELIVERY, Broker, Where, with_database

DEFAULT_N = 1000
DEFAULT_KILL_N = 100
DEFAULT_WINDOW = 30.0
DEFAULT_CONCURRENCY = 2
#: Each task of the kill runs takes this long: the worker is killed mid-work.
KILL_TASK_SECONDS = 0.05
READY_TIMEOUT = 120.0


class _Worker:
    """One ``celery worker`` process group, its log in ``out``."""

    def __init__(self, broker: Broker, where: Where, queue: str, out: Path, name: str,
                 concurrency: int, options: dict[str, Any]) -> None:  # fmt: skip
        env = {**os.environ, "BQBENCH_BROKER": broker.url(where), "BQBENCH_QUEUE": queue,
               "BQBENCH_OUT": str(out), "BQBENCH_OPTIONS": json.dumps(options)}  # fmt: skip
        self.log = out / f"worker-{name}.log"
        cmd = [sys.executable, "-m", "celery", "-A", "bucketq.benchmark.celery._app", "worker",
               "-Q", queue, "-c", str(concurrency), "--pool=prefork", "-n", f"{name}@%h",
               "--loglevel=INFO", "--without-heartbeat", "--without-mingle", "--without-gossip"]  # fmt: skip
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while " ready." not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the {broker.name} worker did not start:\n{tail}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the worker and its pool. Each part has a queue of its own, removed at the
        end of the run, so a worker ends that way when its part is counted (a warm shutdown
        of an idle worker took seconds)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def _done(out: Path) -> list[tuple[int, float]]:
    found = []
    for p in out.glob("done-*.txt"):
        for line in p.read_text().splitlines():
            i, t = line.split()
            found.append((int(i), float(t)))
    return found


def _wait_done(out: Path, n: int, deadline: float) -> list[tuple[int, float]]:
    """The done records once ``n`` distinct tasks are done, or at ``deadline``."""
    while True:
        done = _done(out)
        if len({i for i, _ in done}) >= n or time.monotonic() > deadline:
            return done
        time.sleep(0.05)


def _counts(done: list[tuple[int, float]], n: int) -> dict[str, int]:
    runs = Counter(i for i, _ in done)
    return {"tasks": n, "done": len(runs), "lost": n - len(runs),
            "run_twice_or_more": sum(1 for c in runs.values() if c > 1)}  # fmt: skip


def _close(app: Any) -> None:
    """Close the app's connections: Celery's ``app.close()`` only drops its pool, which is
    kombu's, shared by every app with the same broker (closing it alone would close the
    next app's). A bucketq connection writes what it buffered and releases what it holds."""
    from kombu import pools

    app.close()
    pools.reset()


def _send(app: Any, n: int, sleep: float = 0.0) -> float:
    """Send ``n`` tasks one after the other; the seconds it took."""
    work = app.tasks["bench.work"]
    t0 = time.perf_counter()
    for i in range(n):
        work.delay(i, sleep)
    return time.perf_counter() - t0


class _Run:
    """One broker's three parts, each on a queue of its own."""

    def __init__(
        self, broker: Broker, where: Where, base: Path, concurrency: int, index: int
    ) -> None:
        self.broker, self.where, self.base, self.concurrency = broker, where, base, concurrency
        self.index = index  # the broker's place in the run: its queues' names
        self.queues: list[str] = []

    def part(self, name: str, *, kill: bool = False) -> tuple[str, Path, dict[str, Any], Any]:
        from ._app import make_app

        queue = f"bench{os.getpid()}_{self.index}_{len(self.queues)}"
        self.queues.append(queue)
        out = self.base / f"{queue}-{name}"
        out.mkdir()
        opts = self.broker.transport_options(self.where, kill=kill)
        return queue, out, opts, make_app(self.broker.url(self.where), queue, str(out), opts)

    def worker(self, queue: str, out: Path, name: str, opts: dict[str, Any]) -> _Worker:
        return _Worker(self.broker, self.where, queue, out, name, self.concurrency, opts)

    def throughput(self, n: int) -> dict[str, Any]:
        queue, out, opts, app = self.part("throughput")
        w = self.worker(queue, out, "t", opts)
        try:
            first = time.time()
            publish_s = _send(app, n)
            done = _wait_done(out, n, time.monotonic() + max(600.0, n / 5))
        finally:
            w.kill()
            _close(app)
        counts = _counts(done, n)
        if counts["lost"]:
            raise RuntimeError(f"{self.broker.name}: {counts['lost']} of {n} tasks never ran")
        e2e = max(t for _, t in done) - first
        return {"n": n, "publish_s": publish_s, "publish_per_s": n / publish_s,
                "end_to_end_s": e2e, "end_to_end_per_s": n / e2e}  # fmt: skip

    def worker_killed(self, n: int, window: float) -> dict[str, Any]:
        queue, out, opts, app = self.part("worker-kill", kill=True)
        _send(app, n, KILL_TASK_SECONDS)
        a = self.worker(queue, out, "a", opts)
        _wait_done(out, max(1, n // 5), time.monotonic() + 120)
        a.kill()
        killed = time.time()
        b = self.worker(queue, out, "b", opts)
        try:
            done = _wait_done(out, n, time.monotonic() + window)
        finally:
            b.kill()
            _close(app)
        res: dict[str, Any] = _counts(done, n)
        if not res["lost"]:
            res["all_done_s_after_kill"] = max(t for _, t in done) - killed
        res["options"] = opts
        return res

    def server_killed(self, n: int, window: float, server: Any) -> dict[str, Any]:
        queue, out, opts, app = self.part("server-kill")
        _send(app, n)
        _close(app)  # every send returned, and nothing is left buffered in this process
        server.restart(hard=True)  # SIGKILL, then the same port and data
        w = self.worker(queue, out, "s", opts)
        try:
            done = _wait_done(out, n, time.monotonic() + window)
        finally:
            w.kill()
        return _counts(done, n)

    def clean(self) -> None:
        for q in self.queues:
            try:
                self.broker.clean(self.where, q)
            except Exception as exc:  # noqa: BLE001 - clean-up is best effort
                print(f"could not clean {self.broker.name} queue {q}: {exc}", file=sys.stderr)


def run(mongodb_uri: str | None, *, n: int = DEFAULT_N, kill_n: int = DEFAULT_KILL_N,
        window: float = DEFAULT_WINDOW, concurrency: int = DEFAULT_CONCURRENCY,
        brokers: list[str] | None = None, json_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    from ..._deps import require_all
    from ...embedded import URI_ENV, EmbeddedServer

    require_all(["celery", "kombu"], "bench")
    names = list(brokers or BROKERS)
    uri = mongodb_uri or os.environ.get(URI_ENV) or None
    server = None if uri else EmbeddedServer().start()
    db = f"bqbench_celery_{os.getpid()}"
    where = Where(mongodb=with_database(uri or server.uri, db))  # type: ignore[union-attr]
    results: dict[str, Any] = {"brokers": {}, "env": {
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg(), "n": n, "kill_n": kill_n,
        "window_s": window, "concurrency": concurrency, "kill_redelivery_s": KILL_REDELIVERY,
        "celery": _version("celery"), "kombu": _version("kombu"),
        "mongodb": "embedded SecantusDB" if server else "given URI"}}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="bucketq-bench-celery-") as tmp:
            for index, name in enumerate(names):
                broker = BROKERS[name]
                why = broker.unreachable(where)
                if why:
                    print(f"{name}: not run ({why})", file=sys.stderr)
                    results["brokers"][name] = {"not_run": why}
                    continue
                r = _Run(broker, where, Path(tmp), concurrency, index)
                row: dict[str, Any] = {}
                try:
                    print(f"{name}: {n:,} tasks through one worker ...", file=sys.stderr)
                    row["throughput"] = r.throughput(n)
                    print(f"{name}: worker killed with {kill_n} tasks ...", file=sys.stderr)
                    row["worker_killed"] = r.worker_killed(kill_n, window)
                    if broker.documented_server_loss:
                        said = broker.documented_server_loss
                        seen = broker.persistence(where)
                        row["server_killed"] = {
                            "not_measured": "a system service other people use here",
                            "documented": f"{said} ({seen})" if seen else said,
                        }
                    elif server is None:
                        row["server_killed"] = {"not_measured": "the MongoDB is a given URI, "
                                                "not a server this bench may kill"}  # fmt: skip
                    else:
                        print(f"{name}: server killed with {kill_n} tasks ...", file=sys.stderr)
                        row["server_killed"] = r.server_killed(kill_n, window, server)
                finally:
                    r.clean()
                results["brokers"][name] = row
    finally:
        if server is not None:
            server.stop()
        elif uri:
            try:
                from pymongo import MongoClient

                MongoClient(uri).drop_database(db)
            except Exception as exc:  # noqa: BLE001 - clean-up is best effort
                print(f"could not drop {db}: {exc}", file=sys.stderr)
    report(results)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def method(results: dict[str, Any]) -> str:
    """What the run did, in a sentence or three (the results page's preamble)."""
    env = results["env"]
    return (
        f"Celery {env['celery']} (kombu {env['kombu']}): one worker (prefork, "
        f"`-c {env['concurrency']}`, `acks_late`) per broker, the brokers one after the other "
        f"on one machine; MongoDB: {env['mongodb']}. Throughput: with the worker running, one "
        f"process sends {env['n']:,} tasks with `delay()` one after the other; end to end is "
        f"from the first send to the last task done. Killed: {env['kill_n']} tasks of "
        f"{KILL_TASK_SECONDS * 1000:.0f} ms; a worker SIGKILLed with its pool after a fifth of "
        f"them, then a second worker, counted {env['window_s']:.0f} s after it started; or "
        "every task sent, the server SIGKILLed and started again on its data, then a worker. "
        f"bucketq's lease and Redis's visibility timeout are {env['kill_redelivery_s']:.0f} s "
        "in the kill runs (defaults 30 s and one hour), and kombu looks for Redis's expired "
        "messages every second (every 100 s by default)."
    )


def tables(results: dict[str, Any]) -> list[str]:
    """The throughput table, the loss table and the documented losses beside them."""
    base = results["brokers"].get("bucketq", {}).get("throughput")
    out = ["| broker | tasks | publish/s | end-to-end tasks/s | end-to-end vs bucketq |",
           "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, row in results["brokers"].items():
        t = row.get("throughput")
        if t is None:
            out.append(f"| {name} | not run: {row.get('not_run', '')} | | | |")
            continue
        ratio = f"{t['end_to_end_per_s'] / base['end_to_end_per_s']:.2f}x" if base else ""
        out.append(f"| {name} | {t['n']:,} | {t['publish_per_s']:,.0f} | "
                   f"{t['end_to_end_per_s']:,.0f} | {ratio} |")  # fmt: skip
    out += ["", "| broker | worker SIGKILLed: lost | run twice | all done | "
            "server SIGKILLed: lost |", "|---|---:|---:|---:|---|"]  # fmt: skip
    notes = []
    for name, row in results["brokers"].items():
        k, s = row.get("worker_killed"), row.get("server_killed", {})
        if k is None:
            continue
        after = (f"{k['all_done_s_after_kill']:.1f} s after the kill"
                 if "all_done_s_after_kill" in k else "never")  # fmt: skip
        if "not_measured" in s:
            server = f"not measured: {s['not_measured']}"
            if "documented" in s:
                notes.append(f"{name}, documented (not measured here): {s['documented']}")
                server += f" (note {len(notes)})"
        else:
            server = f"{s['lost']} of {s['tasks']}"
        out.append(f"| {name} | {k['lost']} of {k['tasks']} | {k['run_twice_or_more']} | "
                   f"{after} | {server} |")  # fmt: skip
    for i, note in enumerate(notes, 1):
        out += ["", f"{i}. {note}"]
    return out


def report(results: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in results["env"]["load_average"])
    print(f"\n{method(results)} Load average at the start: {load}.\n")
    print("\n".join(tables(results)))


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..cli import add_bench_parser, add_run_arguments

    p = add_bench_parser(sub, "celery", "a real Celery worker on bucketq beside kombu's MongoDB "
                         "transport, Redis and RabbitMQ: tasks/s, and what a killed worker or "
                         "server loses", __doc__)  # fmt: skip
    p.add_argument("--n", type=v.cli_count(1), default=DEFAULT_N,
                   help=f"tasks for the throughput (default {DEFAULT_N:,})")  # fmt: skip
    p.add_argument("--kill-n", type=v.cli_count(5), default=DEFAULT_KILL_N,
                   help=f"tasks of each kill (default {DEFAULT_KILL_N})")  # fmt: skip
    p.add_argument("--window", type=v.cli_number(1.0), default=DEFAULT_WINDOW,
                   help=f"seconds a kill's next worker is given (default {DEFAULT_WINDOW:.0f})")  # fmt: skip
    p.add_argument("--concurrency", type=v.cli_count(1), default=DEFAULT_CONCURRENCY,
                   help=f"the worker's pool processes (default {DEFAULT_CONCURRENCY})")  # fmt: skip
    add_run_arguments(p, "bucketq bench celery", run, only=("broker", tuple(BROKERS)))
    return p
