"""``bucketq worker`` as a user runs it: a real process, started in the handlers' directory
(``handlers:handle`` is imported from there), its log in a file the test reads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import bson

from bucketq.bucket.codec import decode_items
from waiting import eventually

HERE = Path(__file__).resolve().parent


class WorkerProcess:
    def __init__(self, uri: str, db: str, tmp: Path, *args: str, queue: str = "jobs") -> None:
        self.log_path = tmp / "worker.log"
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bucketq", "worker", *args, "--queue", queue,
             "--mongodb-uri", uri, "--database", db],
            cwd=HERE, env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        return eventually(lambda: re.search(pattern, self.log()), timeout=timeout,
                          what=f"{pattern!r} in the worker's log")  # fmt: skip

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log_file.close()

    def metrics_url(self) -> str:
        m = self.wait_log(r"metrics at (http://[\d.]+:\d+)/metrics")
        return m.group(1)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def health(base: str) -> dict[str, Any]:
    return json.loads(get(base + "/health")[1])


def metric(base: str, name: str, **labels: str) -> float | None:
    """One sample of /metrics, or None when it is not there."""
    text = get(base + "/metrics")[1].decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def stored_items(col: Any) -> Counter[int]:
    """Payload numbers of the items stored and not consumed."""
    seen: Counter[int] = Counter()
    for raw in col.find_raw_batches({}):
        for doc in bson.decode_all(raw):
            done = doc.get("done") or b""
            for k, it in enumerate(decode_items(doc["items"])):
                if not (k >> 3 < len(done) and done[k >> 3] & (1 << (k & 7))):
                    seen[it["p"]["i"]] += 1
    return seen
