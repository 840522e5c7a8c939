"""PNG plots of a benchmark run (matplotlib, Agg backend, imported only here): one point
per (contender, N, P), the median of its repetitions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._contenders import CONTENDERS
from ._stats import RunSummary

THROUGHPUT_PNG = "bucketq-bench-throughput.png"
COST_PNG = "bucketq-bench-cost.png"


def _series(results: Sequence[RunSummary]) -> dict[tuple[str, int], list[RunSummary]]:
    """Runs per (contender, processes), by N."""
    out: dict[tuple[str, int], list[RunSummary]] = {}
    for r in results:
        out.setdefault((r.contender, r.procs), []).append(r)
    for runs in out.values():
        runs.sort(key=lambda r: r.n)
    return out


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(ax: Any, n_groups: int, series: Sequence[tuple[str, Sequence[float]]],
                 width: float, fmt: Callable[[float], str]) -> None:  # fmt: skip
    """One bar per series in each of ``n_groups`` groups (centred on 0, 1, ...), each
    labelled with its value written by ``fmt``."""
    cmap = pyplot().get_cmap("Set2")
    for k, (label, ys) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(n_groups)]
        bars = ax.bar(xs, ys, width, label=label, color=cmap(k))
        for b, y in zip(bars, ys, strict=True):
            ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=7, rotation=90)  # fmt: skip


def log_axes(ax: Any, xlabel: str, ylabel: str, title: str, *, xbase: int = 10,
             legend_size: int = 7) -> None:  # fmt: skip
    """Both scales logarithmic, labels, title, grid and legend."""
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def save(fig: Any, title: str, path: Path) -> str:
    """Title the figure, write it to ``path`` and free it; the path written."""
    plt = pyplot()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_plots(
    results: Sequence[RunSummary], floor_us: float, directory: str | Path, title: str
) -> list[str]:
    """Throughput by contender and cost per item by N; returns the files written."""
    plt = pyplot()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    series = _series(results)
    present = {r.contender for r in results}
    contenders = [c for c in CONTENDERS if c in present]  # the table's order, bucketq first
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(contenders)}
    styles = {1: "-", 2: "--", 4: ":"}
    markers = {1: "o", 2: "s", 4: "^"}
    written: list[str] = []

    # 1. Throughput by contender: push, consume, end-to-end at each contender's largest
    #    single-process run; and end-to-end items/s by N for every process count.
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 2]})
    head: dict[str, RunSummary] = {}
    for r in sorted(results, key=lambda r: contenders.index(r.contender)):
        cur = head.get(r.contender)
        if cur is None or (r.procs, -r.n) < (cur.procs, -cur.n):
            head[r.contender] = r
    rates = (("push", "push_rate"), ("consume", "consume_rate"), ("end-to-end", "e2e_rate"))
    grouped_bars(ax, len(head), [(label, [getattr(r, attr) for r in head.values()])
                                 for label, attr in rates], 0.27, lambda y: f"{y:,.0f}")  # fmt: skip
    ax.set_xticks(range(len(head)))
    ax.set_xticklabels(
        [f"{r.contender}\nN={r.n:,}, P={r.procs}" for r in head.values()],
        fontsize=8,
        rotation=20,
        ha="right",
    )
    ax.set_yscale("log")
    ax.set_ylabel("items/s (log scale)")
    ax.set_title("Throughput by contender")
    ax.legend()
    ax.grid(axis="y", which="both", alpha=0.3)
    for (name, procs), runs in sorted(
        series.items(), key=lambda kv: (kv[0][1], contenders.index(kv[0][0]))
    ):
        ax2.plot([r.n for r in runs], [r.e2e_rate for r in runs], styles.get(procs, "-."), marker=markers.get(procs, "D"),
                 color=colors[name], label=f"{name}, P={procs}")  # fmt: skip
    log_axes(ax2, "N items", "end-to-end items/s", "End-to-end items/s by N and processes")
    written.append(save(fig, title, d / THROUGHPUT_PNG))

    # 2. Cost per item by N: client CPU µs (with the BSON floor) and commands per 1,000 items.
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    for (name, procs), runs in sorted(
        series.items(), key=lambda kv: (kv[0][1], contenders.index(kv[0][0]))
    ):
        kw = {
            "marker": markers.get(procs, "D"),
            "color": colors[name],
            "label": f"{name}, P={procs}",
        }
        ax.plot(
            [r.n for r in runs], [r.cpu_us_per_item for r in runs], styles.get(procs, "-."), **kw
        )
        ax2.plot(
            [r.n for r in runs], [r.commands_per_1000 for r in runs], styles.get(procs, "-."), **kw
        )
    ax.axhline(
        floor_us, color="black", linestyle="--", linewidth=1, label=f"BSON floor {floor_us:.2f} µs"
    )
    log_axes(ax, "N items", "client CPU µs per item (log)", "Client CPU per item by N")
    log_axes(
        ax2, "N items", "MongoDB commands per 1,000 items (log)", "Commands per 1,000 items by N"
    )
    written.append(save(fig, title, d / COST_PNG))
    return written
