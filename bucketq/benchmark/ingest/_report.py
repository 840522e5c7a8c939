"""What ``bucketq bench ingest`` says: the JSON document, the notes that go with the
figures, and the rich tables (ours beside the seed's published p95)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._report import print_environment
from ._load import DEFAULT_REQUEST_TIMEOUT
from ._stats import CENSORED_SHARE, LAG_LIMIT, SEED_P95_MS, SWEEP_P95_LIMIT

SCHEMA = "bucketq-bench-ingest/1"

#: How each mode is named in the tables.
MODE_LABELS = {
    "off": "buffer off",
    "memory": "memory buffer",
    "redis": "redis buffer",
    "bucketq": "bucketq buffer",
    "passthrough": "passthrough",
}


def notes(doc: Mapping[str, Any]) -> list[str]:
    """The sentences a reader needs to read the figures right."""
    st, env = doc["settings"], doc["environment"]
    out = [
        f"Open-loop load: {st['rate']:g} requests/s of {st['batch']} log records each for "
        f"{st['duration']:g} s per mode, every request sent at its scheduled time whether or not "
        "earlier ones were answered, its latency counted from that scheduled time (a stalled "
        "server cannot hide its queue). Errors' latencies are included. 'gen. lag p99' is how "
        "late the generator itself sent its requests; over "
        f"{LAG_LIMIT * 1000:.0f} ms the generator, not the server, fell behind and the figures "
        "say more about the machine than the server.",
        f"A request not answered within {DEFAULT_REQUEST_TIMEOUT:g} s counts as an error "
        "('timeout', at that latency); where over "
        f"{CENSORED_SHARE:.0%} of a mode's requests failed (timeouts, 503s) its p95 is not the "
        "latency of accepted requests, and the p95 targets call it not comparable.",
        "Each mode ran its own `bucketq serve` process (uvicorn, one process) on a fresh "
        "database of the same MongoDB server, one mode after the other; API CPU is that "
        "process's CPU time from the first request until every accepted record was visible "
        "in storage, as a share of one core.",
        "Stored = the records of the run counted in storage after the server was stopped "
        "(SIGTERM, graceful drain); it must equal the records answered 200. End-to-end = from "
        "a request's 200 to each of its records becoming visible in storage, seen by a change "
        "stream on the logs collection (every record, not a sample; 0 when visible before the "
        "answer arrived).",
        "MongoDB commands = the server's request counter (serverStatus network.numRequests) "
        "over the same window plus the graceful stop, minus every request the benchmark's own "
        "client sent (its change stream, counts, serverStatus), per 1,000 records stored.",
        "Seed p95 = the published figures of the system the buffer design comes from (k6, "
        "100 requests/s × 10 logs, 3 minutes, zero errors) on TimescaleDB and on MongoDB, on "
        "its own hardware: compare the ratios between modes, not the milliseconds.",
    ]
    if env["server"]["embedded"]:
        out.append(
            "Server: the embedded SecantusDB server, where every operation costs 10-100x what it "
            "costs on mongod, so only ratios measured in this one run carry over. It runs on the "
            "same cores as the API server and the load generator."
        )
    if st.get("sweep"):
        out.append(
            f"Sweep: the rate doubled from {st['rate']:g} requests/s ({st['sweep_duration']:g} s "
            f"per step, a fresh server each) while p95 stayed at or under "
            f"{SWEEP_P95_LIMIT * 1000:.0f} ms with no errors and stored = accepted; 'highest "
            "sustained' is the last rate that did. A sweep stopped by the generator gives a floor."
        )
    for m, why in (st.get("skipped") or {}).items():
        out.append(f"{MODE_LABELS.get(m, m)} did not run: {why}.")
    return out


def document(
    results: Mapping[str, dict[str, Any]],
    env: dict[str, Any],
    settings: dict[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "wall_s": wall_s,
        "settings": settings,
        "environment": env,
        "seed_p95_ms": SEED_P95_MS,
        "modes": dict(results),
        "plots": [],
    }
    doc["notes"] = notes(doc)
    return doc


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _seed(storage: str, mode: str) -> str:
    v = SEED_P95_MS[storage].get(mode)
    return "-" if v is None else f"{v:,.0f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if x < 10 else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def table_rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The main table as plain strings (the README's table is made from these too)."""
    head = ["mode", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors", "accepted", "stored",
            "e2e p50 / p95 ms", "API CPU", "cmds / 1k records", "gen. lag p99 ms",
            "seed p95 ms TimescaleDB", "seed p95 ms MongoDB"]  # fmt: skip
    rows = []
    for mode, r in doc["modes"].items():
        lat, ld, e2e = r["load"]["latency"], r["load"], r["end_to_end"]
        stored = f"{r['records_stored']:,}" + ("" if r["stored_ok"] else " ≠")
        rows.append([
            MODE_LABELS.get(mode, mode), _ms(lat["p50_ms"]), _ms(lat["p95_ms"]), _ms(lat["p99_ms"]),
            _ms(lat["max_ms"]), f"{ld['errors']:,}", f"{ld['records_accepted']:,}", stored,
            f"{_ms(e2e['p50_ms'])} / {_ms(e2e['p95_ms'])}" if e2e["available"] else "n/a",
            _share(r["api_cpu_share"]), _num(r["commands_per_1000_records"]),
            _ms(ld["lag"]["p99_ms"]), _seed("TimescaleDB", mode), _seed("MongoDB", mode),
        ])  # fmt: skip
    return head, rows


def mismatches(doc: Mapping[str, Any]) -> list[str]:
    """A sentence per mode whose storage does not hold exactly what was accepted."""
    out = []
    for mode, r in doc["modes"].items():
        if r["stored_ok"]:
            continue
        line = (
            f"{MODE_LABELS.get(mode, mode)}: {r['records_stored']:,} records stored, "
            f"{r['load']['records_accepted']:,} accepted"
        )
        c = r.get("stored_check")
        if c:
            line += (
                f": {c['lost']:,} accepted records missing, {c['duplicates']:,} duplicates, "
                f"{c['stored_unacknowledged']:,} records of requests that failed "
                f"({', '.join(r['load']['errors_by_kind']) or 'none'}) stored anyway"
            )
        out.append(line)
    return out


def _met(x: bool | None) -> str:
    if x is None:
        return "[dim]not run / not comparable[/]"
    return "[green]met[/]" if x else "[red]missed[/]"


def _figures(f: Mapping[str, Any]) -> str:
    parts = []
    for k, v in f.items():
        if isinstance(v, float):
            v = f"{v:,.3g}" if k == "ratio" or v < 10 else f"{v:,.0f}"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def print_report(console: Any, doc: Mapping[str, Any]) -> None:
    from rich.table import Table

    st = doc["settings"]
    head, rows = table_rows(doc)
    t = Table(
        title=f"Ingest latency at {st['rate']:g} requests/s × {st['batch']} logs, "
        f"{st['duration']:g} s per mode (ours) beside the seed's published p95"
    )
    for col in head:
        t.add_column(col, justify="left" if col == "mode" else "right")
    for row, r in zip(rows, doc["modes"].values(), strict=True):
        if not r["stored_ok"]:
            row[7] = f"[red]{row[7]}[/]"
        if r["load"]["errors"]:
            row[5] = f"[red]{row[5]}[/]"
        if not r["load"]["kept_schedule"]:
            row[11] = f"[yellow]{row[11]}[/]"
        t.add_row(*row)
    console.print(t)
    for line in mismatches(doc):
        console.print(f"[red]{line}[/]")

    sweeps = {m: r["sweep"] for m, r in doc["modes"].items() if r.get("sweep")}
    if sweeps:
        s = Table(title="Sweep: p95 ms by rate (requests/s); highest rate sustained")
        s.add_column("mode")
        s.add_column("p95 ms at each rate")
        s.add_column("highest sustained", justify="right")
        s.add_column("stopped by")
        for m, sw in sweeps.items():
            steps = ", ".join(
                f"{x['rate']:g}: {_ms(x['p95_ms'])}{'' if x['sustained'] else ' ✗'}"
                for x in sw["steps"]
            )
            best = sw["highest_sustained_rate"]
            s.add_row(MODE_LABELS.get(m, m), steps, "-" if best is None else f"{best:g}",
                      sw["stopped_by"])  # fmt: skip
        console.print(s)

    tg = doc.get("targets") or []
    if tg:
        g = Table(title="Targets")
        g.add_column("target")
        g.add_column("figures")
        g.add_column("", justify="right")
        for x in tg:
            g.add_row(x["target"], _figures(x["figures"]), _met(x["met"]))
        console.print(g)

    print_environment(console, doc)
    for m, e in (st.get("failed") or {}).items():
        console.print(f"[red]FAILED: {m}: {e}[/]")
    for p in doc.get("plots") or []:
        console.print(f"plot: {p}")
