"""The PNG of ``bucketq bench ingest`` (matplotlib, Agg backend, imported only here):
request latency percentiles per mode beside the seed's published p95, and with a
sweep, p95 by rate per mode."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._plots import grouped_bars, log_axes, pyplot, save
from ._report import MODE_LABELS
from ._stats import SEED_P95_MS, SWEEP_P95_LIMIT

PNG = "bucketq-bench-ingest.png"


def write_plot(doc: Mapping[str, Any], directory: str | Path) -> str:
    """Writes the PNG into ``directory``; returns its path."""
    plt = pyplot()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    modes = doc["modes"]
    sweeps = {m: r["sweep"] for m, r in modes.items() if r.get("sweep")}
    fig, axes = plt.subplots(
        1, 2 if sweeps else 1, figsize=(15 if sweeps else 10, 6), squeeze=False
    )
    ax = axes[0][0]
    names = list(modes)
    width = 0.2
    grouped_bars(ax, len(names),
                 [(q.replace("_ms", ""), [modes[m]["load"]["latency"][q] or 0 for m in names])
                  for q in ("p50_ms", "p95_ms", "p99_ms", "max_ms")],
                 width, lambda y: f"{y:,.0f}" if y >= 10 else f"{y:.1f}")  # fmt: skip
    for storage, marker in (("TimescaleDB", "x"), ("MongoDB", "D")):
        # on the p95 bars
        pts = [(i - 0.5 * width, SEED_P95_MS[storage].get(m)) for i, m in enumerate(names)]
        pts = [(i, v) for i, v in pts if v is not None]
        if pts:
            ax.scatter([i for i, _ in pts], [v for _, v in pts], marker=marker, color="black",
                       zorder=3, label=f"seed p95, {storage}")  # fmt: skip
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([MODE_LABELS.get(m, m) for m in names])
    ax.set_yscale("log")
    ax.set_ylabel("request latency from the scheduled send, ms (log)")
    st = doc["settings"]
    ax.set_title(f"{st['rate']:g} requests/s × {st['batch']} logs, {st['duration']:g} s per mode")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if sweeps:
        ax2 = axes[0][1]
        for m, sw in sweeps.items():
            xs = [s["rate"] for s in sw["steps"] if s["p95_ms"] is not None]
            ys = [s["p95_ms"] for s in sw["steps"] if s["p95_ms"] is not None]
            ax2.plot(xs, ys, marker="o", label=MODE_LABELS.get(m, m))
        ax2.axhline(SWEEP_P95_LIMIT * 1000, color="black", linestyle="--", linewidth=1,
                    label="p95 limit")  # fmt: skip
        log_axes(ax2, "requests/s", "p95 ms (log)", "Sweep: p95 by rate", xbase=2, legend_size=8)
    return save(fig, f"bucketq bench ingest on {doc['environment']['server']['description']}",
                d / PNG)  # fmt: skip
