"""The arithmetic of the benchmark, written once: shares, checksums, rates, ratios,
commands per 1,000 items, spreads, one run's figures from its workers' reports, and the
medians of a run repeated K times.

Pure: no pymongo, no processes, no clocks. Everything the runner, the report and the
plots print comes from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

#: Sent by every MongoDB client to open, watch and close connections: not queue work.
CONNECTION_COMMANDS = frozenset(
    {
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "endSessions",
        "saslStart",
        "saslContinue",
        "buildinfo",
        "buildInfo",
    }
)
#: Sent once per queue (collections and indexes): not a cost per item.
SETUP_COMMANDS = frozenset(
    {"create", "createIndexes", "listCollections", "listIndexes", "drop", "dropDatabase"}
)
#: Cost per item is "flat" when its largest value is within this fraction of its smallest.
FLAT_WITHIN = 0.20
#: The commands shown in their own column, in this order; others are summed as "other".
MAIN_COMMANDS = ("insert", "findAndModify", "update", "delete", "find", "aggregate", "getMore")


def share(n: int, procs: int, idx: int) -> tuple[int, int]:
    """Worker ``idx`` of ``procs`` pushes items ``start <= i < end`` of ``n`` (sizes differ by at most one)."""
    base, extra = divmod(n, procs)
    start = idx * base + min(idx, extra)
    return start, start + base + (1 if idx < extra else 0)


def checksum(values: Iterable[int]) -> tuple[int, int, int]:
    """(count, sum, sum of squares) of item numbers: equal for the pushed and the consumed
    items exactly when none was lost or delivered twice (short of a contrived coincidence)."""
    count = total = squares = 0
    for v in values:
        count += 1
        total += v
        squares += v * v
    return count, total, squares


#: How long an idle consumer waits for an item before it looks at the shared counter.
#: With several consumers the phase ends when the last of them has looked, so up to
#: this much of it is the harness's (none with one consumer: it counts the last item
#: itself): short, so that share stays small beside a short consume.
POLL = 0.01


def next_check(own: int, total: int, n: int, procs: int, cap: int = 1024) -> int:
    """When a consumer that has committed ``own`` items (``total`` by all, last it looked)
    should look at the shared counter again: halfway to its share of what is left, at most
    ``cap`` items on, so the last item is noticed at once and a long run looks rarely."""
    return own + max(1, min(cap, (n - total) // (2 * procs)))


def rate(items: int, seconds: float) -> float:
    """Items per second (0 when nothing was timed)."""
    return items / seconds if seconds > 0 else 0.0


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is zero."""
    return a / b if b else None


def per_thousand(count: float, items: int) -> float:
    return 1000.0 * count / items if items else 0.0


def spread(values: Iterable[float]) -> float | None:
    """max / min - 1 of positive values (0.12 = the largest is 12% above the smallest);
    None for fewer than two values."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or min(vals) <= 0:
        return None
    return max(vals) / min(vals) - 1.0


def rel_range(values: Sequence[float]) -> float | None:
    """(max - min) / median: how far apart K repetitions of one figure came out (0.06 = the
    highest is 6% of the median above the lowest); None for fewer than two values."""
    if len(values) < 2:
        return None
    mid = median(values)
    return (max(values) - min(values)) / mid if mid else None


def merge_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def queue_commands(commands: Mapping[str, int]) -> dict[str, int]:
    """The commands that are the queue's work: all but connection and setup commands."""
    return {
        k: v
        for k, v in commands.items()
        if k not in CONNECTION_COMMANDS and k not in SETUP_COMMANDS
    }


def main_columns(per_1000: Mapping[str, float]) -> dict[str, float]:
    """Commands per 1,000 items in the fixed columns of MAIN_COMMANDS, the rest as "other"."""
    out = {k: per_1000.get(k, 0.0) for k in MAIN_COMMANDS}
    out["other"] = sum(v for k, v in per_1000.items() if k not in MAIN_COMMANDS)
    return out


@dataclass
class WorkerReport:
    """What one worker process measured (times from one system-wide monotonic clock)."""

    push_start: float
    push_end: float
    push_cpu_s: float
    consume_start: float
    consume_end: float
    consume_cpu_s: float
    close_s: float
    floor_us: float  # the BSON floor, measured in this process before its clock started
    pushed: tuple[int, int, int]  # checksum of the items it pushed
    consumed: tuple[int, int, int]  # checksum of the items it committed
    push_commands: dict[str, int] = field(default_factory=dict)
    consume_commands: dict[str, int] = field(default_factory=dict)
    setup_commands: dict[str, int] = field(default_factory=dict)
    # The embedded server's CPU seconds in each phase (None: no server pid was given).
    push_server_cpu_s: float | None = None
    consume_server_cpu_s: float | None = None
    #: The write concerns its write commands carried (JSON text, or "none"), counted.
    write_concerns: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerReport:
        d = dict(d)
        d["pushed"] = tuple(d["pushed"])
        d["consumed"] = tuple(d["consumed"])
        return cls(**d)


@dataclass
class RunResult:
    """One contender at one N with P producer and P consumer processes."""

    contender: str
    per_element: bool
    n: int
    procs: int
    workers: list[WorkerReport]
    #: bucketq's N in the (N, processes) group the run belonged to.
    group_n: int = 0
    #: Items the queue still held after the consume phase (counted by the parent).
    remaining: int = 0
    #: Which repetition of its group this run was (0 .. K - 1).
    repeat: int = 0
    #: "durable" (writes wait for the journal) or "w:1" (the old default, without it).
    write_concern: str = "durable"

    # -- times (the phase runs from the first worker's start to the last worker's end)
    @property
    def push_s(self) -> float:
        return max(w.push_end for w in self.workers) - min(w.push_start for w in self.workers)

    @property
    def consume_s(self) -> float:
        return max(w.consume_end for w in self.workers) - min(w.consume_start for w in self.workers)

    @property
    def push_rate(self) -> float:
        return rate(self.n, self.push_s)

    @property
    def consume_rate(self) -> float:
        return rate(self.n, self.consume_s)

    @property
    def e2e_rate(self) -> float:
        return rate(self.n, self.push_s + self.consume_s)

    # -- items
    @property
    def pushed(self) -> tuple[int, int, int]:
        return _sum3(w.pushed for w in self.workers)

    @property
    def consumed(self) -> tuple[int, int, int]:
        return _sum3(w.consumed for w in self.workers)

    @property
    def items_ok(self) -> bool:
        """Exactly once: N items pushed, the same items committed once each (count, sum and
        sum of squares of their numbers), and nothing left in the queue."""
        return self.pushed[0] == self.n and self.consumed == self.pushed and not self.remaining

    @property
    def items_problem(self) -> str | None:
        """What went wrong with the items, in words (None when :attr:`items_ok`)."""
        if self.items_ok:
            return None
        problems = []
        if self.pushed[0] != self.n:
            problems.append(f"{self.pushed[0]:,} of {self.n:,} items pushed")
        if self.consumed[0] != self.pushed[0]:
            problems.append(f"{self.consumed[0]:,} of {self.pushed[0]:,} items committed")
        elif self.consumed != self.pushed:
            problems.append("the committed items are not the pushed ones (checksums differ)")
        if self.remaining:
            problems.append(f"{self.remaining:,} items left in the queue")
        return ", ".join(problems)

    # -- client CPU: every process of the contender, both phases
    @property
    def cpu_s(self) -> float:
        return sum(w.push_cpu_s + w.consume_cpu_s for w in self.workers)

    @property
    def cpu_us_per_item(self) -> float:
        return 1e6 * self.cpu_s / self.n if self.n else 0.0

    @property
    def floor_us(self) -> float:
        """The lowest BSON floor its workers measured (each in its own process)."""
        return min(w.floor_us for w in self.workers)

    @property
    def push_cpu_us_per_item(self) -> float:
        return 1e6 * sum(w.push_cpu_s for w in self.workers) / self.n if self.n else 0.0

    @property
    def consume_cpu_us_per_item(self) -> float:
        return 1e6 * sum(w.consume_cpu_s for w in self.workers) / self.n if self.n else 0.0

    # -- MongoDB commands
    @property
    def commands(self) -> dict[str, int]:
        """Every command sent inside the measured phases, by name."""
        return merge_counts(
            [w.push_commands for w in self.workers] + [w.consume_commands for w in self.workers]
        )

    @property
    def work_commands(self) -> dict[str, int]:
        return queue_commands(self.commands)

    @property
    def commands_per_1000(self) -> float:
        return per_thousand(sum(self.work_commands.values()), self.n)

    @property
    def commands_per_1000_by_name(self) -> dict[str, float]:
        return {k: per_thousand(v, self.n) for k, v in self.work_commands.items()}

    def as_dict(self, floor_us: float) -> dict[str, Any]:
        return {
            "contender": self.contender,
            "per_element": self.per_element,
            "n": self.n,
            "group_n": self.group_n,
            "repeat": self.repeat,
            "producers": self.procs,
            "consumers": self.procs,
            "push_s": self.push_s,
            "consume_s": self.consume_s,
            "push_per_s": self.push_rate,
            "consume_per_s": self.consume_rate,
            "end_to_end_per_s": self.e2e_rate,
            "cpu_s": self.cpu_s,
            "cpu_us_per_item": self.cpu_us_per_item,
            "push_cpu_us_per_item": self.push_cpu_us_per_item,
            "consume_cpu_us_per_item": self.consume_cpu_us_per_item,
            "floor_us_measured_in_this_run": self.floor_us,
            "cpu_vs_floor": ratio(self.cpu_us_per_item, floor_us),
            "commands_per_1000_items": self.commands_per_1000,
            "commands_per_1000_items_by_name": self.commands_per_1000_by_name,
            "commands": self.commands,
            "setup_commands": merge_counts(w.setup_commands for w in self.workers),
            "items_pushed": self.pushed[0],
            "items_consumed": self.consumed[0],
            "items_remaining": self.remaining,
            "items_ok": self.items_ok,
            "write_concern": self.write_concern,
            "write_concerns_sent": merge_counts(w.write_concerns for w in self.workers),
            "workers": [asdict(w) for w in self.workers],
        }


def _sum3(rows: Iterable[tuple[int, int, int]]) -> tuple[int, int, int]:
    a = b = c = 0
    for x, y, z in rows:
        a, b, c = a + x, b + y, c + z
    return a, b, c


#: The figures of a run that a repeated run reports as medians: JSON name -> attribute.
FIGURES = {
    "push_per_s": "push_rate",
    "consume_per_s": "consume_rate",
    "end_to_end_per_s": "e2e_rate",
    "cpu_us_per_item": "cpu_us_per_item",
    "push_cpu_us_per_item": "push_cpu_us_per_item",
    "consume_cpu_us_per_item": "consume_cpu_us_per_item",
    "commands_per_1000_items": "commands_per_1000",
}


def _over_runs(attr: str, combine: Callable[[list[Any]], Any], doc: str) -> Any:
    """A :class:`RunSummary` property: ``combine`` of the repetitions' ``attr``."""

    def get(self: RunSummary) -> Any:
        return combine(self.values(attr))

    get.__doc__ = doc.format(attr=attr)
    return property(get)


def _same_in_all(attr: str) -> Any:
    return _over_runs(
        attr, lambda xs: xs[0], "The repetitions' ``{attr}`` (one group: the same in each)."
    )


def _median_of(attr: str) -> Any:
    return _over_runs(
        attr, lambda xs: float(median(xs)), "The median of the repetitions' ``{attr}``."
    )


@dataclass
class RunSummary:
    """One contender at one N with P processes over its K repetitions (K >= 1): the
    figures a run has, each the median of its repetitions'; what the tables and plots show.
    With K = 1 every figure is that one run's."""

    runs: list[RunResult]
    #: Median over the repetitions of the end-to-end rate over the fastest per-element
    #: contender's in the same repetition at the same P (None where none ran).
    vs_per_element: float | None = None

    contender = _same_in_all("contender")
    per_element = _same_in_all("per_element")
    n = _same_in_all("n")
    procs = _same_in_all("procs")
    group_n = _same_in_all("group_n")
    write_concern = _same_in_all("write_concern")

    def values(self, attr: str) -> list[float]:
        return [getattr(r, attr) for r in self.runs]

    def median(self, attr: str) -> float:
        return float(median(self.values(attr)))

    def range(self, attr: str) -> float | None:
        """:func:`rel_range` of one figure over the repetitions."""
        return rel_range(self.values(attr))

    @property
    def repeats(self) -> int:
        return len(self.runs)

    push_rate = _median_of("push_rate")
    consume_rate = _median_of("consume_rate")
    e2e_rate = _median_of("e2e_rate")
    cpu_us_per_item = _median_of("cpu_us_per_item")
    push_cpu_us_per_item = _median_of("push_cpu_us_per_item")
    consume_cpu_us_per_item = _median_of("consume_cpu_us_per_item")
    commands_per_1000 = _median_of("commands_per_1000")

    @property
    def commands_per_1000_by_name(self) -> dict[str, float]:
        names = sorted({k for r in self.runs for k in r.commands_per_1000_by_name})
        return {
            k: float(median(r.commands_per_1000_by_name.get(k, 0.0) for r in self.runs))
            for k in names
        }

    @property
    def floor_us(self) -> float:
        return min(r.floor_us for r in self.runs)

    @property
    def items_ok(self) -> bool:
        return all(r.items_ok for r in self.runs)

    @property
    def items_problem(self) -> str | None:
        """The first failed repetition's problem (and how many failed), None when all passed."""
        bad = [r for r in self.runs if not r.items_ok]
        if not bad:
            return None
        first = bad[0].items_problem
        return first if self.repeats == 1 else f"{len(bad)} of {self.repeats} repetitions: {first}"

    def as_dict(self, floor_us: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "contender": self.contender,
            "per_element": self.per_element,
            "n": self.n,
            "group_n": self.group_n,
            "producers": self.procs,
            "consumers": self.procs,
            "repeats": self.repeats,
            "write_concern": self.write_concern,
        }
        out.update({key: self.median(attr) for key, attr in FIGURES.items()})
        out["cpu_vs_floor"] = ratio(self.cpu_us_per_item, floor_us)
        out["commands_per_1000_items_by_name"] = self.commands_per_1000_by_name
        out["end_to_end_vs_fastest_per_element"] = self.vs_per_element
        out["items_ok"] = self.items_ok
        out["items_remaining"] = [r.remaining for r in self.runs]
        out["repetitions"] = {
            key: {"values": self.values(attr), "range": self.range(attr)}
            for key, attr in FIGURES.items()
        }
        return out


def summarize(results: Sequence[RunResult]) -> list[RunSummary]:
    """One :class:`RunSummary` per (contender, N, P), in the order they first ran."""
    by: dict[tuple[str, int, int], list[RunResult]] = {}
    for r in results:
        by.setdefault((r.contender, r.n, r.procs), []).append(r)
    out = []
    for runs in by.values():
        ratios = [x for x in (vs_fastest_per_element(r, results) for r in runs) if x is not None]
        out.append(RunSummary(runs, float(median(ratios)) if ratios else None))
    return out


def floor(results: Iterable[RunResult | RunSummary]) -> float:
    """The BSON floor of a whole benchmark: the lowest any worker measured. A floor is a
    lower bound and noise (a core shared with the server, other load) only adds to it."""
    return min((r.floor_us for r in results), default=0.0)


def fastest_per_element(
    results: Iterable[RunResult], procs: int, write_concern: str = "durable"
) -> RunResult | None:
    """The per-element run with the highest end-to-end rate at ``procs`` processes under
    ``write_concern``."""
    peers = [
        r
        for r in results
        if r.per_element and r.procs == procs and r.write_concern == write_concern
    ]
    return max(peers, key=lambda r: r.e2e_rate, default=None)


def vs_fastest_per_element(result: RunResult, results: Iterable[RunResult]) -> float | None:
    """End-to-end rate of ``result`` over the fastest per-element run's of the same
    repetition at the same processes under the same write concern (side by side on the
    same server, like with like)."""
    best = fastest_per_element(
        (r for r in results if r.repeat == result.repeat), result.procs, result.write_concern
    )
    return ratio(result.e2e_rate, best.e2e_rate) if best else None


def ratios_vs_per_element(
    result: RunResult, results: Iterable[RunResult]
) -> dict[str, float | None]:
    """End-to-end rate of ``result`` over each per-element contender's at the same processes
    in the same repetition."""
    return {
        r.contender: ratio(result.e2e_rate, r.e2e_rate)
        for r in results
        if r.per_element
        and r.procs == result.procs
        and r.repeat == result.repeat
        and r is not result
    }


#: The figures the write-concern comparison sets side by side: JSON name -> attribute.
WRITE_CONCERN_FIGURES = {
    "push_per_s": "push_rate",
    "consume_per_s": "consume_rate",
    "end_to_end_per_s": "e2e_rate",
    "cpu_us_per_item": "cpu_us_per_item",
    "commands_per_1000_items": "commands_per_1000",
}


def write_concern_costs(
    summaries: Sequence[RunSummary], twins: Mapping[str, str]
) -> list[dict[str, Any]]:
    """For each contender run at the old write concern (``twins``: its name -> its durable
    twin's) and its durable twin at the same N and processes: both figures side by side
    and durable over w:1 (``0.8``: the journal costs a fifth of the rate), medians where
    repeated."""
    by = {(s.contender, s.n, s.procs): s for s in summaries}
    out = []
    for s in summaries:
        durable = by.get((twins.get(s.contender, ""), s.n, s.procs))
        if durable is None:
            continue
        row: dict[str, Any] = {"queue": durable.contender, "n": s.n, "procs": s.procs}
        for key, attr in WRITE_CONCERN_FIGURES.items():
            d, w = getattr(durable, attr), getattr(s, attr)
            row[key] = {"durable": d, "w1": w, "durable_vs_w1": ratio(d, w)}
        out.append(row)
    return out


def scaling(results: Iterable[RunSummary]) -> dict[str, dict[str, Any]]:
    """Per contender: cost per item (CPU µs, commands per 1,000) over its runs at every N and
    process count (medians where repeated), with min, max, spread and whether it is flat
    within FLAT_WITHIN."""
    by: dict[str, list[RunSummary]] = {}
    for r in sorted(results, key=lambda r: (r.procs, r.n)):
        by.setdefault(r.contender, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, runs in by.items():
        entry: dict[str, Any] = {"runs": [{"n": r.n, "procs": r.procs} for r in runs]}
        for key, values in (
            ("cpu_us_per_item", [r.cpu_us_per_item for r in runs]),
            ("commands_per_1000_items", [r.commands_per_1000 for r in runs]),
        ):
            s = spread(values)
            entry[key] = {
                "values": values,
                "min": min(values),
                "max": max(values),
                "spread": s,
                "flat": None if s is None else s <= FLAT_WITHIN,
            }
        out[name] = entry
    return out
