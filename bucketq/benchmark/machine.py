"""The machine a benchmark ran on and how busy it was, stamped into its ``--json`` file.

Every ``bucketq bench`` command runs inside :class:`Run` (``cli.run_command`` does it):
the load average is sampled while the benchmark runs, and when it has written its JSON
the file gets ``"machine"`` (CPU model, cores, memory, platform) and ``"run"`` (the
command, UTC start and end, the 1-minute load average before, during and after). The
results page (``bucketq bench report``) prints both in its header: a figure from a
shared machine means little without its load.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Seconds between samples of the load average while a benchmark runs.
SAMPLE_EVERY = 5.0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _bucketq() -> dict[str, Any]:
    """bucketq's version, and in a git checkout its commit (``+`` when files differ)."""
    import subprocess

    from .._version import version

    out: dict[str, Any] = {"version": version(), "commit": None}
    here = Path(__file__).resolve().parents[1]  # the bucketq package
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        if rev.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                                   capture_output=True, text=True, timeout=10)  # fmt: skip
            out["commit"] = rev.stdout.strip() + ("+" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Run:
    """A benchmark's run: samples the 1-minute load average from start to end, then
    :meth:`stamp` adds the machine and the run to the JSON the benchmark wrote."""

    def __init__(self, command: str, argv: list[str] | None = None) -> None:
        self.command = command
        #: The whole command line (default: this ``bucketq`` command's).
        self.argv = ["bucketq", *sys.argv[1:]] if argv is None else argv
        self.started_at = _now()
        self.ended_at: str | None = None
        self.load_before = _load_1m()
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-load", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            load = _load_1m()
            if load is not None:
                self.samples.append(load)

    def __enter__(self) -> Run:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.ended_at = _now()

    def record(self) -> dict[str, Any]:
        after = _load_1m()
        during = self.samples or [x for x in (self.load_before, after) if x is not None]
        return {
            "command": self.command,
            "bucketq": _bucketq(),
            "argv": shlex.join(self.argv),
            "started_at": self.started_at,
            "ended_at": self.ended_at or _now(),
            "load_1m": {
                "before": self.load_before,
                "min": min(during, default=None),
                "max": max(during, default=None),
                "after": after,
                "note": "the 1-minute load average of the whole machine, the benchmark's "
                "own processes included; 'before' is what else was running",
            },
        }

    def stamp(self, json_path: str | os.PathLike[str] | None) -> None:
        """Add ``machine`` and ``run`` to the JSON at ``json_path`` (if it was written)."""
        if not json_path or not Path(json_path).is_file():
            return
        path = Path(json_path)
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            return
        doc["machine"] = machine()
        doc["run"] = self.record()
        path.write_text(json.dumps(doc, indent=1) + "\n")


__all__ = ["SAMPLE_EVERY", "Run", "machine"]
