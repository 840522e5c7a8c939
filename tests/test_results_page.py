"""docs/results.md is what ``bucketq bench report`` makes of the JSON kept beside it: the
figures the docs link to live in one generated page, which nobody edits by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bucketq.benchmark.results import SECTIONS, render

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
