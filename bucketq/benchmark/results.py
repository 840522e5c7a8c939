"""``bucketq bench report``: the results page (``docs/results.md``) from the JSON files the
benchmarks wrote (``bucketq bench ... --json PATH``, ``python bench/spark_bench.py --json
PATH``), one section per benchmark, with the version, the machine and its load in its
header. The page is generated, never edited: the figures live in one place.

    bucketq bench report queue.json ingest.json sdk.json ... > docs/results.md
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._sections import RENDERERS, table

#: The sections in page order: (kind, heading). The headings' anchors are linked from the
#: README and the docs (``results.md#queue-lifecycle``, ...): keep them.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("queue", "Queue lifecycle"),
    ("journal", "Journal cost"),
    ("keuss", "Against keuss"),
    ("ingest", "Ingest"),
    ("limits", "Ingest limits"),
    ("logs", "Log store reads"),
    ("sdk", "Logging SDK"),
    ("stream-wake", "Stream wake-up"),
    ("spark", "Spark"),
    ("celery", "Celery broker"),
    ("worker", "Worker overhead"),
)


#: The command that makes each section's JSON: what the page says to run for a section
#: it has no figures for (the runs it has show their own command lines).
COMMANDS: dict[str, str] = {
    # The journal's cost has a section of its own: the lifecycle runs durable rows only.
    "queue": "bucketq bench --quick --write-concern durable --json queue.json --no-plots",
    "keuss": "bucketq bench keuss --quick --json keuss.json",
    "ingest": "bucketq bench ingest --quick --redis-url redis://127.0.0.1:6379 "
    "--json ingest.json --no-plots",
    "limits": "bucketq bench ingest --limits --quick --redis-url redis://127.0.0.1:6379 "
    "--json limits.json --no-plots",
    "sdk": "bucketq bench sdk --json sdk.json",
    "stream-wake": "bucketq bench stream-wake --json stream-wake.json",
    "spark": "python bench/spark_bench.py --quick --repeat 3 --json spark.json",
    "celery": "bucketq bench celery --n 1000 --kill-n 100 --json celery.json",
    "worker": "bucketq bench worker --rounds 9 --json worker.json",
    "journal": "bucketq bench --write-concern compare --n 50000 --element-n 200 --procs 1 "
    "--repeat 4 --contender 'bucketq Queue' --contender 'bucketq Queue (w:1)' "
    "--contender 'per-element ElementQueue' --contender 'per-element ElementQueue (w:1)' "
    "--json journal.json --no-plots",
    "logs": "bucketq bench logs --json logs.json",
}


def _journal_run(doc: Mapping[str, Any]) -> bool:
    """A queue benchmark run to compare write concerns: given ``--write-concern compare``
    on its command line, or running nothing but queues and their w:1 twins."""
    st = doc.get("settings") or {}
    if st.get("write_concern") != "compare" or not doc.get("write_concern_cost"):
        return False
    argv = [str(a) for a in st.get("argv") or shlex.split((doc.get("run") or {}).get("argv", ""))]
    pairs = zip(argv, [*argv[1:], ""], strict=True)
    if "--write-concern=compare" in argv or ("--write-concern", "compare") in pairs:
        return True
    from ._contenders import CONTENDERS

    twins = {c.name for c in CONTENDERS.values() if c.twin_of}
    paired = twins | {c.twin_of for c in CONTENDERS.values() if c.twin_of}
    names = set(st.get("contenders") or ())
    return bool(names & twins) and names <= paired


def kind(doc: Mapping[str, Any]) -> str:
    """Which benchmark wrote ``doc``."""
    schema = str(doc.get("schema", ""))
    if schema.startswith("bucketq-bench-ingest"):
        return "limits" if schema.endswith("+limits") else "ingest"
    if schema.startswith("bucketq-bench/"):
        return "journal" if _journal_run(doc) else "queue"
    command = str((doc.get("run") or {}).get("command", ""))
    for k, _ in SECTIONS:
        if command.endswith(f"bench {k}"):
            return k
    if "spark_bench" in command or "targets" in doc:
        return "spark"
    if "delivery" in doc and "cases" in doc:
        return "sdk"
    if "modes" in doc:
        return "stream-wake"
    if "summary" in doc and "rounds" in doc:
        return "keuss"
    if "sizes" in doc and "load_average_start" in doc:
        return "logs"
    raise ValueError("not the JSON of a bucketq benchmark (no schema or run.command it knows)")


def _when(run: Mapping[str, Any]) -> str:
    start, end = run.get("started_at"), run.get("ended_at")
    if not start:
        return "time not recorded"
    day, t0 = start[:10], start[11:16]
    t1 = end[11:16] if end else "?"
    return f"{day} {t0}-{t1} UTC"


def _load(run: Mapping[str, Any]) -> str:
    load = run.get("load_1m") or {}
    if not load:
        return "load not recorded"
    return (
        f"1-minute load average {load.get('before')} before, "
        f"{load.get('min')}-{load.get('max')} during (its own processes included)"
    )


def _run_line(doc: Mapping[str, Any], source: str | None = None) -> list[str]:
    run = doc.get("run") or {}
    argv = _short_argv(doc) if run.get("argv") else run.get("command", "?")
    # A JSON file kept under docs/ is part of the site: the page links to it.
    every = (
        f" Every figure: [{Path(source).name}]({source[5:]})."
        if source and source.startswith("docs/")
        else ""
    )
    return [f"`{argv}`: {_when(run)}, {_load(run)}.{every}", ""]


def _server(doc: Mapping[str, Any]) -> str | None:
    env = doc.get("environment") or doc.get("env") or {}
    server = env.get("server")
    if isinstance(server, Mapping):
        return str(server.get("description"))
    return str(env.get("mongodb") or env.get("server") or "") or None


# -- the page ------------------------------------------------------------------------------


def _gib(b: Any) -> str:
    return "?" if not b else f"{b / 2**30:.1f} GiB"


def header(docs: Sequence[Mapping[str, Any]], note: str | None = None) -> list[str]:
    machines = {json.dumps(d.get("machine"), sort_keys=True) for d in docs if d.get("machine")}
    versions = set()
    for d in docs:
        b = (d.get("run") or {}).get("bucketq") or {}
        v = b.get("version") or ((d.get("environment") or {}).get("versions") or {}).get("bucketq")
        versions.add(f"{v or '?'}" + (f" (commit {b['commit']})" if b.get("commit") else ""))
    servers = sorted({s for s in (_server(d) for d in docs) if s})
    if any(s.startswith("SecantusDB") for s in servers):  # the same server, described once
        servers = [s for s in servers if not s.startswith("embedded SecantusDB")]
    runs = [d.get("run") or {} for d in docs]
    starts = sorted(r["started_at"] for r in runs if r.get("started_at"))
    ends = sorted(r["ended_at"] for r in runs if r.get("ended_at"))
    before = [
        r["load_1m"]["before"] for r in runs if (r.get("load_1m") or {}).get("before") is not None
    ]
    during = [x for r in runs for x in ((r.get("load_1m") or {}).get("min"), (r.get("load_1m") or {}).get("max")) if x is not None]  # fmt: skip
    rows = [["bucketq", ", ".join(sorted(versions))]]
    for m in (json.loads(x) for x in sorted(machines)):
        rows.append(["machine", f"{m.get('cpu_model')}, {m.get('cores')} cores, "
                     f"{_gib(m.get('memory_bytes'))} memory; {m.get('platform')}; "
                     f"Python {m.get('python')}"])  # fmt: skip
    if servers:
        rows.append(["MongoDB", "; ".join(servers)])
    if starts:
        last = (ends or starts)[-1]
        until = last[11:16] if last[:10] == starts[0][:10] else last[:16].replace("T", " ")
        rows.append(["runs", f"{starts[0][:16].replace('T', ' ')} to {until} UTC, one after "
                     "the other"])  # fmt: skip
    if before or during:
        rows.append(["load", f"1-minute load average {min(before, default='?')}-"
                     f"{max(before, default='?')} before each run, {min(during, default='?')}-"
                     f"{max(during, default='?')} during the runs (their own processes included)"])  # fmt: skip
    out = [
        "# Results",
        "",
        "<!-- Generated by `bucketq bench report`: do not edit. Run the benchmarks and "
        "regenerate it (see the end of this page). -->",
        "",
        "Every figure bucketq's docs quote, from one set of runs, generated from the "
        "benchmarks' JSON by `bucketq bench report`. Absolute figures depend on the machine, "
        "its load and the server; the ratios between contenders in one run are what carries "
        "over. [Where the time goes](performance.md) explains what limits each figure.",
        "",
        *table(["", ""], rows, [False, False]),
    ]
    if note:
        out += ["", f"> {note}"]
    return out


def _json_of(command: str) -> str | None:
    """The name of the JSON file ``command`` writes (its ``--json``), without its folder."""
    argv = shlex.split(command)
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--json":
            return Path(value).name
    return None


def _json_name(doc: Mapping[str, Any]) -> str:
    """The name of the JSON file the run wrote, without its folder."""
    return _json_of((doc.get("run") or {}).get("argv", "")) or f"{kind(doc)}.json"


def _short_argv(doc: Mapping[str, Any]) -> str:
    """The run's command line with its JSON file named without its folder."""
    argv = shlex.split((doc.get("run") or {}).get("argv", "") or "?")
    out = [Path(b).name if a == "--json" else b for a, b in zip(["", *argv], argv, strict=False)]
    return shlex.join(out)


def render(
    docs: Sequence[Mapping[str, Any]], note: str | None = None, sources: Sequence[str] = ()
) -> str:
    """The results page for ``docs`` (the benchmarks' JSON documents; ``sources``: the
    files they were read from, as the command that made the page named them)."""
    by_kind: dict[str, list[tuple[Mapping[str, Any], str | None]]] = {}
    for i, d in enumerate(docs):
        by_kind.setdefault(kind(d), []).append((d, sources[i] if i < len(sources) else None))
    out = header(docs, note)
    missing = [k for k, _ in SECTIONS if k not in by_kind]
    for k, heading in SECTIONS:
        for d, source in by_kind.get(k, []):
            out += ["", f"## {heading}", "", *_run_line(d, source), *RENDERERS[k](d)]
        if k in missing:  # the heading stays, for the links to it
            out += ["", f"## {heading}", "", f"Not in this set of runs: `{COMMANDS[k]}` makes "
                    "its JSON (see the end of this page)."]  # fmt: skip
    out += [
        "",
        "## Regenerate",
        "",
        "```sh",
        *[_short_argv(d) for d in docs],
        *[COMMANDS[k] for k in missing],
        "bucketq bench report "
        + " ".join(sources or [_json_name(d) for d in docs])
        + (" --note '...'" if note else "")
        + " > docs/results.md",
        "```",
    ]
    if missing:
        out += ["", "Add the JSON of the sections without figures ("
                + ", ".join(f"`{_json_of(COMMANDS[k])}`" for k in missing)
                + ") to the report's files."]  # fmt: skip
    return "\n".join(out) + "\n"


def main(paths: Sequence[str], note: str | None = None) -> str:
    docs = []
    for p in paths:
        try:
            docs.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"{p}: cannot read it as a benchmark's JSON ({exc})") from None
    return render(docs, note, paths)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from .cli import add_bench_parser

    p = add_bench_parser(sub, "report", "the results page (docs/results.md) from the JSON "
                         "files of earlier runs", __doc__)  # fmt: skip
    p.add_argument("json", nargs="+", metavar="JSON", help="a benchmark's --json file")
    p.add_argument("--note", help="a paragraph for the page's header (e.g. what else ran)")

    def run_from_args(args: argparse.Namespace) -> int:
        import sys

        try:
            sys.stdout.write(main(args.json, args.note))
        except (RuntimeError, ValueError) as exc:
            print(f"bucketq bench report: {exc}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(func=run_from_args)
    return p


__all__ = ["COMMANDS", "SECTIONS", "add_parser", "kind", "main", "render"]
