"""What a run says: the JSON document with every figure and the environment, the notes
that go with the figures, and the rich tables printed at the end (the medians of the
repetitions, with their range, when each group ran more than once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._contenders import CONTENDERS
from ._stats import (
    FLAT_WITHIN,
    MAIN_COMMANDS,
    POLL,
    RunResult,
    RunSummary,
    floor,
    main_columns,
    ratio,
    ratios_vs_per_element,
    scaling,
    summarize,
    vs_fastest_per_element,
    write_concern_costs,
)
from ._workload import payload

SCHEMA = "bucketq-bench/4"
#: Each contender run at the old write concern -> its durable twin.
TWINS = {name: c.twin_of for name, c in CONTENDERS.items() if c.twin_of}


def notes(results: Sequence[RunResult], env: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The sentences a reader needs to read the figures right."""
    out: list[str] = []
    restarts = settings.get("server_restarts") or []
    if restarts:
        out.append(
            f"The embedded server was started afresh {len(restarts)} time(s): for every (N, P) group and "
            f"before any run once {settings['fresh_server_after_items']:,} items had gone through it, "
            "because its cost per operation grows with the history it keeps and the order of the runs "
            "would otherwise decide their figures. Within a group every contender ran on the same "
            "server, the per-element ones first."
        )
    bucketq_n = sorted({r.n for r in results if not r.per_element})
    element_n = sorted({r.n for r in results if r.per_element})
    if bucketq_n and element_n and max(element_n) < max(bucketq_n):
        out.append(
            f"Per-element contenders ran at N = {_ns(element_n)} while bucketq ran at N = {_ns(bucketq_n)}: "
            "one claim per item is too slow on this server to run them at bucketq's N, so they are capped"
            + (
                f" (at {max(bucketq_n):,} items they would take hours)"
                if max(bucketq_n) >= 1_000_000
                else ""
            )
            + ". Rates are items/s and costs per item; on this server a per-element claim gets slower as "
            "the collection grows, so their small-N rates flatter them and the ratios are conservative."
        )
    if env["server"]["embedded"]:
        out.append(
            "Server: the embedded SecantusDB server, where every operation costs 10-100x what it costs on "
            "mongod, so only ratios measured in this one run carry over. Its findAndModify scans the "
            "collection (~0.5 s of server CPU per claim at 7,600 documents) where a real mongod uses its "
            "index, so wall-clock items/s falls as the collection grows (bigger N); the cost per item "
            "(client CPU µs, commands per 1,000 items) is what stays flat. bucketq's queues claim "
            "there with claim='find_then_update' (a find of 8 candidates, then a conditional update "
            "per claim) unless --claim names the form."
        )
    repeat = settings.get("repeat", 1)
    if repeat > 1:
        out.append(
            f"Every (N, P) group ran {repeat} times, each time on a fresh embedded server when the "
            "benchmark started one, with its contenders interleaved in the same order; every figure "
            "in the tables is the median of the repetitions, and 'range e2e / CPU' is (max - min) / "
            "median of end-to-end items/s and of CPU µs/item. The JSON has every repetition's "
            "figures ('runs') and the medians with each figure's values and range ('medians')."
        )
    out.append(
        "vs per-element = end-to-end items/s over the fastest per-element contender's at the same P "
        "in the same repetition under the same write concern ('-' where none ran at that P)."
    )
    out.append(
        "Write concern: every contender's writes wait for the journal (bucketq's default: the "
        "database's write concern with j: true; the peers' URIs get journal=true), so an item "
        "counted as pushed survives a killed server. The rows marked (w:1) are bucketq's Queue "
        "and per-element queue at the old default, w: 1 without j (acknowledged from memory: "
        "a killed server loses the last ~100 ms); 'durable / w:1' is the durable rate over "
        "that one, from the same run on the same server. The embedded server slows down as runs "
        "go by, so with --repeat the two trade places every other repetition; a single "
        "repetition lets the durable row run first, on the fresher server."
        if any(r.write_concern != "durable" for r in results)
        else "Write concern: every contender's writes wait for the journal (bucketq's default: "
        "the database's write concern with j: true; the peers' URIs get journal=true)."
    )
    out.append(
        "Client CPU = process CPU time (all threads) of every producer and consumer process of the "
        "contender, divided by N; payloads are made before the clock starts. The floor is bson.encode + "
        "bson.decode of each payload once, measured in every worker process before its clock starts "
        "(best of 3); the lowest of them is the floor (the JSON has each)."
    )
    out.append(
        "Commands / 1k items count every command the contender's processes sent during the measured "
        "phases (pymongo command monitoring, registered in each process) except connection handshakes "
        "and one-time setup (create, createIndexes, listCollections); the JSON has all of them by name."
    )
    out.append(
        "Push ends when every item is stored under the write concern; consume ends when N items are "
        "committed (a counter shared by the consumer processes; an idle consumer looks at it "
        f"every {POLL * 1000:.0f} ms) and each consumer has flushed its state; close() is not timed "
        "(its seconds are in the JSON as close_s)."
    )
    out.append(
        "Items back = exactly once: the items committed are the items pushed, each once (count, sum "
        "and sum of squares of their numbers), and after the consumers closed the queue holds "
        "nothing (bucketq: the live items of its bucket documents; per-element queues: their "
        "documents; mongo-taskqueue: tasks not 'successful'; kombu: its messages collection)."
    )
    names = {r.contender for r in results}
    contender_notes = [CONTENDERS[n].note for n in CONTENDERS if n in names and CONTENDERS[n].note]
    out.extend(dict.fromkeys(contender_notes))  # one note may cover several contenders
    if names & {"mongo-taskqueue TaskQueue", "kombu MongoDB transport"}:
        out.append(
            "The peers run sync only: mongo-taskqueue's AsyncTaskQueue needs Motor (past end of life, not "
            "installed) and kombu has no asyncio API."
        )
    return out


def _ns(ns: Sequence[int]) -> str:
    return ", ".join(f"{n:,}" for n in ns)


def _fmt_num(x: float) -> str:
    """Two decimals below 10, one below 100, none above: small counts stay visible."""
    return f"{x:,.2f}" if x < 10 else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def document(
    results: Sequence[RunResult],
    env: dict[str, Any],
    settings: dict[str, Any],
    wall_s: float,
    plots: Sequence[str] = (),
) -> dict[str, Any]:
    """Every figure and the environment, as written by ``--json``: every repetition's run
    (``runs``) and, per (contender, N, P), the medians over the repetitions (``medians``)."""
    floor_us = floor(results)
    runs = []
    for r in results:
        d = r.as_dict(floor_us)
        d["end_to_end_vs_per_element"] = ratios_vs_per_element(r, results)
        d["end_to_end_vs_fastest_per_element"] = vs_fastest_per_element(r, results)
        runs.append(d)
    summaries = summarize(results)
    p = payload(0)
    import json

    import bson

    return {
        "schema": SCHEMA,
        "wall_s": wall_s,
        "settings": settings,
        "environment": env,
        "payload": {
            "example": p,
            "bytes_json": len(json.dumps(p)),
            "bytes_bson": len(bson.encode(p)),
        },
        "floor_us_per_item": floor_us,
        "runs": runs,
        "medians": [m.as_dict(floor_us) for m in summaries],
        "scaling": scaling(summaries),
        "write_concern_cost": write_concern_costs(summaries, TWINS),
        "partition_targets": partition_targets(summaries, settings.get("partitions") or 1),
        "flat_within": FLAT_WITHIN,
        "notes": notes(results, env, settings),
        "plots": list(plots),
    }


#: Partitioned consumers' targets: P producers + P consumers on ``--partitions K`` at
#: least as fast end to end as 1 + 1, at most this many commands per 1,000 items.
PARTITION_E2E_TARGET = 1.0
PARTITION_COMMANDS_TARGET = 2.5


def partition_targets(summaries: Sequence[RunSummary], partitions: int) -> list[dict[str, Any]]:
    """With ``--partitions K`` > 1: for each contender and N that ran with one process and
    with more, the medians of P+P against 1+1 end to end and P+P's commands per 1,000
    items, each beside its target."""
    if partitions <= 1:
        return []
    out = []
    one = {(r.contender, r.n): r for r in summaries if r.procs == 1}
    for r in summaries:
        base = one.get((r.contender, r.n))
        if r.procs == 1 or base is None or not base.e2e_rate:
            continue
        vs = r.e2e_rate / base.e2e_rate
        out.append({
            "contender": r.contender, "n": r.n, "procs": r.procs, "partitions": partitions,
            "end_to_end_vs_1_1": vs, "end_to_end_target": PARTITION_E2E_TARGET,
            "end_to_end_met": vs >= PARTITION_E2E_TARGET,
            "commands_per_1000": r.commands_per_1000,
            "commands_target": PARTITION_COMMANDS_TARGET,
            "commands_met": r.commands_per_1000 <= PARTITION_COMMANDS_TARGET,
        })  # fmt: skip
    return out


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}x" if x >= 10 else f"{x:,.1f}x"


def _fmt_share(x: float | None) -> str:
    """A ratio near 1 (durable over w:1) with two decimals: 0.93x."""
    return "-" if x is None else f"{x:.2f}x"


def _fmt_spread(s: float | None) -> str:
    if s is None:
        return "-"
    mark = "flat" if s <= FLAT_WITHIN else "NOT flat"
    return f"{100 * s:.0f}% ({mark})"


def _fmt_range(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _items_back(r: RunSummary) -> str:
    if r.items_ok:
        return f"{r.n:,} ok"
    return f"[red]{r.items_problem}[/]"


def print_environment(console: Any, doc: Mapping[str, Any], prefix: str = "") -> None:
    """The run's environment in one line (after ``prefix``), then its notes."""
    env = doc["environment"]
    console.print(
        f"{prefix}Server: {env['server']['description']}; write concern: {env['write_concern']}. "
        f"Python {env['versions']['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if k != "python" and v)
        + f"; {env['cpu_count']} CPUs; wall time {doc['wall_s']:.0f} s."
    )
    for n in doc["notes"]:
        console.print(f"[dim]- {n}[/]")


def print_report(console: Any, results: Sequence[RunSummary], doc: dict[str, Any]) -> None:
    """The tables: one row per (contender, N, P), the medians where groups were repeated."""
    from rich.table import Table

    floor_us = doc["floor_us_per_item"]
    repeated = any(r.repeats > 1 for r in results)
    order = {name: i for i, name in enumerate(CONTENDERS)}
    shown = sorted(results, key=lambda r: (r.procs, r.group_n, r.per_element, order[r.contender]))
    title = (
        "Lifecycle throughput and cost per item (P producer processes, then P consumer processes)"
    )
    if repeated:
        title += f"; medians of {max(r.repeats for r in results)} repetitions"
    t = Table(title=title)
    for col in ("contender", "N", "P", "push/s", "consume/s", "end-to-end/s", "vs per-element",
                "cmds/1k items", "CPU µs/item", "vs floor",
                *(["range e2e / CPU"] if repeated else []), "items back"):  # fmt: skip
        t.add_column(col, justify="left" if col == "contender" else "right")
    for r in shown:
        ranges = [f"{_fmt_range(r.range('e2e_rate'))} / {_fmt_range(r.range('cpu_us_per_item'))}"]
        t.add_row(
            r.contender, f"{r.n:,}", str(r.procs), f"{r.push_rate:,.0f}", f"{r.consume_rate:,.0f}",
            f"{r.e2e_rate:,.0f}", _fmt_ratio(r.vs_per_element),
            _fmt_num(r.commands_per_1000), _fmt_num(r.cpu_us_per_item), _fmt_ratio(ratio(r.cpu_us_per_item, floor_us)),
            *(ranges if repeated else []), _items_back(r),
        )  # fmt: skip
    console.print(t)

    # Commands by name: every run when there are few, else each (contender, P) at its largest N.
    rows = list(shown)
    if len(rows) > 16:
        top: dict[tuple[str, int], RunSummary] = {}
        for r in shown:
            if (r.contender, r.procs) not in top or r.n > top[(r.contender, r.procs)].n:
                top[(r.contender, r.procs)] = r
        rows = list(top.values())
    c = Table(title="MongoDB commands per 1,000 items, by command")
    c.add_column("contender")
    c.add_column("N", justify="right")
    c.add_column("P", justify="right")
    for name in (*MAIN_COMMANDS, "other"):
        c.add_column(name, justify="right")
    for r in rows:
        cols = main_columns(r.commands_per_1000_by_name)
        c.add_row(
            r.contender,
            f"{r.n:,}",
            str(r.procs),
            *(_fmt_num(cols[k]) if cols[k] else "-" for k in cols),
        )
    console.print(c)

    sc = doc["scaling"]
    if any(len(v["runs"]) > 1 for v in sc.values()):
        s = Table(
            title=f"Scaling: cost per item across N and processes (flat = within {FLAT_WITHIN:.0%})"
        )
        for col in (
            "contender",
            "runs (N × P)",
            "CPU µs/item",
            "spread",
            "cmds / 1k items",
            "spread",
        ):
            s.add_column(col, justify="left" if col.startswith(("contender", "runs")) else "right")
        for name, v in sc.items():
            if len(v["runs"]) < 2:
                continue
            runs = ", ".join(f"{x['n']:,}×{x['procs']}" for x in v["runs"])
            cpu, cmd = v["cpu_us_per_item"], v["commands_per_1000_items"]
            s.add_row(
                name, runs, f"{_fmt_num(cpu['min'])} – {_fmt_num(cpu['max'])}", _fmt_spread(cpu["spread"]),
                f"{_fmt_num(cmd['min'])} – {_fmt_num(cmd['max'])}", _fmt_spread(cmd["spread"]),
            )  # fmt: skip
        console.print(s)

    costs = doc.get("write_concern_cost") or []
    if costs:
        w = Table(
            title="What the journal costs: durable (j: true, the default) beside w:1 without j "
            "(the old default), same run"
        )
        for col in ("queue", "N", "P", "push/s durable", "push/s w:1", "durable / w:1",
                    "end-to-end/s durable", "end-to-end/s w:1", "durable / w:1",
                    "cmds/1k durable"):  # fmt: skip
            w.add_column(col, justify="left" if col == "queue" else "right")
        for row in costs:
            push, e2e = row["push_per_s"], row["end_to_end_per_s"]
            w.add_row(
                row["queue"], f"{row['n']:,}", str(row["procs"]),
                f"{push['durable']:,.0f}", f"{push['w1']:,.0f}", _fmt_share(push["durable_vs_w1"]),
                f"{e2e['durable']:,.0f}", f"{e2e['w1']:,.0f}", _fmt_share(e2e["durable_vs_w1"]),
                _fmt_num(row["commands_per_1000_items"]["durable"]),
            )  # fmt: skip
        console.print(w)

    for t in doc.get("partition_targets") or []:
        console.print(
            f"Partitioned ({t['partitions']} partitions), {t['contender']}, N={t['n']:,}: "
            f"{t['procs']}+{t['procs']} end to end {t['end_to_end_vs_1_1']:.2f}x 1+1 "
            f"(target >= {t['end_to_end_target']:g}x: {'met' if t['end_to_end_met'] else 'MISSED'}); "
            f"{t['commands_per_1000']:.2f} commands per 1,000 items (target <= "
            f"{t['commands_target']:g}: {'met' if t['commands_met'] else 'MISSED'})"
        )

    pl = doc["payload"]
    print_environment(
        console,
        doc,
        f"BSON floor: {floor_us:.2f} µs/item. Payload: {pl['bytes_json']} bytes as JSON, "
        f"{pl['bytes_bson']} as BSON. ",
    )
    for f in doc["settings"].get("failed_runs") or []:
        console.print(f"[red]FAILED: {f['contender']} N={f['n']:,} P={f['procs']}: {f['error']}[/]")
