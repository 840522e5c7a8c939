#!/usr/bin/env python3
"""Generate the sync queue shells from the async ones (the async code is the source).

    python scripts/unasync.py          # rewrite every bucketq/**/_sync/*.py
    python scripts/unasync.py --check  # exit 1 if a generated file is out of date

Renaming alone turns one into the other: the primitives in ``_concurrency`` come in
both flavours under the same names less ``Async``. CI runs ``--check`` (tests/test_unasync.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Every ``_async`` package below bucketq/ gets a generated ``_sync`` sibling.
PAIRS = [
    (d, d.with_name("_sync")) for d in sorted((ROOT / "bucketq").rglob("_async")) if d.is_dir()
]

# Order matters: longer patterns first.
SUBS = [
    (r"\basync with await ", "with "),
    (r"\basync with ", "with "),
    (r"\basync for ", "for "),
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basync_sleep\b", "sleep"),
    (r"\basync_pass_turn\b", "pass_turn"),
    (r"\basync_register_exit\b", "register_exit"),
    (r"\bcheck_async_database\b", "check_database"),
    (r"\bAsyncMongoClient\b", "MongoClient"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\b_async\b", "_sync"),
]

HEADER = "# GENERATED from {src} by scripts/unasync.py. Do not edit;\n# edit the async file and run `python scripts/unasync.py`.\n"


def convert(text: str) -> str:
    for pattern, repl in SUBS:
        text = re.sub(pattern, repl, text)
    return text


def formatted(text: str, path: Path) -> str:
    """``text`` as ``ruff format`` writes it, so formatting the repository never makes a twin stale."""
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if res.returncode != 0:
        raise SystemExit(f"ruff format failed on the twin of {path}: {res.stderr.strip()}")
    return res.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for src_dir, dst_dir in PAIRS:
        dst_dir.mkdir(exist_ok=True)
        for src in sorted(src_dir.glob("*.py")):
            text = src.read_text()
            dst = dst_dir / src.name
            out = (HEADER.format(src=src.relative_to(ROOT)) if text.strip() else "") + convert(text)
            out = formatted(out, dst)
            if check:
                if not dst.exists() or dst.read_text() != out:
                    stale.append(str(dst.relative_to(ROOT)))
            else:
                dst.write_text(out)
    if stale:
        print("out of date (run `python scripts/unasync.py`): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
