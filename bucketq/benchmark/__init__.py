"""``bucketq bench``: bucketq against the per-element queue and the Python peers that
store one document per message, interleaved in one run on one server (docs/performance.md).

Per contender and per (N, processes): N items of ~100-byte payloads pushed by P
producer processes until durable, then reserved and committed by P consumer processes
until N are committed and the state is flushed. Reported: push/s, consume/s,
end-to-end items/s, MongoDB commands per 1,000 items by command, client CPU µs per
item next to the BSON floor, the spread of the cost per item across N and processes,
the environment; a JSON file and PNG plots on request. With ``repeat`` K every (N,
processes) group runs K times and the tables show medians with their range.

Layout: ``_stats`` (the arithmetic, pure), ``_workload`` (payloads and the floor),
``_contenders`` (the queues behind one set of verbs), ``_process`` (a worker process's
entry point), ``_worker`` (its bookkeeping; its loop in ``_async/loop.py``, the sync twin
generated), ``_runner`` (the runs),
``_report`` (JSON, tables, notes), ``_plots`` (PNGs).
"""

from ._contenders import CONTENDERS, Contender, Handle
from ._runner import (
    DEFAULT_PLOTS_DIR,
    FULL,
    QUICK,
    Preset,
    RunSpec,
    build_plan,
    element_sizes,
    run,
    run_spec,
)
from ._stats import RunResult, RunSummary, WorkerReport, spread, summarize
from ._workload import bson_floor_us, payload

__all__ = [
    "CONTENDERS",
    "DEFAULT_PLOTS_DIR",
    "FULL",
    "QUICK",
    "Contender",
    "Handle",
    "Preset",
    "RunResult",
    "RunSpec",
    "RunSummary",
    "WorkerReport",
    "bson_floor_us",
    "build_plan",
    "element_sizes",
    "payload",
    "run",
    "run_spec",
    "spread",
    "summarize",
]
