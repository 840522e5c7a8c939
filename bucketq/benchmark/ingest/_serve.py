"""One ``bucketq serve`` process for one mode: started on a free loopback port with the
mode's environment, an API key made with ``bucketq keys create``, its CPU time read
from ``/proc``, stopped with SIGTERM (a graceful drain) and waited for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

#: Seconds ``bucketq serve`` may take to answer ``/ready``.
DEFAULT_START_TIMEOUT = 90.0
#: Seconds a SIGTERM'd server may take to drain and exit before it is killed; the
#: buffer's own ``RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS`` (10 s) bounds its drain.
DEFAULT_STOP_TIMEOUT = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``); None elsewhere or
    when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _bucketq(*args: str) -> list[str]:
    return [sys.executable, "-m", "bucketq", *args]


class ServeProcess:
    """``bucketq serve`` with ``env`` added to this process's environment."""

    def __init__(self, env: dict[str, str], *, host: str = "127.0.0.1") -> None:
        self.env = {**os.environ, **env}
        self.host = host
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept for the log's tail
            prefix="bucketq-bench-serve-", suffix=".log", delete=False
        )
        self.exit_code: int | None = None
        self.stop_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return Path(self._log.name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> ServeProcess:
        self.port = free_port(self.host)
        self.proc = subprocess.Popen(
            _bucketq("serve", "--host", self.host, "--port", str(self.port)),
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is the benchmark's to handle
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"bucketq serve exited with code {self.proc.returncode} before it was ready; "
                    f"its log ends with:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"bucketq serve did not answer /ready within {timeout:.0f} s; its log ends "
                    f"with:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def create_key(self, project: str, timeout: float = 60.0) -> str:
        """``bucketq keys create --project project``: the key is stdout's last line."""
        r = subprocess.run(
            _bucketq("keys", "create", "--project", project),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines:
            raise RuntimeError(
                f"bucketq keys create failed (code {r.returncode}): {r.stderr.strip()[-1000:]}"
            )
        return lines[-1].strip()

    def cpu(self) -> float | None:
        return None if self.proc is None else cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait (the server drains its buffer); SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            t = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.stop_seconds = time.monotonic() - t
        self.exit_code = self.proc.returncode
        return self.exit_code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Kill it if still running and remove its log."""
        self.kill()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
