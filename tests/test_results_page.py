"""docs/results.md is what ``bucketq bench report`` makes of the JSON kept beside it: the
figures the docs link to live in one generated page, which nobody edits by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bucketq.benchmark.results import COMMANDS, SECTIONS, kind, render

ROOT = Path(__file__).resolve().parents[1]


def test_the_results_page_is_rendered_from_its_json():
    page = (ROOT / "docs" / "results.md").read_text()
    made = re.search(
        r"^bucketq bench report (.+?)( --note '\.\.\.')? > docs/results\.md$", page, re.M
    )
    assert made, "the page's Regenerate section names the JSON it was made from"
    sources = made.group(1).split()
    note = re.search(r"^> (.+)$", page, re.M)
    docs = [json.loads((ROOT / src).read_text()) for src in sources]
    assert render(docs, note.group(1) if note else None, sources) == page, (
        "docs/results.md differs from its JSON: regenerate it with the command at its end"
    )
    for doc in docs:  # each run says where and when it ran
        assert doc["machine"]["cores"] and doc["run"]["load_1m"]["before"] is not None
    assert all(f"\n## {heading}\n" in page for _, heading in SECTIONS)


FIXTURES = Path(__file__).resolve().parent / "results_fixtures"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _section(page: str, heading: str) -> str:
    return page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_journal_cost_and_the_log_store_reads_have_sections():
    journal, logs, layout = (
        _fixture(f) for f in ("journal.json", "logs.json", "ingest-layout.json")
    )
    assert [kind(d) for d in (journal, logs, layout)] == ["journal", "logs", "ingest"]
    page = render([journal, logs, layout])

    cost = _section(page, "Journal cost")
    for c in journal["write_concern_cost"]:  # each queue's durable and w:1 push rates side by side
        row = next(line for line in cost.splitlines() if line.startswith(f"| {c['queue']} |"))
        push = c["push_per_s"]
        assert f"| {push['durable']:,.0f} | {push['w1']:,.0f} |" in row
    assert '`{"j": true}`' in cost and '`{"w": 1}`' in cost

    reads = _section(page, "Log store reads")
    for n in logs["sizes"]:
        assert f"{int(n):,} records" in reads
    newest = next(line for line in reads.splitlines() if line.startswith("| newest page (100) |"))
    assert newest.count(" / ") == len(logs["sizes"])
    ratio = logs["neighbour"]["p99_ratio"]
    assert f"readers / quiet: {ratio:.2f}x" in reads

    ingest = _section(page, "Ingest")
    assert "The log layouts side by side" in ingest
    for mode in ("buffer off", "memory buffer"):
        assert f"| {mode} |" in ingest  # the side-by-side row
        assert f"| {mode}, buckets |" in ingest and f"| {mode}, documents |" in ingest

    regenerate = _section(page, "Regenerate")
    for d in (journal, logs, layout):
        assert d["run"]["argv"].split(" --json ")[0] in regenerate


def test_a_section_without_its_json_says_which_command_makes_it():
    queue = json.loads((ROOT / "docs" / "results" / "queue.json").read_text())
    page = render([queue])
    assert all(f"\n## {heading}\n" in page for _, heading in SECTIONS)  # links keep working
    for k in ("journal", "logs"):
        assert COMMANDS[k] in _section(page, "Regenerate")


def test_only_a_write_concern_comparison_is_the_journal_section():
    journal = _fixture("journal.json")
    argv = [a for a in journal["settings"]["argv"] if a not in ("--write-concern", "compare")]
    quiet = {**journal, "settings": {**journal["settings"], "argv": argv}, "run": {}}
    assert kind(quiet) == "journal"  # nothing but queues and their w:1 twins
    every = {**quiet, "settings": {**quiet["settings"],
                                   "contenders": [*quiet["settings"]["contenders"], "bucketq AsyncQueue"]}}  # fmt: skip
    assert kind(every) == "queue"  # the lifecycle run, its w:1 rows by default
    assert kind(json.loads((ROOT / "docs" / "results" / "queue.json").read_text())) == "queue"


def test_the_ingest_limits_have_a_section_of_their_own():
    limits = json.loads((ROOT / "docs" / "results" / "limits.json").read_text())
    layout = _fixture("ingest-layout.json")
    assert [kind(limits), kind(layout)] == ["limits", "ingest"]
    page = render([layout, limits])
    assert "| buffer off, buckets |" in _section(page, "Ingest")  # the other run stays there
    section = _section(page, "Ingest limits")
    lines = section.splitlines()
    labels = {"off": "buffer off", "memory": "memory buffer", "redis": "redis buffer",
              "bucketq": "bucketq buffer"}  # fmt: skip
    lim = limits["limits"]
    assert set(lim["capacity"]) == set(lim["hostile"]) == set(labels)
    for mode, label in labels.items():
        rows = [line for line in lines if line.startswith(f"| {label} |")]
        assert len(rows) == 3, rows  # capacity, overload, hostile neighbour
        capacity, overload, hostile = rows
        c, o, h = (lim[part][mode] for part in ("capacity", "overload", "hostile"))
        assert capacity.startswith(f"| {label} | {c['records_per_s']:,.0f} | {c['rate']:,.0f} |")
        cpu = c["api_cpu_us_per_record"]
        assert f"| {cpu:.1f} ({'met' if cpu <= 30 else '**missed**'}) |" in capacity
        assert (
            f"| {o['accepted']:,} | {o['refused']:,} | {o['refused_without_retry_after']} |"
            in overload
        )
        ratio = h["ratio"]
        assert f"| {ratio:.2f}x ({'met' if ratio <= 2 else '**missed**'}) |" in hostile
    assert COMMANDS["limits"].split(" --json ")[0] in limits["run"]["argv"]
