"""Helpers for the fault suite: worker processes and what a queue holds in MongoDB."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import bson
import pytest

from bucketq.bucket.codec import decode_items
from bucketq.embedded import EmbeddedServer
from fast_settings import FAST_FAULTS

WORKERS = str(Path(__file__).resolve().parent.parent / "workers.py")


def run_worker(mode: str, uri: str, db: str, queue: str, out: Path, *args: str, options: dict | None = None,
               stdin: bool = False) -> subprocess.Popen[str]:  # fmt: skip
    return subprocess.Popen(
        [
            sys.executable,
            WORKERS,
            mode,
            uri,
            db,
            queue,
            str(out),
            "--options",
            json.dumps(options or FAST_FAULTS),
            *args,
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        text=True,
    )


def read_lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split("\t") for line in path.read_text().splitlines() if line]


def ids(*paths: Path) -> Counter[int]:
    """How often each item id (a line's first field) stands in the worker files ``paths``."""
    seen: Counter[int] = Counter()
    for path in paths:
        seen.update(int(r[0]) for r in read_lines(path))
    return seen


def consumers(k: int, uri: str, db: str, queue: str, out_dir: Path, *args: str,
              options: dict | None = None) -> tuple[list[subprocess.Popen[str]], list[Path]]:  # fmt: skip
    """``k`` consume workers (``args`` added), each appending to its own file in ``out_dir``."""
    outs = [out_dir / f"consumed{i}.txt" for i in range(k)]
    return [
        run_worker("consume", uri, db, queue, out, *args, options=options) for out in outs
    ], outs


def stored_items(col: Any) -> Counter[int]:
    """Payload ids of every not-yet-consumed item stored in a queue collection."""
    seen: Counter[int] = Counter()
    for raw in col.find_raw_batches({}):
        for doc in bson.decode_all(raw):
            done = doc.get("done") or b""
            for k, it in enumerate(decode_items(doc["items"])):
                if k >> 3 < len(done) and done[k >> 3] & (1 << (k & 7)):
                    continue
                seen[it["p"]["i"]] += 1
    return seen


@pytest.fixture
def local_server(tmp_path):
    """A server of this test's own, so it can be stopped and restarted."""
    server = EmbeddedServer(tmp_path / "data").start()
    try:
        yield server
    finally:
        server.stop()
