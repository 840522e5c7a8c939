"""Helpers of the SDK tests: wait for a condition (the suite's ``eventually``), a port
nothing listens on, and a real ``bucketq serve`` process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from server.helpers import cli_key

from bucketq.sdk._spill import segment_paths, spill_directories
from waiting import eventually

__all__ = ["ROOT", "Serve", "dead_port", "eventually"]


def spilled(root: Path) -> list[dict]:
    """Every record in the spill files below ``root``."""
    out = []
    for d in spill_directories(root):
        for p in segment_paths(d):
            out.extend(json.loads(x) for x in p.read_text().splitlines() if x.strip())
    return out


def dead_port() -> int:
    """A loopback port nothing listens on (bound then closed: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- a real `bucketq serve` on loopback ------------------------------------------------


ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on (http://[0-9.]+:(\d+))")


class Serve:
    """``python -m bucketq serve`` on 127.0.0.1 with its own database; restartable on the
    same port (``start(port)``), stoppable for real (SIGKILL, SIGSTOP/SIGCONT)."""

    def __init__(self, mongo_uri: str, database: str, log: Path, **env: str) -> None:
        self.database = database
        self.log = log
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "BUCKETQ_MONGODB_URI": mongo_uri,
                    "BUCKETQ_DATABASE": database, **env}  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._offset = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0, timeout: float = 90.0) -> Serve:
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bucketq", "serve", "--host", "127.0.0.1",
                 "--port", str(port), "--log-level", "info"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )  # fmt: skip

        def listening() -> int | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"bucketq serve exited ({self.proc.returncode}):\n"
                                     + self.log.read_bytes()[self._offset:].decode(errors="replace"))  # fmt: skip
            m = _LISTENING.search(self.log.read_bytes()[self._offset :].decode(errors="replace"))
            return int(m.group(2)) if m else None

        self.port = eventually(listening, timeout, 0.05, "bucketq serve to listen")
        return self

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(60)
            self.proc = None

    def stop_signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def create_key(self, project: str) -> str:
        """A key made with ``bucketq keys create`` (run in this process)."""
        return cli_key(self.env, "--project", project)

    def logs(self, key: str, **params: str) -> list[dict]:
        """Every log record of the key's project, read back through ``GET /api/v1/logs``."""
        out: list[dict] = []
        cursor = None
        while True:
            q = {"limit": "1000", **params}
            if cursor:
                q["cursor"] = cursor
            req = urllib.request.Request(f"{self.url}/api/v1/logs?{urllib.parse.urlencode(q)}",
                                         headers={"X-API-Key": key})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as r:
                page = json.load(r)
            out.extend(page["logs"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out
