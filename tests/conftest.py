"""Fixtures that give tests real servers.

MongoDB: ``$BUCKETQ_MONGODB_URI`` if set; else a real mongod through testcontainers
when a Docker engine answers; else the embedded SecantusDB server on a free port.
Redis: ``$REDIS_URL``, else 127.0.0.1:6379. Locally an absent optional server
skips with a reason; in CI (``CI=true``) it fails. ``storage``: an embedded server of
the test's own, to freeze (``frozen`` in ``tests/processes.py``), stop or restart.

Waiting: tests wait for conditions, never for time. ``eventually(predicate)`` and
``eventually_async(predicate)`` live in ``tests/waiting.py`` (re-exported here);
import them with ``from waiting import eventually``.

Markers, set here by directory: ``faults`` (tests/faults), ``spark`` (tests/spark),
``bench`` (tests/test_benchmark.py); ``slow`` on every test outside ``FAST_TIER``
(``pytest -m "not slow"`` runs the fast tier); ``soak`` is opt-in (``-m soak``).

Parallel: the suite runs on pytest-xdist workers, three per core (``-n auto`` in
pyproject.toml's addopts, ``WORKERS_PER_CORE``; ``-n0`` runs it in one process). Each worker has its own session fixtures (its own embedded
server, its own ``bucketq serve``), so a test must not depend on state another test
left, and names what it creates uniquely (databases, Redis prefixes, ``tmp_path``).
Tests that share an expensive fixture of module or session scope are kept on one
worker with ``pytest.mark.xdist_group`` (``--dist loadgroup``).
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from pymongo import AsyncMongoClient, MongoClient

import bucketq
from bucketq.embedded import URI_ENV, EmbeddedServer
from waiting import eventually, eventually_async

# PYTHONDONTWRITEBYTECODE=1 (set in this machine's environment) also stops pytest from
# caching the modules it rewrites for its assertion messages (the test modules, and every
# module of a plugin installed with an entry point: hypothesis, schemathesis, ...), so
# every xdist worker rewrote all of them again, a CPU cost in every worker. The test
# processes write again: this one from here on, the xdist workers from their start (their
# plugins load before this file: see pytest_configure), and what a test starts sees the
# variable as it was. __pycache__ is ignored by git.
# What a test starts (servers, workers, CLI commands: hundreds of processes) would then
# compile bucketq's modules anew in each one, on a fresh checkout: pytest_configure
# compiles the package once, before any of them starts.
sys.dont_write_bytecode = False
_NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"
_HELD = "BUCKETQ_TESTS_HELD_NO_BYTECODE"
if _HELD in os.environ:  # an xdist worker started by pytest_configure below
    os.environ[_NO_BYTECODE] = os.environ.pop(_HELD)

# No per-example deadline: a property test checks what a function returns, not how fast
# (speed is the benchmarks' business), and on a loaded machine the default deadline fails
# pure-function properties.
settings.register_profile("bucketq", deadline=None)
settings.load_profile("bucketq")

__all__ = ["eventually", "eventually_async"]

_ROOT = Path(__file__).resolve().parent
#: Marker by the first part of a test's path under tests/.
_MARKERS = {"faults": "faults", "spark": "spark", "test_benchmark.py": "bench"}

#: The fast tier (``pytest -m "not slow"``): files of pure tests and of tests that run in
#: the test process against the shared store, a few seconds a file. Every other test is
#: marked ``slow``: it starts processes (servers, workers, JVMs, browsers) or waits on
#: leases and deadlines. A new file of that first kind belongs here.
FAST_TIER = frozenset(
    f"tests/{f}.py"
    for f in (
        "test_layers", "test_readme_links", "test_results_page", "test_supervisor",
        "test_unasync", "test_bench_worker",
        "admin/test_metrics", "celery_broker/test_transport",
        "queues/test_claim_forms", "queues/test_config_and_wakeups",
        "queues/test_core_properties", "queues/test_deadline", "queues/test_loops",
        "queues/test_partition_core", "queues/test_write_concern",
        "reservoir/test_auto_overflow", "reservoir/test_breaker", "reservoir/test_config",
        "reservoir/test_idempotent", "reservoir/test_in_flight", "reservoir/test_metrics",
        "reservoir/test_shutdown", "reservoir/test_storage",
        "misuse/test_fork", "sdk/test_queue", "sdk/test_spill",
        "server/test_key_cache", "server/test_operator_keys", "server/test_pure",
        "server/test_storage_outage",
        "stream/test_lazy_import", "stream/test_stream_damage",
        "worker/test_core", "worker/test_endpoint",
    )
)  # fmt: skip

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: xdist groups (``--dist loadgroup``): the tests that use one of these module- or
#: session-scoped fixtures, each of which starts processes, run on one worker, so they are
#: started once. Every test under tests/spark is in the group "spark" (one worker starts
#: the JVMs) unless it names another group itself.
_SHARED = {
    "bench": "bench-run",  # tests/test_benchmark.py: the one shared benchmark run
    "serve": "serve",  # tests/server: one `bucketq serve`
    "primary": "sdk-e2e",  # tests/sdk/test_e2e.py: two `bucketq serve`
    "fallback": "sdk-e2e",
}


#: xdist workers per core (``-n auto``, addopts): most tests wait on processes they
#: started (servers, workers, JVMs), so one per core would leave the cores idle, and
#: the three Spark groups each hold a worker for most of the run: with fewer workers the
#: rest of the suite queued behind them. More only queue for the cores.
WORKERS_PER_CORE = 3


#: The run's own temporary directory (``TMPDIR`` of every process of the run), removed at
#: its end: what processes killed by the tests leave behind (embedded stores' data,
#: multiprocessing's ``pymp-*``) goes with it instead of piling up in /tmp run after run.
_RUN_TMP = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin set up its factory
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller did it all
    if config.getoption("tx", None) and os.environ.get(_NO_BYTECODE):  # xdist's controller
        os.environ[_HELD] = os.environ.pop(_NO_BYTECODE)  # the workers start without it
    compileall.compile_dir(Path(bucketq.__file__).parent, quiet=1)
    if config.getoption("tx", None):
        _rewrite_test_modules(config)
    config._tmp_path_factory.getbasetemp()  # pytest's own (kept for a few runs) stays put
    run_tmp = tempfile.mkdtemp(prefix="bucketq-tests-")
    os.chmod(run_tmp, 0o1777)  # as /tmp: the tests of file modes check what others may read
    config.stash[_RUN_TMP] = os.environ["TMPDIR"] = tempfile.tempdir = run_tmp


def _rewrite_test_modules(config: pytest.Config) -> None:
    """Writes pytest's cached rewrite of every test module and conftest before the xdist
    workers start: on a fresh checkout each worker would otherwise rewrite all of them
    (pytest's assertion rewriting, a slow pass in Python) at the same time as the others.
    pytest has no public call for it: if its internals change, this does nothing and the
    workers rewrite as they would."""
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for path in sorted(_ROOT.rglob("*.py")):
            if not (path.name.startswith("test_") or path.name == "conftest.py"):
                continue
            pyc = rewrite.get_cache_dir(path) / (path.stem + rewrite.PYC_TAIL)
            if rewrite._read_pyc(path, pyc, state.trace) is None and rewrite.try_makedirs(
                pyc.parent
            ):
                stat, code = rewrite._rewrite_test(path, config)
                rewrite._write_pyc(state, code, stat, pyc)
    except Exception:  # noqa: BLE001 - pytest's internals changed: the workers rewrite
        return


def pytest_unconfigure(config: pytest.Config) -> None:
    run_tmp = config.stash.get(_RUN_TMP, None)
    if not run_tmp:
        return
    if "multiprocessing.util" in sys.modules:
        # Its temporary directory (in a run without xdist workers, inside the run's) is
        # removed at this process's exit by its finalizer, which fails loudly when the
        # directory has gone: the run's goes after it (a lower exit priority runs later).
        from multiprocessing import util

        util.Finalize(None, shutil.rmtree, args=(run_tmp,), kwargs={"ignore_errors": True},
                      exitpriority=-101)  # fmt: skip
    else:
        shutil.rmtree(run_tmp, ignore_errors=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0))
    if "not slow" in (config.getoption("markexpr") or ""):
        return cores  # the fast tier waits on nothing: each worker's start-up is its cost
    return WORKERS_PER_CORE * cores


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = item.path.resolve().relative_to(_ROOT).parts[0]
        except ValueError:
            continue
        marker = _MARKERS.get(top)
        if marker:
            item.add_marker(marker)
        if item.path.resolve().relative_to(_ROOT.parent).as_posix() not in FAST_TIER:
            item.add_marker("slow")
        group = (
            "spark"
            if top == "spark"
            else _SHARED.get(
                next((f for f in getattr(item, "fixturenames", ()) if f in _SHARED), "")
            )
        )
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items[:] = sorted(items, key=_start_rank(items))


#: The work units that take longest, longest first, so that none of them starts near the
#: end of the run and becomes its tail while the short ones fill the gaps (longest
#: processing time first). Under ``--dist loadgroup`` a unit is an xdist group, else one
#: test; an entry names a group, a test file (each of its tests) or a test (each of its
#: parameters). Tests named by none follow in collection order. ``--no-loadscope-reorder``
#: (addopts) keeps this order; xdist's own orders units by their number of tests. Ranked
#: by what each took in a quiet run (``--durations``); a new slow test belongs here.
LONGEST_FIRST = (
    "spark",
    "spark-cluster",
    "bench-run",
    "console",
    "readme_walk",
    "serve",
    "sdk-e2e",
    "admission",  # tests/server/test_admission.py: two `bucketq serve`, a frozen store
    "tests/faults/test_server_restart.py",
    "tests/server/test_lifecycle.py",
    "tests/server/test_handed_over.py",
    "tests/faults/test_store_faults.py",
    "tests/faults/test_frozen.py",
    "tests/faults/test_claim_race.py",
    "tests/test_bench_sdk.py",
    "tests/test_bench_celery.py",
    "tests/server/test_embedded_store.py",
    "tests/misuse/test_cli_and_config.py::test_dlq_list_on_a_dead_mongodb_is_one_line",
    "tests/test_bench_ingest.py::test_bench_ingest_runs_real_servers_and_counts_what_storage_holds",
    "tests/test_benchmark.py::test_partitions_opens_partitioned_queues_and_runs_only_the_queues",
    "tests/test_benchmark.py::test_repeat_runs_each_group_k_times_interleaved_and_reports_medians",
    "tests/reservoir/test_cli_and_group_commit.py::test_dlq_list_requeue_purge_from_the_command_line",
    "tests/reservoir/test_restart.py",
    "tests/stream/test_stream.py::test_exactly_once_into_a_sink_that_stores_the_seq_while_consumers_are_killed",
    "tests/queues/test_item_timing.py::test_a_stalled_item_is_rolled_back_on_its_own_clock",
    "tests/server/test_workers.py",
    "tests/test_bench_ingest.py::test_limits_only_hostile_runs_the_hostile_neighbour_alone",
    "tests/server/test_logtide_limits.py",
    "tests/sdk/test_e2e.py",
    "tests/queues/test_bucket_queue.py::test_four_consumer_processes_deliver_every_item_once",
    "tests/queues/test_bucket_queue.py::test_lease_is_renewed_while_held",
    "tests/faults/test_consumers.py",
    "tests/worker/test_processes.py",
    "tests/celery_broker/test_worker.py",
    "tests/test_running_store.py",
    "tests/worker/test_page_walk.py",
    "tests/celery_broker/test_page_walk.py",
    "tests/celery_broker/test_store_gone.py",
)


#: Files of short tests that spend nearly all their time waiting (on leases, deadlines, the
#: shared store): they start right after the first long units, one per worker, so that
#: their waits overlap that CPU-bound stretch. Left for the end with the other short
#: tests, every worker waited in them at once while the cores idled.
WAITING_EARLY = (
    "tests/queues/test_contract.py",
    "tests/reservoir/test_transport_contract.py",
    "tests/reservoir/test_dispatch_delay.py",
    "tests/sdk/test_offline.py",
)
#: The long units that start at once, one per worker, before WAITING_EARLY.
STARTING_UNITS = 6


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def _start_rank(items: list[pytest.Item]):
    units = (*LONGEST_FIRST[:STARTING_UNITS], *WAITING_EARLY, *LONGEST_FIRST[STARTING_UNITS:])
    first = {u: i for i, u in enumerate(units)}
    order = {id(item): i for i, item in enumerate(items)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        test = item.nodeid.split("[", 1)[0]
        names = (_group(item), test, test.split("::", 1)[0])
        return (min(first.get(n, len(first)) for n in names if n), order[id(item)])

    return rank


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: required servers must be present)")
    pytest.skip(reason)


def _docker_mongo() -> Iterator[str] | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - no engine: fall through to the embedded server
        return None
    from testcontainers.mongodb import MongoDbContainer  # type: ignore[import-untyped]

    def gen() -> Iterator[str]:
        with MongoDbContainer("mongo:7") as c:
            yield c.get_connection_url()

    return gen()


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """An embedded storage server of the test's own, to freeze, stop or restart; resumed
    (SIGCONT, in case the test left it frozen) and stopped at the end."""
    try:
        server = EmbeddedServer(tmp_path / "own-storage").start()
    except Exception as exc:  # noqa: BLE001 - no server binary: skipped, or failed in CI
        _missing(f"no embedded server: {exc}")
    try:
        yield server
    finally:
        if server.pid is not None and server.running():
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    uri = os.environ.get(URI_ENV)
    if uri:
        yield uri
        return
    gen = _docker_mongo()
    if gen is not None:
        yield from gen
        return
    try:
        server = EmbeddedServer(test_commands=True).start()
    except Exception as exc:  # noqa: BLE001
        _missing(f"no MongoDB: set {URI_ENV} or install bucketq[embedded] ({exc})")
        return
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mongo_client(mongo_uri: str) -> Iterator[MongoClient]:
    client: MongoClient = MongoClient(mongo_uri)
    yield client
    client.close()


@pytest.fixture
def db_name() -> str:
    return f"bq_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def db(mongo_client: MongoClient, db_name: str):
    yield mongo_client[db_name]
    mongo_client.drop_database(db_name)


@pytest.fixture
async def adb(mongo_uri: str, mongo_client: MongoClient, db_name: str):
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    try:
        yield client[db_name]
    finally:
        await client.close()
        mongo_client.drop_database(db_name)


@pytest.fixture
def change_streams_here(mongo_client: MongoClient) -> None:
    """Skips a test of change-stream wake-ups where the MongoDB has none (a standalone)."""
    hello = mongo_client.admin.command("hello")
    if not hello.get("setName") and hello.get("msg") != "isdbgrid":
        pytest.skip("this MongoDB is a standalone server: it has no change streams")


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001
        _missing(f"no Redis at {url} ({exc}); set REDIS_URL")
    return url
