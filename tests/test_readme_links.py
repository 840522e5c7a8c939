"""Every link of the README leads somewhere: a file of the repository and, for a link into
a docs page, a heading of that page (the docs site's own links are checked by
``mkdocs build --strict`` in scripts/check; the README is not one of its pages)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: str) -> set[str]:
    """The anchors of a page's headings, as the docs site's table of contents makes them."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", page, re.M):
        text = re.sub(r"[`*]", "", heading).lower()
        slug = re.sub(r"[^\w\- ]", "", text).strip().replace(" ", "-")
        out.add(re.sub(r"-+", "-", slug))
    return out


def test_every_readme_link_resolves():
    readme = (ROOT / "README.md").read_text()
    links = [x for x in LINK.findall(readme) if "://" not in x]
    assert links, "the README links into the docs"
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"the README links to {path}, which does not exist"
        if anchor:
            assert anchor in anchors(target.read_text()), f"{path} has no heading #{anchor}"
