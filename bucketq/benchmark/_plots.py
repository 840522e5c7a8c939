"""PNG plots of a benchmark run (matplotlib, Agg backend, imported only here): one point
per (contender, N, P), the median of its repetitions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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


def write_plots(
    results: Sequence[RunSummary], floor_us: float, directory: str | Path, title: str
) -> list[str]:
    """Throughput by contender and cost per item by N; returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

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
    width = 0.27
    for k, (label, attr) in enumerate(
        (("push", "push_rate"), ("consume", "consume_rate"), ("end-to-end", "e2e_rate"))
    ):
        xs = [i + (k - 1) * width for i in range(len(head))]
        ys = [getattr(r, attr) for r in head.values()]
        bars = ax.bar(xs, ys, width, label=label, color=plt.get_cmap("Set2")(k))
        for b, y in zip(bars, ys, strict=True):
            ax.annotate(
                f"{y:,.0f}",
                (b.get_x() + b.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
            )
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
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("N items")
    ax2.set_ylabel("end-to-end items/s")
    ax2.set_title("End-to-end items/s by N and processes")
    ax2.grid(which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = d / THROUGHPUT_PNG
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))

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
    for a, ylabel, t in (
        (ax, "client CPU µs per item (log)", "Client CPU per item by N"),
        (ax2, "MongoDB commands per 1,000 items (log)", "Commands per 1,000 items by N"),
    ):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("N items")
        a.set_ylabel(ylabel)
        a.set_title(t)
        a.grid(which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = d / COST_PNG
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    return written
