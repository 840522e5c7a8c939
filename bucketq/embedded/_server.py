"""The embedded server: one ``secantusd-py`` process started, watched and stopped, and
:class:`mongodb`, a URI for a block."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

from .._validate import MONGODB_URI_ENV as URI_ENV
from ..errors import EmbeddedServerError
from ._files import CONFIG_FILE, CREDENTIALS_FILE, LOG_FILE, _DataLock, private_dir, write_private
from ._log import _LogPump, _ServerLog
from ._process import (
    _COMMAND,
    _alive,
    _die_with_parent,
    _process_args,
    _wake_accept,
    find_server_command,
)

log = logging.getLogger("bucketq.embedded")

_LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
_IN_USE = re.compile(r"already being managed by another process", re.IGNORECASE)
#: The server process's environment, where the caller's environment does not set a
#: variable. glibc malloc: the server decodes every document a scan touches into fresh
#: memory; with glibc's default 128 KiB trim threshold the heap is given back to the
#: kernel after each scan and the next one page-faults it in again, a large part of a
#: claim's time; it keeps up to this much freed memory mapped. OpenBLAS: the server
#: imports numpy (for its geo operators) and never multiplies a matrix, but OpenBLAS
#: starts a thread per core at import, a large part of a server's start; one starts none.
_SERVER_ENV = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "OPENBLAS_NUM_THREADS": "1"}
USER = "bucketq"
#: A stop's budget: checkpoint, SIGTERM and a clean exit, then SIGKILL.
STOP_TIMEOUT = 10.0


class EmbeddedServer:
    """One ``secantusd-py`` process on 127.0.0.1 with its own data directory.

    ``port=0`` picks a free port; the port is kept across :meth:`restart` so
    clients reconnect by themselves. Without ``storage_path`` a temporary
    directory is created and removed by :meth:`stop` (``keep_data=False``).
    ``standalone=True`` advertises a standalone topology: much faster writes,
    but no change streams and no retryable writes. ``test_commands=True`` enables
    mongod's test-only commands (``configureFailPoint``), which fault tests use.

    ``auth=True`` (``bucketq serve`` and ``bucketq store``) requires a user: the
    first start of a data directory generates one (``bucketq``, root, a random
    password kept in its ``bucketq-credentials``, 0600) and :attr:`uri` carries it.
    The data directory is made 0700 and the server creates its files 0600.

    The server is tied to the process that starts it (it gets SIGTERM when that dies,
    on Linux) and its data directory is locked while it runs: a start on a directory
    whose owner is alive fails at once; one whose owner is gone stops the server it
    left behind first. Its log is ``secantusd.log`` inside the data directory.
    """

    def __init__(
        self,
        storage_path: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        standalone: bool = False,
        test_commands: bool = False,
        auth: bool = False,
        startup_timeout: float = 60.0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._own_dir = storage_path is None
        self.storage_path = Path(storage_path or tempfile.mkdtemp(prefix="bucketq-mongo-"))
        self.host = host
        self.port = port
        self.standalone = standalone
        self.test_commands = test_commands
        self.auth = auth
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else self.storage_path / LOG_FILE
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = _DataLock(self.storage_path)
        self._password: str | None = None
        self._tied: bool | None = None
        self._log = _ServerLog(self.log_path)
        self._pump: _LogPump | None = None
        self._last_returncode = 0

    @property
    def uri(self) -> str:
        """The URI clients use, with the credentials when ``auth`` is on."""
        if not self.port:
            raise EmbeddedServerError("The embedded server has not been started yet.")
        if self._password is None:
            return f"mongodb://{self.host}:{self.port}/?directConnection=true"
        return (
            f"mongodb://{USER}:{quote_plus(self._password)}@{self.host}:{self.port}/"
            "?directConnection=true&authSource=admin"
        )

    @property
    def address(self) -> str:
        """``host:port``, to show in logs (:attr:`uri` may carry a password)."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        """None while the server runs; else how its last process ended (negative: killed
        by that signal), the process reaped (no zombie is left)."""
        if self._proc is not None:
            code = self._proc.poll()
            if code is None:
                return None
            self._last_returncode = code
        return self._last_returncode

    def start(self, *, tied: bool | None = None) -> EmbeddedServer:
        """Start the server (nothing if it runs). ``tied``: whether it is killed when
        the calling thread ends (the process too): by default when called from the main
        thread; ``True`` from a thread that lives as long as the server (see
        ``_die_with_parent``)."""
        if self.running():
            return self
        self._tied = tied
        held = self._lock.held  # a restart keeps the directory locked, failed or not
        private_dir(self.storage_path)
        previous = self._lock.acquire()
        try:
            self._stop_left_behind(previous)
            config = self.storage_path / CONFIG_FILE
            if not config.exists():
                write_private(config, "# written by bucketq: no other secantusd.toml applies\n")
            fresh, port = False, self.port  # set-up runs on a port of its own
            if self.auth:
                self._password = self._read_password()
                if self._password is None:
                    fresh = self._provision()
            self._launch(port, auth=self.auth)
            if fresh:
                self._check_untouched()
        except BaseException:
            if self.running():
                self.kill()
            if not held:
                self._lock.release()
            raise
        log.info("embedded server pid %s listening on %s", self.pid, self.address)
        return self

    # -- start-up pieces ---------------------------------------------------------------

    def _stop_left_behind(self, previous: dict[str, Any]) -> None:
        """Stop the server a dead owner left running on this data directory (it holds
        the store's own lock: a new server there would exit at once)."""
        pid = previous.get("server")
        if not isinstance(pid, int) or pid == os.getpid():
            return
        args = _process_args(pid)
        if not args or _COMMAND not in args or str(self.storage_path) not in args:
            # gone (or the pid is someone else's now); a clean stop empties the file
            log.warning(
                "bucketq process %s ended without stopping its embedded server on %s "
                "(killed?); the server is gone and its store recovers from its journal",
                previous.get("owner"), self.storage_path,
            )  # fmt: skip
            return
        log.warning(
            "the embedded server pid %s of bucketq process %s (gone) still runs on %s; "
            "stopping it",
            pid, previous.get("owner"), self.storage_path,
        )  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        port = previous.get("port")
        deadline = time.monotonic() + STOP_TIMEOUT
        _wake_accept(self.host, port if isinstance(port, int) else 0, deadline,
                     lambda: not _alive(pid))  # fmt: skip
        if _alive(pid):
            log.warning("the embedded server pid %s did not stop in %.0f s; killing it",
                        pid, STOP_TIMEOUT)  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while _alive(pid) and time.monotonic() < deadline + STOP_TIMEOUT:
                time.sleep(0.05)

    def _read_password(self) -> str | None:
        try:
            data = json.loads((self.storage_path / CREDENTIALS_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise EmbeddedServerError(
                f"Cannot read {self.storage_path / CREDENTIALS_FILE} ({exc}). Restore it, or "
                "start with a new data directory."
            ) from exc
        return str(data["password"])

    def _provision(self) -> bool:
        """Create the user (or give it a new password), on a server started without
        ``--auth`` for this on a port nobody expects (secantusd-py has no other way to
        create its first user), then stopped. Returns whether the directory was new (no
        store in it before)."""
        from pymongo import MongoClient

        fresh = not (self.storage_path / "WiredTiger").exists()
        password = secrets.token_urlsafe(24)
        self._launch(0, auth=False)
        try:
            client: MongoClient[dict[str, Any]]
            with MongoClient(self.uri, serverSelectionTimeoutMS=10_000,
                             socketTimeoutMS=30_000) as client:  # fmt: skip
                # Our user exists when a set-up was cut short before its file was
                # written, or the file was lost: whoever can start a server on this
                # directory may set a new password. Other users are left alone.
                exists = client.admin["system.users"].find_one({"_id": f"admin.{USER}"})
                command = "updateUser" if exists else "createUser"
                if exists:
                    log.warning("%s in %s is missing: the embedded server's user gets a new "
                                "password", CREDENTIALS_FILE, self.storage_path)  # fmt: skip
                elif not fresh:
                    log.warning("securing the embedded server's data in %s: until now any "
                                "local user could read and write it", self.storage_path)  # fmt: skip
                client.admin.command(command, USER, pwd=password, roles=["root"])
        finally:
            self._shutdown(STOP_TIMEOUT)
        write_private(self.storage_path / CREDENTIALS_FILE,
                       json.dumps({"user": USER, "password": password}) + "\n")  # fmt: skip
        self._password = password
        return fresh

    def _check_untouched(self) -> None:
        """On a new directory, nothing but our user may exist once ``--auth`` is on: a
        local user who found the set-up server in its seconds without ``--auth`` could
        have added a user or data."""
        from pymongo import MongoClient

        client: MongoClient[dict[str, Any]]
        with MongoClient(self.uri, serverSelectionTimeoutMS=10_000,
                         socketTimeoutMS=30_000) as client:  # fmt: skip
            # usersInfo's forAllDBs lists nothing on secantusd-py; this view lists all.
            found: list[dict[str, Any]] = list(client.admin["system.users"].find())
            users = [f"{u['db']}.{u['user']}" for u in found]
            names = set(client.list_database_names()) - {"admin", "config", "local"}
            admin = [c for c in client.admin.list_collection_names() if not c.startswith("system.")]
        if users != [f"admin.{USER}"] or names or admin:
            self._shutdown(STOP_TIMEOUT)
            raise EmbeddedServerError(
                f"Something connected to the embedded server while bucketq set up its "
                f"credentials in {self.storage_path} (users {users}, databases "
                f"{sorted(names)}, admin collections {admin}). Remove that directory and "
                "start again."
            )

    def _launch(self, port: int, *, auth: bool) -> None:
        cmd = [
            find_server_command(),
            "--config", str(self.storage_path / CONFIG_FILE),
            "--host", self.host,
            "--port", str(port),
            "--storage-path", str(self.storage_path),
            # The listening line is logged at INFO: it is read from a pipe, the rest of
            # the server's output goes to the log file.
            "--log-level", "INFO",
        ]  # fmt: skip
        if self.standalone:
            cmd.append("--standalone")
        if self.test_commands:
            cmd.append("--enable-test-commands")
        if auth:
            cmd.append("--auth")
        # The server's output (stdout and stderr, one pipe) reaches its log file through
        # the pump, which never stops reading: a server never blocks on its output, and
        # never sees a write to its log fail (a full or read-only disk).
        self._proc = subprocess.Popen(
            cmd,
            env={**_SERVER_ENV, **os.environ},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
            umask=0o077,  # its files readable by their owner only
            preexec_fn=_die_with_parent(self._tied),  # prctl only: see there
        )
        self.port = self._wait_listening()
        self._lock.record(server=self._proc.pid, port=self.port)
        self._wait_ping()

    def last_lines(self, n: int = 10) -> list[str]:
        """The last ``n`` lines the server wrote (kept in memory, so also when its log
        file could not be written)."""
        return self._log.last_lines(n)

    def retry_log(self) -> None:
        """Try a log file that could not be written again, though no line is waiting
        (the supervisor calls it on each check)."""
        self._log.retry()

    @property
    def log_dropped(self) -> int:
        """Lines of the server's output its log file could not take (a full or read-only
        disk): dropped and counted, while its output was read on."""
        return self._log.dropped

    def _wait_listening(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        found: list[int] = []
        ready = threading.Event()

        def listening(raw: bytes) -> None:
            if not found:
                m = _LISTENING.search(raw.decode(errors="replace"))
                if m:
                    found.append(int(m.group(2)))
                    ready.set()

        self._pump = _LogPump(self._proc.stdout, self._log, on_line=listening, done=ready.set)
        self._pump.start()
        if not ready.wait(self.startup_timeout) or not found:
            if ready.is_set():  # its output ended: it exits (or did)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(STOP_TIMEOUT)
            exited = self._proc.poll() is not None
            self.kill()
            self._pump.join(5)  # the lines still in the pipe
            tail = "".join(self.last_lines(40))[-2000:]
            if re.search(r"address already in use|errno 98|eaddrinuse", tail, re.IGNORECASE):
                raise EmbeddedServerError(
                    f"The embedded server cannot listen on {self.host}:{self.port}: the address "
                    "is already in use. Choose another port (0 picks a free one)."
                )
            if _IN_USE.search(tail):
                raise EmbeddedServerError(
                    f"The data directory {self.storage_path} is in use by a server bucketq did "
                    "not start. Stop that server first, or give another data directory."
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
                        f"The embedded server on {self.address} does not answer ping: {exc}"
                    ) from exc
                time.sleep(0.1)

    # -- stopping ----------------------------------------------------------------------

    def _shutdown(self, timeout: float) -> None:
        """Checkpoint, SIGTERM and wait for the clean exit; SIGKILL at the deadline."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        deadline = time.monotonic() + timeout
        self._checkpoint(deadline)
        proc.send_signal(signal.SIGTERM)
        _wake_accept(self.host, self.port, deadline, lambda: proc.poll() is not None)
        if proc.poll() is None:
            # secantusd-py can miss a SIGTERM that arrives with a new connection; after
            # the checkpoint above, nothing acknowledged is lost to a SIGKILL.
            log.warning("embedded server did not stop in %.0f s; killing it", timeout)
            proc.kill()
        proc.wait()
        self._proc = None

    def _checkpoint(self, deadline: float) -> None:
        """``fsync``: everything acknowledged goes into a checkpoint before the signal."""
        from pymongo import MongoClient

        ms = max(100, int((deadline - time.monotonic()) * 500))  # half the budget
        try:
            client: MongoClient[dict[str, Any]]
            with MongoClient(self.uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms,
                             socketTimeoutMS=ms) as client:  # fmt: skip
                client.admin.command("fsync")
        except Exception as exc:  # noqa: BLE001 - the SIGTERM still closes the store
            log.warning("embedded server checkpoint before stop failed: %s", exc)

    def stop(self, timeout: float = STOP_TIMEOUT, *, keep_data: bool | None = None) -> None:
        """Checkpoint and SIGTERM, SIGKILL after ``timeout``; remove an own temporary data
        dir (its server is simply killed: nothing in it is kept)."""
        if keep_data is None:
            keep_data = not self._own_dir
        if keep_data:
            self._shutdown(timeout)
        else:
            self.kill()
        self._lock.release()
        if not keep_data:
            shutil.rmtree(self.storage_path, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server (its data directory stays, for a restart)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._last_returncode = self._proc.wait()
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
