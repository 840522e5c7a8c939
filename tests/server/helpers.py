"""A real ``bucketq serve`` process on loopback, for the service's tests."""

from __future__ import annotations

import io
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

from bucketq.cli import main
from waiting import eventually

#: The TLS settings of every HTTP client the tests make (``verify=TLS``): httpx builds a
#: context for each client, loading the CA bundle each time, a CPU cost in every test
#: that makes clients in a loop. The tests speak plain HTTP on loopback anyway.
TLS = ssl.create_default_context()

ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")


class Serve:
    """``python -m bucketq serve --port 0`` with ``env`` added; its log goes to ``log``."""

    def __init__(self, mongo_uri: str, database: str, log: Path, *args: str, **env: str) -> None:
        self.args = list(args)  # more `bucketq serve` arguments (e.g. --workers 2)
        self.mongo_uri = mongo_uri
        self.database = database
        self.log = log
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BUCKETQ_MONGODB_URI": mongo_uri,
            "BUCKETQ_DATABASE": database,
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._offset = 0

    def start(self, timeout: float = 60.0) -> Serve:
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bucketq", "serve", "--port", "0", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
            )

        def listening() -> str | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"bucketq serve exited ({self.proc.returncode}):\n{self.output()}"
                )
            m = _LISTENING.search(self.output())
            return m.group(1) if m else None

        self.url = eventually(listening, timeout, what="bucketq serve to listen")
        return self

    def output(self) -> str:
        return self.log.read_bytes()[self._offset :].decode(errors="replace")

    def client(self, key: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"X-API-Key": key} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, verify=TLS, **kw)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    @contextmanager
    def stops_cleanly(self) -> Iterator[Serve]:
        """Run the body, then SIGTERM the process: it must exit 0. A failure in the body
        is reported as itself (the process is stopped all the same)."""
        try:
            yield self
        except BaseException:
            self.terminate()
            raise
        code = self.terminate()
        assert code == 0, f"bucketq serve exited {code}:\n{self.output()[-3000:]}"


def bucketq_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``bucketq ARGS`` run in this process with ``env`` as its environment: the command
    line's own code, without an interpreter start per call (the commands' own tests run
    them as real processes)."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def cli_key(env: dict[str, str], *args: str) -> str:
    """The key ``bucketq keys create ARGS`` prints (run in this process, with ``env``)."""
    done = bucketq_cli(env, "keys", "create", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def create_key(serve: Serve, project: str) -> str:
    """A key for ``project`` of the service ``serve`` runs."""
    return cli_key(serve.env, "--project", project)


def create_key_command(serve: Serve, project: str) -> str:
    """A key made with the command line as a real process, as a user would."""
    out = subprocess.run(
        [sys.executable, "-m", "bucketq", "keys", "create", "--project", project],
        env=serve.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    return out.stdout.strip().splitlines()[-1]


def log_batch(n: int, *, service: str = "api", prefix: str = "m", **extra: Any) -> dict[str, Any]:
    return {
        "logs": [
            {
                "time": "2024-05-01T10:00:00Z",
                "service": service,
                "level": "info",
                "message": f"{prefix}-{i}",
                **extra,
            }
            for i in range(n)
        ]
    }
