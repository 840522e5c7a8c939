"""Runs the benchmark: every (contender, N, processes) run, in groups of one (N,
processes), contender after contender on one server (an embedded server the benchmark
started is replaced by a fresh one between groups once it is worn, see
``FRESH_SERVER_AFTER``); with ``repeat`` K, each group K times in a row.

Each run gets its own database and P worker processes (see ``_process``); the
parent only starts them, shows progress from their shared counters, collects their
reports, counts what the queue still holds and drops the database. Workers coordinate by
barriers and a shared counter, never by a timeout; a run fails loudly when a worker
fails, or when no item moved for ``stall_timeout`` seconds (items lost or a worker hung).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue as queue_mod
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from .. import _validate as v
from ..errors import ConfigurationError
from ._contenders import CONTENDERS
from ._stats import RunResult, WorkerReport, floor, summarize

log = logging.getLogger("bucketq.benchmark")

#: Seconds without an item pushed or committed after which a run is declared stuck.
DEFAULT_STALL_TIMEOUT = 180.0
#: ``--write-concern``: ``compare`` runs the durable contenders and the w:1 twins of
#: bucketq's Queue and per-element queue side by side; ``durable`` only the former.
WRITE_CONCERN_CHOICES = ("compare", "durable")


@dataclass(frozen=True)
class RunSpec:
    contender: str
    n: int
    procs: int
    #: bucketq's N in the (N, processes) group this run belongs to.
    group_n: int = 0
    #: Which repetition of its group this run is (0 .. K - 1).
    repeat: int = 0

    @property
    def per_element(self) -> bool:
        return CONTENDERS[self.contender].per_element


def element_sizes(sizes: Sequence[int], cap: int) -> dict[int, int]:
    """Items for a per-element contender in the group where bucketq pushes each of ``sizes``:
    ``cap`` at the largest size, half as many at each smaller one (never more than bucketq)."""
    ordered = sorted(set(sizes), reverse=True)
    return {n: max(1, min(n, cap >> rank)) for rank, n in enumerate(ordered)}


def build_plan(
    contenders: Sequence[str],
    sizes: Sequence[int],
    procs: Sequence[int],
    element_n: int,
    extra: Sequence[tuple[str, int, int]] = (),
    repeat: int = 1,
) -> list[RunSpec]:
    """Groups of runs, one per (size, processes) and then one per extra (N, processes):
    in each, the per-element contenders first (at their smaller N, see
    :func:`element_sizes`; they are the ones a server slowed by big runs would wrong),
    then bucketq's, in the order given. No run twice; with ``repeat`` K, each group K times
    in a row, the same runs in the same order each time, except that a contender and its
    w:1 twin trade places in every other repetition (the embedded server slows down as
    runs go by: the pair's comparison must not always favour the one that ran first)."""
    if repeat < 1:
        raise ConfigurationError(f"repeat must be at least 1, not {repeat}.")
    small = element_sizes(sizes, element_n)
    groups: dict[tuple[int, int], list[str]] = {}
    for p in procs:
        for n in sizes:
            groups.setdefault((n, p), []).extend(contenders)
    for name, n, p in extra:
        if name in contenders:
            groups.setdefault((n, p), []).append(name)
    plan: list[RunSpec] = []
    for (n, p), names in groups.items():
        ordered = [c for c in names if CONTENDERS[c].per_element] + [
            c for c in names if not CONTENDERS[c].per_element
        ]
        once: list[RunSpec] = []
        for name in ordered:
            size = small.get(n, n) if CONTENDERS[name].per_element else n
            spec = RunSpec(name, size, p, n)
            if all((s.contender, s.n, s.procs) != (name, size, p) for s in plan + once):
                once.append(spec)
        for k in range(repeat):
            runs = _twins_swapped(once) if k % 2 else once
            plan.extend(replace(s, repeat=k) for s in runs)
    return plan


def _twins_swapped(runs: list[RunSpec]) -> list[RunSpec]:
    """``runs`` with each w:1 twin and its durable contender in each other's place."""
    out = list(runs)
    at = {s.contender: i for i, s in enumerate(out)}
    for i, s in enumerate(runs):
        j = at.get(CONTENDERS[s.contender].twin_of)
        if j is not None:
            out[i], out[j] = out[j], out[i]
    return out


#: ``progress(pushed, committed)`` while a run goes; called from the parent only.
Progress = Callable[[int, int], None]


def worker_context() -> Any:
    """Where the workers come from: a fork server that imported their module once, so
    each worker starts as a fresh single-threaded process (its CPU clock at zero, no
    client of the parent's) without importing pymongo and the contenders again."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["bucketq.benchmark._process"])
    return ctx


def run_spec(
    uri: str,
    spec: RunSpec,
    progress: Progress,
    *,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    queue_options: dict[str, Any] | None = None,
    server_pid: int | None = None,
) -> RunResult:
    """One contender at one N with ``spec.procs`` producer/consumer processes. With the
    embedded server's ``server_pid``, the workers also measure its CPU per phase."""
    from . import _process

    contender = CONTENDERS[spec.contender]
    db_name = f"bucketq_bench_{uuid.uuid4().hex[:10]}"
    ctx = worker_context()
    barrier = ctx.Barrier(spec.procs)
    pushed = ctx.RawArray("q", spec.procs)
    done = ctx.RawArray("q", spec.procs)
    results = ctx.Queue()
    wspec = {
        "contender": spec.contender,
        "uri": uri,
        "db": db_name,
        "n": spec.n,
        "procs": spec.procs,
        "queue_options": queue_options,
        "server_pid": server_pid,
    }
    workers = [
        ctx.Process(
            target=_process.main, args=(wspec, i, barrier, pushed, done, results), daemon=True
        )
        for i in range(spec.procs)
    ]
    reports: dict[int, dict[str, Any]] = {}
    try:
        contender.prepare(uri, db_name)
        for w in workers:
            w.start()
        last = (-1, -1)
        last_move = time.monotonic()
        while len(reports) < spec.procs:
            try:
                kind, idx, value = results.get(timeout=0.1)
            except queue_mod.Empty:
                pass
            else:
                if kind == "error":
                    raise RuntimeError(
                        f"{spec.contender} (N={spec.n:,}, {spec.procs} processes), worker {idx}: {value}"
                    )
                reports[idx] = value
            now_counts = (sum(pushed), sum(done))
            progress(*now_counts)
            if now_counts != last:
                last, last_move = now_counts, time.monotonic()
            elif time.monotonic() - last_move > stall_timeout:
                raise RuntimeError(
                    f"{spec.contender} (N={spec.n:,}, {spec.procs} processes) made no progress for "
                    f"{stall_timeout:.0f} s: {now_counts[0]:,} pushed, {now_counts[1]:,} of {spec.n:,} committed. "
                    "Items were lost or a worker hung; its database was dropped."
                )
            dead = [
                i for i, w in enumerate(workers) if w.exitcode not in (None, 0) and i not in reports
            ]
            if dead and results.empty():
                raise RuntimeError(
                    f"{spec.contender}: worker {dead[0]} died with exit code {workers[dead[0]].exitcode} "
                    "before reporting."
                )
        for w in workers:
            w.join(30)
        try:
            remaining = contender.remaining(uri, db_name)
        except PyMongoError as exc:
            raise RuntimeError(
                f"{spec.contender} (N={spec.n:,}, {spec.procs} processes): could not count the "
                f"items left in the queue: {exc}"
            ) from exc
    finally:
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        for w in workers:
            if w.is_alive():
                w.terminate()
                w.join(5)
        client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        with client:
            try:
                client.drop_database(db_name)
            except PyMongoError as exc:  # never hide why the run ended
                log.warning("could not drop the benchmark database %s: %s", db_name, exc)
    return RunResult(
        spec.contender,
        contender.per_element,
        spec.n,
        spec.procs,
        [WorkerReport.from_dict(reports[i]) for i in range(spec.procs)],
        spec.group_n,
        remaining,
        spec.repeat,
        contender.write_concern,
    )


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def environment(uri: str, started_embedded: bool, contenders: Sequence[str]) -> dict[str, Any]:
    """The server, the write concern, the machine and every version that shaped the figures."""
    import os
    import platform
    import sys

    c: MongoClient = MongoClient(uri)
    with c:
        build = c.admin.command("buildinfo")
        hello = c.admin.command("hello")
        client_wc = c.write_concern.document
        try:
            server_wc = c.admin.command("getDefaultRWConcern").get("defaultWriteConcern")
        except Exception:  # noqa: BLE001 - not every server has it (SecantusDB does not)
            server_wc = None
    secantus = build.get("secantusVersion")
    topology = f"replica set {hello['setName']}" if hello.get("setName") else "standalone"
    if secantus:
        description = f"SecantusDB {secantus} (MongoDB {build.get('version')} wire, {topology})"
    else:
        description = f"MongoDB {build.get('version')} ({topology})"
    if client_wc:
        wc = f"{client_wc} (from the URI)"
    elif server_wc:
        wc = f"server default {server_wc}"
    else:
        wc = "server default (w:1 on a single node)"
    if "j" not in client_wc and "fsync" not in client_wc:
        wc += "; bucketq adds j: true (its default: writes wait for the journal)"
    dists = {"bucketq", "pymongo", "rich", "matplotlib", "SecantusDB"}
    for name in contenders:
        dists.update(CONTENDERS[name].distributions)
    return {
        "server": {
            "description": description,
            "version": build.get("version"),
            "secantus_version": secantus,
            "embedded": bool(secantus),
            "started_by_bench": started_embedded,
            "topology": topology,
        },
        "write_concern": wc,
        "versions": {"python": sys.version.split()[0], **{d: _version(d) for d in sorted(dists)}},
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


# -- the whole benchmark ------------------------------------------------------------------

#: Where the PNG plots go unless ``--plots DIR`` says otherwise.
DEFAULT_PLOTS_DIR = "bench-results"


@dataclass(frozen=True)
class Preset:
    sizes: tuple[int, ...]
    procs: tuple[int, ...]
    element_n: int  # per-element N at the largest size (halved at each smaller one)
    extra: tuple[tuple[str, int, int], ...] = ()


#: --quick: every contender at 100,000 items (per-element at 500), one process each, plus
#: bucketq (per item and through the _many calls) at 10,000 items and at 2 producer + 2 consumer
#: processes: a cost-flatness slice.
QUICK = Preset(
    sizes=(100_000,),
    procs=(1,),
    element_n=500,
    extra=tuple(
        (name, n, p)
        for n, p in ((10_000, 1), (100_000, 2))
        for name, c in CONTENDERS.items()
        if not c.per_element and not c.twin_of
    ),
)
#: The full matrix: 10k / 100k / 1M items × 1 / 2 / 4 processes; per-element contenders at
#: 250 / 500 / 1,000 items (a claim per item on the embedded server: 1M would take days).
FULL = Preset(sizes=(10_000, 100_000, 1_000_000), procs=(1, 2, 4), element_n=1_000)


#: An embedded server the benchmark started is started afresh for every (N, processes)
#: group, and before any run once this many items went through it: its cost per
#: operation grows with the history it keeps, so the order of the runs would otherwise
#: decide their figures.
FRESH_SERVER_AFTER = 1_000_000


class _Servers:
    """The server the runs use: the URI given (or ``$BUCKETQ_MONGODB_URI``), kept for the
    whole benchmark; else an embedded server, started afresh when :meth:`due`."""

    def __init__(self, uri: str | None) -> None:
        self.uri = v.mongodb_uri(uri, running_store=False) or None
        self.embedded: Any = None
        self.items = 0

    def start(self) -> str:
        if self.uri:
            return self.uri
        from ..embedded import EmbeddedServer

        self.embedded = EmbeddedServer().start()
        self.items = 0
        return str(self.embedded.uri)

    def due(self, new_group: bool) -> bool:
        """A fresh embedded server is due: a new group, or this one is worn."""
        if self.embedded is None or not self.items:
            return False
        return new_group or self.items >= FRESH_SERVER_AFTER

    def restart(self) -> str:
        self.stop()
        return self.start()

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


def default_contenders(optioned: bool, write_concern: str) -> list[str]:
    """The contenders a run without ``--contender`` runs: those that take queue options
    when ``optioned`` (``--partitions``, ``--claim``), and the w:1 twins only when
    ``write_concern`` is ``compare``."""
    v.choice("write_concern", write_concern, WRITE_CONCERN_CHOICES)
    return [
        c
        for c, x in CONTENDERS.items()
        if (not optioned or x.takes_options) and (write_concern == "compare" or not x.twin_of)
    ]


def _require(modules: Sequence[str]) -> None:
    from .._deps import require_all

    require_all(modules, "bench")


def run(
    uri: str | None = None,
    *,
    quick: bool = False,
    n: int | None = None,
    sizes: Sequence[int] | None = None,
    procs: Sequence[int] | None = None,
    element_n: int | None = None,
    contenders: Sequence[str] | None = None,
    json_path: str | None = None,
    plots_dir: str | None = DEFAULT_PLOTS_DIR,
    console: Any = None,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    repeat: int = 1,
    partitions: int = 1,
    claim: str = "auto",
    write_concern: str = "compare",
) -> dict[str, Any]:
    """Run the benchmark, print its tables, write the JSON (``json_path``) and the plots
    (``plots_dir``; None for none). Returns the JSON document.

    ``quick`` or not picks the preset (QUICK / FULL); ``n`` (one size), ``sizes``,
    ``procs`` and ``element_n`` override it, and an override drops the preset's extra runs.
    ``repeat`` K runs every (N, processes) group K times (a fresh embedded server each
    time); the tables and plots show the median of each figure, the JSON every repetition.
    ``partitions`` K > 1 opens the bucketq queues with ``partitions=K`` (and runs only
    the contenders that take it unless ``contenders`` names others, which is an error);
    ``claim`` other than ``auto`` names their claim form the same way.
    ``write_concern`` ``compare`` (the default) also runs bucketq's Queue and its
    per-element queue at the old default write concern (``w: 1`` without ``j``) beside
    their durable rows and reports what the journal costs each; ``durable`` leaves those
    rows out (unless ``contenders`` names them).
    """
    import json
    import sys

    from .. import bucket

    v.count("partitions", partitions, lo=1, hi=bucket.MAX_PARTITIONS, unit="partitions")
    v.choice("claim", claim, ("auto", "find_and_modify", "find_then_update"))
    optioned = partitions > 1 or claim != "auto"
    names = list(contenders or default_contenders(optioned, write_concern))
    unknown = [c for c in names if c not in CONTENDERS]
    if unknown:
        raise ConfigurationError(f"Unknown contender(s) {unknown}; choose from {list(CONTENDERS)}.")
    unpartitioned = [c for c in names if optioned and not CONTENDERS[c].takes_options]
    if unpartitioned:
        raise ConfigurationError(
            f"{f'--partitions {partitions}' if partitions > 1 else f'--claim {claim}'} applies "
            f"to bucketq's Queue and AsyncQueue only, not to {unpartitioned}; leave those out "
            "(or pass no --contender)."
        )
    queue_options: dict[str, Any] = {"partitions": partitions} if partitions > 1 else {}
    if claim != "auto":
        queue_options["claim"] = claim
    _require(
        [
            "rich",
            *(["matplotlib"] if plots_dir else []),
            *(m for c in names for m in CONTENDERS[c].modules),
        ]
    )

    from ._report import document, print_report
    from ._terminal import Terminal

    preset = QUICK if quick else FULL
    overridden = n is not None or sizes is not None or procs is not None or element_n is not None
    sizes = (n,) if n is not None else tuple(sizes or preset.sizes)
    procs = tuple(procs or preset.procs)
    element_n = element_n or preset.element_n
    plan = build_plan(names, sizes, procs, element_n, () if overridden else preset.extra, repeat)
    settings = {
        "quick": quick,
        "repeat": repeat,
        "sizes": list(sizes),
        "procs": list(procs),
        "element_n": element_n,
        "partitions": partitions,
        "claim": claim,
        "write_concern": write_concern,
        "contenders": names,
        "plan": [asdict(s) for s in plan],
        "fresh_server_after_items": FRESH_SERVER_AFTER,
        "argv": sys.argv,
    }
    ui = Terminal(console)
    console = ui.console
    t_start = time.monotonic()
    results: list[RunResult] = []
    restarts: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    server = _Servers(uri)
    try:
        server_uri = server.start()
        env = environment(server_uri, server.embedded is not None, names)
        element_ns = ", ".join(f"{s:,}" for s in sorted(element_sizes(sizes, element_n).values()))
        ui.headline(
            f"[bold]bucketq bench[/]: {len(plan)} runs of {len(names)} contenders"
            f"{f' ({repeat} repetitions of each group)' if repeat > 1 else ''} on "
            f"{env['server']['description']}; N = {', '.join(f'{s:,}' for s in sizes)} (per-element "
            f"{element_ns}), processes = {', '.join(map(str, sorted({s.procs for s in plan})))}"
        )
        with ui.runs(len(plan)):
            group: tuple[int, int, int] | None = None
            for spec in plan:
                # a repetition of a group is a group of its own: on a fresh server
                new_group = (spec.group_n, spec.procs, spec.repeat) != group
                group = (spec.group_n, spec.procs, spec.repeat)
                if server.due(new_group):
                    restarts.append({"before": asdict(spec), "after_items": server.items})
                    server_uri = server.restart()
                label = f"{spec.contender} N={spec.n:,} P={spec.procs}"
                if repeat > 1:
                    label += f" #{spec.repeat + 1}"
                progress = ui.run_started(label, spec.n)
                try:
                    r = run_spec(
                        server_uri,
                        spec,
                        progress,
                        stall_timeout=stall_timeout,
                        queue_options=queue_options,
                        server_pid=server.embedded.pid if server.embedded else None,
                    )
                except RuntimeError as exc:  # one failed run must not cost the others
                    failed.append({**asdict(spec), "error": str(exc)})
                    ui.run_failed(label, exc)
                    server.items += spec.n
                    continue
                server.items += spec.n
                results.append(r)
                ui.run_done(label, r)
    finally:
        server.stop()
    settings["server_restarts"] = restarts
    settings["failed_runs"] = failed
    wall = time.monotonic() - t_start
    plots: list[str] = []
    summaries = summarize(results)
    if plots_dir and results:
        from ._plots import write_plots

        title = f"bucketq bench{' --quick' if quick else ''}{f' --repeat {repeat}' if repeat > 1 else ''}{f' --partitions {partitions}' if partitions > 1 else ''} on {env['server']['description']}"
        plots = write_plots(summaries, floor(results), plots_dir, title)
    doc = document(results, env, settings, wall, plots)
    print_report(console, summaries, doc)
    if plots:
        console.print(f"plots: {', '.join(plots)}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        console.print(f"every figure: {json_path}")
    problems = [
        f"{r.contender} (N={r.n:,}, P={r.procs}{f', repetition {r.repeat + 1}' if repeat > 1 else ''}): "
        f"items did not all come back exactly once ({r.items_problem})"
        for r in results
        if not r.items_ok
    ]
    problems += [f"{f['contender']} (N={f['n']:,}, P={f['procs']}): {f['error']}" for f in failed]
    if problems:
        raise RuntimeError(
            f"{len(problems)} run(s) failed ({'; '.join(problems)}); the other figures are in {json_path or 'the table'}."
        )
    return doc
