"""Start the embedded MongoDB-wire server (SecantusDB) as a separate process.

SecantusDB is GPL-2.0, so bucketq never imports it: it runs its command line,
``secantusd-py``, installed by the ``embedded`` extra. Tests, benchmarks and the
CLI use this whenever no MongoDB URI is given.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .errors import EmbeddedServerError

__all__ = ["EmbeddedServer", "find_server_command"]

log = logging.getLogger("bucketq.embedded")

_LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
_COMMAND = "secantusd-py"
#: glibc malloc settings for the server process, unless the caller's environment sets
#: them. The server decodes every document a scan touches into fresh memory; with
#: glibc's default 128 KiB trim threshold the heap is given back to the kernel after
#: each scan and the next one page-faults it in again, which was half the time of a
#: claim over 100 buckets of ~110 KB (20 ms -> 9 ms measured here). It keeps up to
#: this much freed memory mapped.
_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def find_server_command() -> str:
    """Return the path of ``secantusd-py``, preferring the one beside this Python."""
    beside = Path(sys.executable).with_name(_COMMAND)
    if beside.exists():
        return str(beside)
    found = shutil.which(_COMMAND)
    if found:
        return found
    raise EmbeddedServerError(
        "The embedded MongoDB server is not installed. Install it with "
        "`pip install 'bucketq[embedded]'`, or give a MongoDB URI "
        "(BUCKETQ_MONGODB_URI or --mongodb-uri)."
    )


class EmbeddedServer:
    """One ``secantusd-py`` process on 127.0.0.1 with its own data directory.

    ``port=0`` picks a free port; the port is kept across :meth:`restart` so
    clients reconnect by themselves. Without ``storage_path`` a temporary
    directory is created and removed by :meth:`stop` (``keep_data=False``).
    ``standalone=True`` advertises a standalone topology: 5-8x faster writes,
    but no change streams and no retryable writes. ``test_commands=True`` enables
    mongod's test-only commands (``configureFailPoint``), which fault tests use.
    The server's log is removed with its own temporary data directory.
    """

    def __init__(
        self,
        storage_path: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        standalone: bool = False,
        test_commands: bool = False,
        startup_timeout: float = 60.0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._own_dir = storage_path is None
        self.storage_path = Path(storage_path or tempfile.mkdtemp(prefix="bucketq-mongo-"))
        self.host = host
        self.port = port
        self.standalone = standalone
        self.test_commands = test_commands
        self.startup_timeout = startup_timeout
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path else self.storage_path.with_suffix(".log")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        if not self.port:
            raise EmbeddedServerError("The embedded server has not been started yet.")
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedServer:
        if self.running():
            return self
        self.storage_path.mkdir(parents=True, exist_ok=True)
        cmd = [
            find_server_command(),
            "--host", self.host,
            "--port", str(self.port),
            "--storage-path", str(self.storage_path),
            "--log-level", "WARNING",
        ]  # fmt: skip
        if self.standalone:
            cmd.append("--standalone")
        if self.test_commands:
            cmd.append("--enable-test-commands")
        # The listening line is logged at INFO, so read it from a pipe and keep the
        # rest of the server's output in a log file.
        cmd[cmd.index("--log-level") + 1] = "INFO"
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the reader thread
        self._proc = subprocess.Popen(
            cmd,
            env={**_MALLOC_ENV, **os.environ},
            stdout=logf,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
        )
        port = self._wait_listening(logf)
        self.port = port
        self._wait_ping()
        log.info("embedded server pid %s listening on %s", self._proc.pid, self.uri)
        return self

    def _wait_listening(self, logf) -> int:
        assert self._proc is not None and self._proc.stderr is not None
        found: list[int] = []
        ready = threading.Event()
        stderr = self._proc.stderr

        def pump() -> None:
            for raw in iter(stderr.readline, b""):
                logf.write(raw)
                logf.flush()
                if not found:
                    m = _LISTENING.search(raw.decode(errors="replace"))
                    if m:
                        found.append(int(m.group(2)))
                        ready.set()
            logf.close()
            ready.set()

        threading.Thread(target=pump, name="bucketq-embedded-log", daemon=True).start()
        if not ready.wait(self.startup_timeout) or not found:
            exited = self._proc.poll() is not None
            self.kill()
            tail = (
                self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            )
            if re.search(r"address already in use|errno 98|eaddrinuse", tail, re.IGNORECASE):
                raise EmbeddedServerError(
                    f"The embedded server cannot listen on {self.host}:{self.port}: the address "
                    "is already in use. Choose another port (0 picks a free one)."
                )
            what = (
                "exited before it listened"
                if exited
                else f"did not start within {self.startup_timeout:.0f} s"
            )
            raise EmbeddedServerError(
                f"The embedded server {what}. Its log ({self.log_path}) ends with:\n{tail}"
            )
        return found[0]

    def _wait_ping(self) -> None:
        from pymongo import MongoClient

        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                client: MongoClient[dict[str, Any]]
                with MongoClient(self.uri, serverSelectionTimeoutMS=1000) as client:
                    client.admin.command("ping")
                return
            except Exception as exc:  # any failure means "not yet"
                if time.monotonic() > deadline or not self.running():
                    raise EmbeddedServerError(
                        f"The embedded server on {self.uri} does not answer ping: {exc}"
                    ) from exc
                time.sleep(0.1)

    def stop(self, timeout: float = 15.0, *, keep_data: bool | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; remove an own temporary data dir."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("embedded server did not stop in %.0f s; killing it", timeout)
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if keep_data is None:
            keep_data = not self._own_dir
        if not keep_data:
            shutil.rmtree(self.storage_path, ignore_errors=True)
            if self._own_log:
                self.log_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server (its data directory stays, for a restart)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self, *, hard: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with ``hard``) and start again on the same port and data."""
        if hard:
            self.kill()
        else:
            self.stop(keep_data=True)
        self.start()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


URI_ENV = "BUCKETQ_MONGODB_URI"


class mongodb:  # noqa: N801 - used like a function: ``with mongodb(uri) as uri:``
    """Context manager yielding a MongoDB URI: the one given, else ``$BUCKETQ_MONGODB_URI``,
    else an embedded server started for the duration of the block."""

    def __init__(self, uri: str | None = None, *, standalone: bool = False) -> None:
        self._uri = uri or os.environ.get(URI_ENV) or None
        self._standalone = standalone
        self.server: EmbeddedServer | None = None

    def __enter__(self) -> str:
        if self._uri:
            return self._uri
        self.server = EmbeddedServer(standalone=self._standalone).start()
        return self.server.uri

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
