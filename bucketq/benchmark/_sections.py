"""The results page's sections: one renderer per benchmark, each turning the JSON of a run
into its figures (tables beside their targets), and the formatting they share."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# -- formatting ---------------------------------------------------------------------------


def _n(x: Any, digits: int = 0) -> str:
    """A figure for a table: thousands separated, ``-`` when missing."""
    if x is None:
        return "-"
    if isinstance(x, int) or digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _ratio(x: Any) -> str:
    return (
        "-" if x is None else (f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x" if x < 10 else f"{x:.1f}x")
    )


def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(head) + " |"]
    out.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


# -- one renderer per benchmark ------------------------------------------------------------


def _queue(doc: Mapping[str, Any]) -> list[str]:
    env, st = doc.get("environment", {}), doc.get("settings", {})
    floor = doc.get("floor_us_per_item")
    out = [
        f"{len(doc.get('runs', []))} runs, each contender's N items pushed by P producer "
        "processes until stored, then reserved and committed by P consumer processes; "
        f"payload {doc.get('payload', {}).get('bytes_bson', '?')} bytes of BSON; write concern "
        f"{env.get('write_concern', '?')}; the BSON floor (encode + decode of each payload "
        f"once) {_n(floor, 2)} µs/item. Medians of {st.get('repeat', 1)} repetition(s).",
        "",
    ]
    rows = []
    for m in doc.get("medians", []):
        rows.append([
            m["contender"], _n(m["n"]), str(m["producers"]), _n(m["push_per_s"]),
            _n(m["consume_per_s"]), _n(m["end_to_end_per_s"]),
            _ratio(m.get("end_to_end_vs_fastest_per_element")),
            _n(m["commands_per_1000_items"], 2), _n(m["cpu_us_per_item"], 1),
            _ratio(m.get("cpu_vs_floor")), "yes" if m.get("items_ok") else "**no**",
        ])  # fmt: skip
    out += table(
        ["contender", "N", "P", "push/s", "consume/s", "end-to-end/s", "vs per-element",
         "commands / 1k items", "client CPU µs/item", "vs floor", "items back once"],
        rows, [False] + [True] * 9 + [False],
    )  # fmt: skip
    out += [
        "",
        "vs per-element: end-to-end items/s over the fastest one-document-per-item "
        "contender's at the same P in the same run (under the same write concern). Client "
        "CPU: every producer's and consumer's process CPU over N. Items back once: every "
        "item pushed came back exactly once and the queue was left empty.",
    ]
    costs = doc.get("write_concern_cost") or []
    if costs:
        out += ["", "What the journal costs: each queue durable (the default, `j: true`) beside "
                "`w: 1` without `j` (the old default), in the same run:", ""]  # fmt: skip
        out += table(
            ["queue", "N", "P", "push/s durable", "push/s w:1", "durable / w:1",
             "end-to-end/s durable", "end-to-end/s w:1", "durable / w:1"],
            [[c["queue"], _n(c["n"]), str(c["procs"]),
              _n(c["push_per_s"]["durable"]), _n(c["push_per_s"]["w1"]),
              _ratio(c["push_per_s"]["durable_vs_w1"]),
              _n(c["end_to_end_per_s"]["durable"]), _n(c["end_to_end_per_s"]["w1"]),
              _ratio(c["end_to_end_per_s"]["durable_vs_w1"])] for c in costs],
            [False] + [True] * 8,
        )  # fmt: skip
    notes = doc.get("notes") or []
    if notes:
        out += ["", *[f"- {n}" for n in notes]]
    return out


def _journal(doc: Mapping[str, Any]) -> list[str]:
    from ._contenders import WEAK_LABEL as WEAK

    st = doc.get("settings", {})
    medians = {(m["contender"], m["n"], m["producers"]): m for m in doc.get("medians", [])}
    out = [
        "bucketq's `Queue` and the per-element `ElementQueue`, each durable (the default: "
        "`j: true` added to the database's write concern, so a write is acknowledged once it "
        "is in the journal) beside `w: 1` without `j` (the old default, acknowledged from "
        "memory), in the same groups on the same server; medians of "
        f"{st.get('repeat', 1)} repetition(s), each pair trading places every other one. "
        "bucketq waits for the journal once per bucket insert and state flush, a "
        "per-element queue once per insert, claim and delete of every item.",
        "",
    ]

    def pair(c: Mapping[str, Any], f: str, digits: int = 0) -> list[str]:
        return [_n(c[f]["durable"], digits), _n(c[f]["w1"], digits), _ratio(c[f]["durable_vs_w1"])]

    rows = []
    for c in doc.get("write_concern_cost") or []:
        rows.append([c["queue"], _n(c["n"]), str(c["procs"]), *pair(c, "push_per_s"),
                     *pair(c, "end_to_end_per_s"), *pair(c, "cpu_us_per_item", 1),
                     _n(c["commands_per_1000_items"]["durable"], 2)])  # fmt: skip
    out += table(
        ["queue", "N", "P", "push/s durable", "push/s w:1", "durable / w:1",
         "end-to-end/s durable", "end-to-end/s w:1", "durable / w:1",
         "client CPU µs/item durable", "w:1", "durable / w:1", "commands / 1k items"],
        rows, [False] + [True] * 12,
    )  # fmt: skip
    spread = []
    for c in doc.get("write_concern_cost") or []:
        durable = medians.get((c["queue"], c["n"], c["procs"]))
        weak = medians.get((f"{c['queue']} ({WEAK})", c["n"], c["procs"]))
        parts = []
        for label, m in (("durable", durable), ("w:1", weak)):
            values = ((m or {}).get("repetitions") or {}).get("push_per_s", {}).get("values") or []
            if len(values) > 1:
                parts.append(f"{label} {_n(min(values))}-{_n(max(values))}")
        if parts:
            spread.append(f"{c['queue']} {', '.join(parts)}")
    if spread:
        out += ["", f"Push/s over the repetitions: {'; '.join(spread)}."]
    sent: dict[str, set[str]] = {}
    for r in doc.get("runs", []):
        sent.setdefault(r.get("write_concern", "?"), set()).update(
            r.get("write_concerns_sent") or {}
        )
    if sent:
        said = "; ".join(f"{wc} rows {', '.join(f'`{x}`' for x in sorted(xs))}"
                         for wc, xs in sorted(sent.items()))  # fmt: skip
        out += ["", f"The write concern every write command carried: {said}."]
    return out


def _ingest(doc: Mapping[str, Any]) -> list[str]:
    st = doc.get("settings", {})
    modes = doc.get("modes") or {}
    if not modes:
        return ["(no modes in this run: see its JSON)"]
    seed = (doc.get("seed_p95_ms") or {}).get("MongoDB", {})
    out = [
        f"Open-loop load on `POST /api/v1/ingest`: {_n(st.get('rate'))} requests/s of "
        f"{st.get('batch')} log records for {_n(st.get('duration'))} s per mode, each latency "
        "from its scheduled send time; one `bucketq serve` process per mode on a fresh "
        "database of the same server.",
        "",
    ]
    layouts = any("@" in name for name in modes)
    rows = []
    for name, m in modes.items():
        load, e2e = m.get("load") or {}, m.get("end_to_end") or {}
        lat, lag = load.get("latency") or {}, load.get("lag") or {}
        accepted = load.get("records_accepted")
        stored = m.get("records_stored")
        rows.append([
            _mode(name, layouts), _n(load.get("requests")), _n(load.get("errors")),
            _n(lat.get("p50_ms"), 1), _n(lat.get("p95_ms"), 1), _n(lat.get("p99_ms"), 1),
            f"{_n(accepted)} = {_n(stored)}" if accepted == stored else f"{_n(accepted)} ≠ {_n(stored)}",
            f"{_n(e2e.get('p50_ms'), 1)} / {_n(e2e.get('p95_ms'), 1)}",
            f"{(m.get('api_cpu_share') or 0):.0%}", _n(m.get("commands_per_request"), 2),
            _n(lag.get("p99_ms"), 1), _n(seed.get(name)),
        ])  # fmt: skip
    out += table(
        ["mode", "requests", "errors", "p50 ms", "p95 ms", "p99 ms", "accepted = stored",
         "end-to-end p50 / p95 ms", "API CPU", "MongoDB commands / request",
         "generator lag p99 ms", "seed's p95 ms (MongoDB)"],
        rows, [False, True, True, True, True, True, False, True, True, True, True, True],
    )  # fmt: skip
    if layouts:
        out += ["", *_layouts(modes)]
    targets = doc.get("targets") or []
    if targets:
        out += ["", "Targets:", ""]
        for t in targets:
            met = {True: "met", False: "**missed**", None: "not run or not comparable"}[
                t.get("met")
            ]
            figs = ", ".join(f"{k} {_fig(v)}" for k, v in (t.get("figures") or {}).items())
            out.append(f"- {t.get('target')}: {met} ({figs})")
    notes = doc.get("notes") or []
    if notes:
        out += ["", *[f"- {n}" for n in notes]]
    return out


def _limits(doc: Mapping[str, Any]) -> list[str]:
    from .ingest._limits import (
        API_CPU_TARGET_US,
        CAPACITY_BATCH,
        CAPACITY_P95_MS,
        GOOD_BATCH,
        GOOD_RATE,
        HEALTH_MS,
        HOSTILE_RATIO_TARGET,
        INGEST_TIMEOUT_MS,
        STORE_CPU_TARGET_US,
        hostile_ok,
    )

    lim = doc.get("limits") or {}
    st = doc.get("settings") or {}
    cap, over, host = (lim.get(k) or {} for k in ("capacity", "overload", "hostile"))
    layouts = any("@" in m for m in (*cap, *host))
    out = [
        f"`POST /api/v1/ingest` at and past its limits, one `bucketq serve` per run on a fresh "
        f"database. Capacity: {CAPACITY_BATCH} records per request, the rate doubled while a "
        f"{_n(st.get('step_duration'))} s run is sustained (no error, p95 under "
        f"{CAPACITY_P95_MS:g} ms, every accepted record stored), then once halfway to the first "
        "that was not.",
        "",
    ]

    def within(x: Any, target: float) -> str:
        return "-" if x is None else f"{x:.1f} ({'met' if x <= target else '**missed**'})"

    rows = [[_mode(m, layouts), _n(c.get("records_per_s")), _n(c.get("rate")),
             within(c.get("api_cpu_us_per_record"), API_CPU_TARGET_US),
             within(c.get("store_cpu_us_per_record"), STORE_CPU_TARGET_US),
             str(c.get("limited_by", "-")), _n(len(c.get("steps") or ()))]
            for m, c in cap.items()]  # fmt: skip
    if rows:
        out += table(
            ["mode", "records/s sustained", "requests/s", "API CPU µs/record (target ≤ "
             f"{API_CPU_TARGET_US:g})", f"store CPU µs/record (target ≤ {STORE_CPU_TARGET_US:g})",
             "limited by", "runs"],
            rows, [False, True, True, True, True, False, True],
        )  # fmt: skip
    bound_s = 2 * INGEST_TIMEOUT_MS / 1000

    def ok(flag: Any) -> str:
        return "yes" if flag else "**no**"

    rows = []
    for m, o in over.items():
        health = o.get("health") or {}
        rows.append([_mode(m, layouts), _n(o.get("rate")), _n(o.get("requests")),
                     _n(o.get("accepted")), _n(o.get("refused")),
                     _n(o.get("refused_without_retry_after")),
                     _n(sum((o.get("other_errors") or {}).values())),
                     f"{_n((o.get('max_ms') or 0) / 1000, 2)} ({ok(o.get('answered_in_time'))})",
                     ok(o.get("stored_ok")),
                     f"{_n(health.get('max_ms'), 1)} ({ok(o.get('health_in_time'))})"])  # fmt: skip
    if rows:
        out += [
            "",
            f"Overload: {_n(st.get('overload_duration'))} s at twice that capacity. Every "
            f"request answered within {bound_s:g} s (twice `BUCKETQ_INGEST_TIMEOUT_MS`), the "
            f"excess refused with 503/429 and `Retry-After`, every accepted record stored, "
            f"`/health` answered within {HEALTH_MS:g} ms throughout:",
            "",
            *table(
                ["mode", "requests/s", "requests", "accepted", "refused (503/429)",
                 "refused without Retry-After", "other errors", "slowest answer s (in time)",
                 "stored = accepted", "/health max ms (in time)"],
                rows, [False, True, True, True, True, True, True, True, False, True],
            ),
        ]  # fmt: skip
    rows = []
    for m, h in host.items():
        a, b, pr = h.get("alone") or {}, h.get("beside") or {}, h.get("pair_ratio")
        ratio = h.get("ratio")
        n = h.get("windows") or {}
        rows.append([_mode(m, layouts), _n(a.get("p99_ms"), 1), _n(b.get("p99_ms"), 1),
                     f"{_ratio(ratio)} ({'met' if hostile_ok(ratio) else '**missed**'})",
                     "-" if not pr else f"{_ratio(pr['min'])}-{_ratio(pr['max'])}",
                     f"{_n(n.get('alone'))} / {_n(n.get('hostile'))}",
                     f"{_n(a.get('errors'))} / {_n(b.get('errors'))}",
                     f"{_n(h.get('hostile_windows_with_every_case'))} of {_n(n.get('hostile'))}"])  # fmt: skip
    if rows:
        window = next(iter(host.values())).get("window_s")
        out += [
            "",
            f"Hostile neighbour: {GOOD_RATE:g} requests/s of {GOOD_BATCH} records for "
            f"{_n(st.get('hostile_duration'))} s (latency from the scheduled send) while huge "
            "bodies of tiny records, deep nesting, a huge OTLP body, silent sockets and "
            f"slow-header clients are switched on and off in alternate {window:g} s windows; "
            f"the good traffic's p99 in the hostile windows within {HOSTILE_RATIO_TARGET:g}x "
            "its p99 in the quiet ones:",
            "",
            *table(
                ["mode", "quiet p99 ms", "hostile p99 ms", "hostile / quiet", "per pair",
                 "windows quiet / hostile", "good errors quiet / hostile",
                 "hostile windows with every case"],
                rows, [False, True, True, False, False, True, True, True],
            ),
        ]  # fmt: skip
    return out or ["(nothing measured in this run: see its JSON)"]


_MODE = {"off": "buffer off", "memory": "memory buffer", "redis": "redis buffer",
         "bucketq": "bucketq buffer", "passthrough": "passthrough"}  # fmt: skip


def _mode(name: str, layouts: bool) -> str:
    """A mode's label; with ``layouts`` (a run of both), its layout too."""
    base, _, layout = name.partition("@")
    label = _MODE.get(base, base)
    return f"{label}, {layout or 'buckets'}" if layouts else label


def _layouts(modes: Mapping[str, Any]) -> list[str]:
    """Each mode in the bucketed log store beside the same mode one document per record."""

    def figures(m: Mapping[str, Any]) -> list[str]:
        load = m.get("load") or {}
        lat = load.get("latency") or {}
        return [_n(lat.get("p95_ms"), 1), _n(lat.get("p99_ms"), 1), _n(load.get("errors")),
                f"{(m.get('api_cpu_share') or 0):.0%}", _n(m.get("store_cpu_us_per_record"), 1),
                _n(m.get("commands_per_request"), 2)]  # fmt: skip

    rows = []
    for name, new in modes.items():
        old = modes.get(f"{name}@documents")
        if "@" in name or old is None:
            continue
        pairs = zip(figures(new), figures(old), strict=True)
        rows.append([_MODE.get(name, name), *(f"{a} / {b}" for a, b in pairs)])
    if not rows:
        return []
    out = ["The log layouts side by side, buckets (records packed many to a document, the "
           "default) / one document per record (`BUCKETQ_LOG_LAYOUT=documents`, the layout "
           "of releases before the bucketed log store), each mode on the same server:", ""]  # fmt: skip
    return out + table(["mode", "p95 ms", "p99 ms", "errors", "API CPU",
                         "store CPU µs/record", "MongoDB commands / request"], rows,
                        [False] + [True] * 6)  # fmt: skip


def _fig(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def _logs(doc: Mapping[str, Any]) -> list[str]:
    from .logs import BUILD_BUCKET, BUILD_RATE

    st = doc.get("settings") or {}
    sizes = doc.get("sizes") or {}
    out = [
        f"Projects of {', '.join(_n(int(n)) for n in sizes)} records on {doc.get('server', '?')}, "
        f"built straight from bucket documents ({BUILD_BUCKET} records each, {_n(BUILD_RATE)} "
        "records a second ending now), then each read timed "
        f"{st.get('repeat', '?')} times (the 11th page and the count fewer): median / p95 ms, "
        "and the buckets it read. A read costs what its page costs, not what the project "
        "holds: the figures should stay flat as the project grows.",
        "",
    ]
    reads = list(dict.fromkeys(r for size in sizes.values() for r in size.get("reads") or {}))
    rows = []
    for r in reads:
        row = [r]
        for size in sizes.values():
            f = (size.get("reads") or {}).get(r)
            if f is None:
                row.append("-")
                continue
            cell = f"{_n(f.get('median_ms'), 1)} / {_n(f.get('p95_ms'), 1)}"
            if "buckets_read" in f:
                b = f["buckets_read"]
                cell += f" ({_n(b)} bucket{'' if b == 1 else 's'})"
            row.append(cell)
        rows.append(row)
    out += table(["read", *(f"{_n(int(n))} records" for n in sizes)], rows,
                  [False] + [True] * len(sizes))  # fmt: skip
    built = ", ".join(f"{_n(int(n))} in {size['build']['seconds']} s"
                      for n, size in sizes.items() if size.get("build"))  # fmt: skip
    if built:
        out += ["", f"Built (bucket inserts, indexes in place): {built}."]
    nb = doc.get("neighbour")
    if nb:
        ratio = nb.get("p99_ratio")
        readers = nb.get("reader_clients", st.get("readers", "?"))
        out += [
            "",
            f"A neighbour project ingests {_n(nb.get('rate'))} requests/s of "
            f"{nb.get('batch', '?')} records through `bucketq serve` (open loop, latency from "
            f"the scheduled send) for {_n(nb.get('window_s'))} s while nobody reads, then for "
            f"as long while {readers} clients read the "
            f"{_n(nb.get('big_project_records'))}-record project's pages as fast as they are "
            "answered:",
            "",
        ]
        prow = []
        for phase, label in (("quiet", "quiet"), ("readers", f"{readers} readers")):
            p = nb.get(phase) or {}
            answers = ", ".join(
                f"{k}: {_n(v)}" for k, v in sorted((p.get("read_status") or {}).items())
            )
            prow.append([label, _n(p.get("n")), _n(p.get("errors")), _n(p.get("p50_ms"), 1),
                         _n(p.get("p95_ms"), 1), _n(p.get("p99_ms"), 1),
                         _n(p.get("reads")) if phase == "readers" else "",
                         answers])  # fmt: skip
        out += table(["neighbour's ingest", "requests", "errors", "p50 ms", "p95 ms", "p99 ms",
                       "reads of the large project", "their answers"], prow,
                      [False, True, True, True, True, True, True, False])  # fmt: skip
        if ratio is not None:
            met = "met" if ratio <= 2 else "**missed**"
            out += ["", f"The neighbour's p99 with readers / quiet: {_ratio(ratio)} "
                    f"(target ≤ 2x: {met})."]  # fmt: skip
    return out


def _sdk(doc: Mapping[str, Any]) -> list[str]:
    from .sdk import LABELS, P99_TARGET

    cases = doc.get("cases") or {}
    env = doc.get("env") or {}
    http = cases.get("http")
    out = [
        f"The cost to the caller of one `logger.info(...)` call in a hot loop, medians of "
        f"{env.get('rounds', '?')} rounds (each round's range in brackets), `bucketq serve` with "
        "the bucketq buffer on the same machine.",
        "",
    ]

    def rng(c: Mapping[str, Any], f: str, digits: int = 1) -> str:
        lo, hi = c.get(f + "_range") or (None, None)
        return f"{_n(c.get(f), digits)} ({_n(lo, digits)}-{_n(hi, digits)})"

    rows = []
    for case, c in cases.items():
        vs_file = ""
        if "p99_vs_file" in c:
            met = "met" if c["p99_vs_file"] <= P99_TARGET else "**missed**"
            vs_file = f"{rng(c, 'p99_vs_file', 2)}, target {P99_TARGET}x: {met}"
        vs_http = _ratio(http["p99_us"] / c["p99_us"]) if http and case != "http" else ""
        rows.append([LABELS.get(case, case), _n(c.get("n")), rng(c, "p50_us"), rng(c, "p99_us"),
                     vs_file, rng(c, "p999_us", 0), rng(c, "max_us", 0),
                     rng(c, "caller_cpu_us_per_call"), vs_http])  # fmt: skip
    out += table(
        ["case", "calls", "p50 µs", "p99 µs", "p99 / FileHandler's", "p99.9 µs", "max µs",
         "caller CPU µs/call", "HTTPHandler's p99 / this"],
        rows, [False, True, True, True, False, True, True, True, True],
    )  # fmt: skip
    d, c = doc.get("delivery"), doc.get("ceiling")
    if d:
        out += ["", f"Delivery: {_n(d.get('n'))} records reached the server at "
                f"{_n(d.get('records_per_s'))} records/s end to end ({_n(d.get('via_spill'))} "
                "through the spill and its replay)."]  # fmt: skip
    if c:
        out.append(f"The server's ceiling, two threads POSTing batches directly: "
                   f"{_n(c.get('records_per_s'))} records/s.")  # fmt: skip
    return out


def _keuss(doc: Mapping[str, Any]) -> list[str]:
    s = doc.get("summary") or {}
    env = doc.get("env") or {}
    versions = env.get("versions") or {}
    names = {"push": "push/s", "consume": "consume/s", "e2e": "end-to-end/s"}
    out = [
        f"bucketq's `Queue` (one item at a time) against keuss {versions.get('keuss', '?')}'s "
        f"`bucket-mongo-safe` (node {versions.get('node', '?')}) on the same server, "
        f"{_n(doc.get('n'))} items per round, bucketq then keuss in each round.",
        "",
    ]
    rows = []
    for i, p in enumerate(s.get("per_round") or []):
        for f in names:
            rows.append([str(i + 1), names[f], _n(p["bucketq"][f]), _n(p["keuss"][f]),
                         _ratio(p["ratio"][f]), _n(p.get("load"), 1)])  # fmt: skip
    m = s.get("median")
    if m:
        for f in names:
            rows.append(["median", names[f], _n(m["bucketq"][f]), _n(m["keuss"][f]),
                         f"**{_ratio(m['ratio'][f])}**", ""])  # fmt: skip
        out += table(["round", "figure", "bucketq items/s", "keuss items/s", "bucketq / keuss",
                       "load (1 min)"], rows, [False, False, True, True, True, True])  # fmt: skip
        floor = s.get("floor_us")
        cpu = [f"Client CPU per item: bucketq {_n(m['bucketq'].get('cpu_us'), 2)} µs "
               f"(the BSON floor {_n(floor, 2)} µs), keuss (node) {_n(m['keuss'].get('cpu_us'), 2)} µs"]  # fmt: skip
        if "server_cpu_us" in m["bucketq"] and "server_cpu_us" in m["keuss"]:
            cpu.append(f"; the embedded server's CPU per item: bucketq "
                       f"{_n(m['bucketq']['server_cpu_us'], 2)} µs, keuss "
                       f"{_n(m['keuss']['server_cpu_us'], 2)} µs")  # fmt: skip
        out += ["", "".join(cpu) + " (medians)."]
    return out


def _stream_wake(doc: Mapping[str, Any]) -> list[str]:
    env = doc.get("env") or {}
    gap = env.get("gap_s") or ["?", "?"]
    out = [
        f"A producer in another process pushes {env.get('n', '?')} buckets one at a time, "
        f"{gap[0]}-{gap[1]} s apart, while a stream consumer waits in `next_batch`: "
        "milliseconds until `next_batch` returns each bucket.",
        "",
    ]
    rows = []
    for mode, r in (doc.get("modes") or {}).items():
        a, b = r.get("from_receipt") or {}, r.get("from_push") or {}
        label = {"change-stream": "change stream", "polling": "polling (`change_streams=False`)",
                 "same-process": "a push through the same stream object"}.get(mode, mode)  # fmt: skip
        if r.get("change_stream_fallbacks"):
            label += " (no change streams: polled)"
        rows.append([label, _n(r.get("n")),
                     " / ".join(_n(a.get(k), 1) for k in ("p50_ms", "p95_ms", "max_ms")),
                     " / ".join(_n(b.get(k), 1) for k in ("p50_ms", "p95_ms", "max_ms"))])  # fmt: skip
    out += table(["woken by", "buckets", "receipt → next_batch p50 / p95 / max ms",
                   "push → next_batch p50 / p95 / max ms"], rows, [False, True, True, True])  # fmt: skip
    return out


_SPARK_ROWS = (
    ("push", "push (not Spark)"),
    ("stream_to_parquet", "stream → Parquet (the query's start included)"),
    ("batch_to_parquet", "batch → Parquet"),
    ("floor_python_stream", "floor: a minimal Python stream source → Parquet"),
    ("floor_python_batch", "floor: a minimal Python batch source → Parquet"),
    ("floor_memory", "floor: Spark's own memory → Parquet"),
)


def _spark(doc: Mapping[str, Any]) -> list[str]:
    env = doc.get("env") or {}
    runs = doc.get("runs") or []

    def median(key: str, field: str) -> float | None:
        xs = [r[key][field] for r in runs if key in r and r[key].get(field) is not None]
        return statistics.median(xs) if xs else None

    floor = median("floor_memory", "items_per_s")
    out = [
        f"{_n(env.get('n'))} items (~{env.get('payload_bytes', '?')} bytes of JSON each) through "
        f"the `bucketq` data source on `{env.get('master', '?')}`, PySpark "
        f"{env.get('pyspark', '?')}; medians of {len(runs)} run(s), each contender on the same "
        "rows and server.",
        "",
    ]
    rows = []
    for key, label in _SPARK_ROWS:
        ips = median(key, "items_per_s")
        if ips is None:
            continue
        vs = "" if key == "push" or not floor else _ratio(ips / floor)
        rows.append([label, _n(median(key, "seconds"), 2), _n(ips), vs])
    out += table(["contender", "seconds", "items/s", "vs Spark's memory floor"], rows,
                  [False, True, True, True])  # fmt: skip
    target = (doc.get("targets") or {}).get("stream_to_parquet_items_per_s") or {}
    if target:
        out += ["", f"Stream → Parquet target: {_n(target.get('target'))} items/s for 100,000 "
                "items, medians of 3 runs (`python bench/spark_bench.py --repeat 3`)."]  # fmt: skip
    return out


def _celery(doc: Mapping[str, Any]) -> list[str]:
    from .celery import method, tables

    return [method(dict(doc)), "", *tables(dict(doc))]


def _worker(doc: Mapping[str, Any]) -> list[str]:
    env = doc.get("env") or {}
    out = [
        f"The same {_n(env.get('n'))} stored items consumed by `q.consume(handler, "
        "max_items=N)` and by a hand-written `reserve`/`handler`/`commit` loop, sync and "
        "async, with a handler that only reads the payload; each round both in turn, the "
        f"next round in the other order; medians of {env.get('rounds', '?')} round(s). CPU "
        "is the consuming process's (the queue's own threads included).",
        "",
    ]
    rows = []
    for name, r in (doc.get("contenders") or {}).items():
        vs = cpu = ""
        if "wall_ratio" in r:
            vs = f"{_ratio(r['wall_ratio'])} ({'met' if r.get('met') else 'missed'})"
            cpu = _ratio(r.get("cpu_ratio"))
        rows.append([name, _n(r.get("items_per_s")), _n(r.get("wall_us"), 1),
                     _n(r.get("cpu_us"), 1), vs, cpu])  # fmt: skip
    target = (doc.get("contenders") or {}).get("consume", {}).get("target", 1.10)
    out += table(["contender", "items/s", "wall µs/item", "CPU µs/item",
                   f"time per item vs its loop (target ≤ {target:.2f}x)", "CPU vs its loop"],
                  rows, [False, True, True, True, True, True])  # fmt: skip
    return out


RENDERERS: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
    "queue": _queue,
    "journal": _journal,
    "keuss": _keuss,
    "ingest": _ingest,
    "limits": _limits,
    "logs": _logs,
    "sdk": _sdk,
    "stream-wake": _stream_wake,
    "spark": _spark,
    "celery": _celery,
    "worker": _worker,
}
