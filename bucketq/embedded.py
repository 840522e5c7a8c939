"""Start the embedded MongoDB-wire server (SecantusDB) as a separate process.

SecantusDB is GPL-2.0, so bucketq never imports it: it runs its command line,
``secantusd-py``, installed by the ``embedded`` extra. Tests, benchmarks and the
CLI use this whenever no MongoDB URI is given.

A data directory holds, besides the server's own files: ``secantusd.log`` (the
server's log), ``bucketq.lock`` (locked by the bucketq process that runs the
server, with both process ids) and, for a server started with ``auth=True``,
``bucketq-credentials`` (the generated user and password, mode 0600).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote_plus

from ._validate import MONGODB_URI_ENV as URI_ENV
from .errors import EmbeddedServerError

__all__ = ["EmbeddedServer", "embedded_uri", "find_server_command", "mongodb", "state_dir"]

log = logging.getLogger("bucketq.embedded")

_LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
_IN_USE = re.compile(r"already being managed by another process", re.IGNORECASE)
_COMMAND = "secantusd-py"
#: glibc malloc settings for the server process, unless the caller's environment sets
#: them. The server decodes every document a scan touches into fresh memory; with
#: glibc's default 128 KiB trim threshold the heap is given back to the kernel after
#: each scan and the next one page-faults it in again, a large part of a claim's time.
#: It keeps up to this much freed memory mapped.
_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
LOG_FILE = "secantusd.log"
LOCK_FILE = "bucketq.lock"
CREDENTIALS_FILE = "bucketq-credentials"
#: An empty configuration given with ``--config``: without it secantusd-py reads
#: ``./secantusd.toml`` (or ``~/.secantus/...``) if one exists, and such a file could
#: turn on test commands or TLS settings behind bucketq's back.
CONFIG_FILE = "secantusd.toml"
USER = "bucketq"
#: A stop's budget: checkpoint, SIGTERM and a clean exit, then SIGKILL.
STOP_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1


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
        "`pip install 'bucketq[embedded]'` (in a checkout of bucketq: "
        "`pip install -e '.[embedded]'`), or give a MongoDB URI "
        "(BUCKETQ_MONGODB_URI or --mongodb-uri)."
    )


def _die_with_parent(tied: bool | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the server SIGTERM when its parent dies,
    SIGKILL included (Linux ``PR_SET_PDEATHSIG``; SIGTERM lets it close its store).

    Chosen over a watchdog process or pipe because it costs nothing at start and needs
    nothing from the parent to fire. The kernel sends it when the *thread* that started
    the server exits, so by default (``tied`` None) it is set only from the main thread;
    ``tied=True`` sets it from any thread (a caller whose thread outlives the server: the
    supervisor's), ``False`` never. Untied (and off Linux) the server outlives a killed
    owner, and the next start on its data directory stops it (see
    :meth:`EmbeddedServer.start`)."""
    if tied is None:
        tied = threading.current_thread() is threading.main_thread()
    if not sys.platform.startswith("linux") or not tied:
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sig = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before prctl: nothing would signal us
            os._exit(1)

    return preexec


def _process_args(pid: int) -> str | None:
    """The command line of a live process, None when it is gone (or a zombie)."""
    if Path("/proc/self").exists():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return raw.replace(b"\0", b" ").decode(errors="replace").strip() or None  # "": zombie
    try:  # no /proc (macOS)
        out = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True,
                             text=True, timeout=5, check=False).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _process_args(pid) is not None


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only (0600), whole or not at all."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make it 0700: readable by its owner only.
    A directory that is 0700 already is left alone (a read-only file system refuses even
    a chmod that changes nothing)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o7777 != 0o700:
        path.chmod(0o700)
    return path


#: The file in :func:`state_dir` where a running ``bucketq serve`` with embedded storage
#: keeps its server's URI (with the generated password) while it runs.
URI_FILE = "serve.uri"
#: Seconds :func:`embedded_uri` waits for a starting ``bucketq serve`` to write :data:`URI_FILE`.
STARTING_WAIT = 60.0


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``bucketq serve`` keeps its embedded server's data and URI file (0700: the
    URI carries the embedded server's password), for this process's environment or
    another's (``environ``)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")) / "bucketq"


def embedded_uri(wait: float = STARTING_WAIT) -> str | None:
    """The URI a running ``bucketq serve`` with embedded storage wrote, if any. While a
    ``bucketq serve`` of this user is running and the file is not there yet (its embedded
    server is starting), wait for it, ``wait`` seconds at most: ``bucketq serve &`` then
    ``bucketq keys create`` works as typed."""
    here = state_dir()
    path = here / URI_FILE
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            uri = path.read_text().strip() or None
        except OSError:
            uri = None
        if uri is not None or time.monotonic() >= deadline:
            return uri
        pid = _starting_serve(here)
        if pid is None:
            return None
        if not told:
            told = True
            print(f"waiting for bucketq serve (pid {pid}) to start its embedded server "
                  f"({wait:.0f} s at most) ...", file=sys.stderr)  # fmt: skip
        time.sleep(0.2)


def _starting_serve(here: Path) -> int | None:
    """The pid of a ``bucketq serve`` of this user that will write its URI file in
    ``here`` (its own environment names that directory and no MongoDB URI), from
    ``/proc``; None without one (or without ``/proc``)."""
    me, uid = os.getpid(), os.getuid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            if pid == me or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # `bucketq serve ...` (the console script) and `python -m bucketq serve ...`
            pairs = zip(args, args[1:], strict=False)
            if not any(a.endswith(b"bucketq") and b == b"serve" for a, b in pairs):
                continue
            if any(a.startswith(b"--mongodb-uri") for a in args):
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw if b"=" in kv)
        if not env.get(URI_ENV) and state_dir(env) == here:
            return pid
    return None


class _DataLock:
    """``bucketq.lock`` in a data directory: an exclusive ``flock`` held by the bucketq
    process that runs the server there. The kernel releases it when that process dies,
    however it dies; the file names the owner, the server and its port, so the next
    start can tell a live owner (refuse at once) from a dead one (stop its server)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> dict[str, Any]:
        """Lock; return what the previous owner wrote (``{}`` if nothing)."""
        if self._fd is not None:
            return {}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = self._read(fd)
            os.close(fd)
            owner = info.get("owner", "unknown")
            raise EmbeddedServerError(
                f"The data directory {self.path.parent} is in use: bucketq process {owner} "
                f"runs its embedded server (pid {info.get('server', 'unknown')}). Stop that "
                "process first, or give another data directory."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self._read(fd)

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, **info: Any) -> None:
        """Write who runs the server (advisory: the lock is the flock; a full or read-only
        disk must not stop a server that starts)."""
        if self._fd is not None:
            data = json.dumps({"owner": os.getpid(), **info}).encode()
            try:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, data, 0)
            except OSError as exc:
                log.warning("could not write %s (%s); going on", self.path, exc)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


class _ServerLog:
    """The embedded server's log file, written line by line, and its last lines in memory;
    one per :class:`EmbeddedServer`, across its restarts.

    A line the file cannot take (a full or read-only disk, a file that cannot be opened)
    is dropped and counted (:attr:`dropped`), and writing is tried again at the next line
    at least :data:`RETRY_S` later: whoever feeds it (:class:`_LogPump`) never stops
    reading the server's output. Both changes are logged once: when lines start being
    dropped, and when the file takes them again (how many were dropped is said, and
    noted in the file where they are missing)."""

    #: Seconds between tries of a log file that failed.
    RETRY_S = 1.0
    #: Lines kept in memory.
    TAIL = 200

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tail: collections.deque[bytes] = collections.deque(maxlen=self.TAIL)
        self._fd: int | None = None
        self._lock = threading.Lock()
        #: Lines dropped in all, and since the file last took one.
        self.dropped = 0
        self._dropping = 0
        self._failing = False
        self._next_try = 0.0

    def last_lines(self, n: int) -> list[str]:
        return [raw.decode(errors="replace") for raw in list(self._tail)[-n:]]

    def write(self, raw: bytes) -> None:
        with self._lock:
            self._tail.append(raw)
            now = time.monotonic()
            if self._failing and now < self._next_try:
                self._drop()
                return
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                if self._failing:
                    _write_all(self._fd, f"[bucketq: {self._dropping} lines of the server's "
                                         "output are missing here: this file could not be "
                                         "written]\n".encode())  # fmt: skip
                _write_all(self._fd, raw)
            except OSError as exc:
                self._drop()
                self._next_try = now + self.RETRY_S
                self._close()
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "the embedded server's log %s cannot be written (%s): its lines are "
                        "dropped and counted until it can; the server goes on",
                        self.path, exc,
                    )  # fmt: skip
                return
            if self._failing:
                log.warning("the embedded server's log %s is written again; %d lines were "
                            "dropped", self.path, self._dropping)  # fmt: skip
                self._failing, self._dropping = False, 0

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _drop(self) -> None:
        self.dropped += 1
        self._dropping += 1


class _LogPump(threading.Thread):
    """Reads one server process's output (stdout and stderr, one pipe) until it closes,
    into the server's :class:`_ServerLog`. It never stops reading while the pipe is open:
    a server whose pipe is not read blocks on its next line, for good. ``on_line`` sees
    every line; ``done`` is called when the pipe closes (the process exited)."""

    def __init__(
        self,
        pipe: IO[bytes],
        sink: _ServerLog,
        *,
        on_line: Callable[[bytes], None] | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="bucketq-embedded-log", daemon=True)
        self._pipe, self._sink, self._on_line, self._done = pipe, sink, on_line, done

    def run(self) -> None:
        try:
            for raw in iter(self._pipe.readline, b""):
                try:
                    self._sink.write(raw)
                    if self._on_line is not None:
                        self._on_line(raw)
                except Exception:  # the pipe is read whatever happens
                    log.exception("embedded server log: handling a line failed; reading on")
        finally:
            self._sink.close()
            if self._done is not None:
                self._done()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class EmbeddedServer:
    """One ``secantusd-py`` process on 127.0.0.1 with its own data directory.

    ``port=0`` picks a free port; the port is kept across :meth:`restart` so
    clients reconnect by themselves. Without ``storage_path`` a temporary
    directory is created and removed by :meth:`stop` (``keep_data=False``).
    ``standalone=True`` advertises a standalone topology: much faster writes,
    but no change streams and no retryable writes. ``test_commands=True`` enables
    mongod's test-only commands (``configureFailPoint``), which fault tests use.

    ``auth=True`` (``bucketq serve`` and ``bucketq server``) requires a user: the
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
        """Start the server (nothing if it runs). ``tied``: whether it gets SIGTERM when
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
            env={**_MALLOC_ENV, **os.environ},
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


def _wake_accept(host: str, port: int, deadline: float, gone: Callable[[], bool]) -> None:
    """Wait until ``gone()`` or the deadline, connecting to the server now and then.

    secantusd-py's SIGTERM handler closes its listening socket and then waits up to 2 s
    for its accept thread, which wakes only when a connection arrives, so every stop would
    wait it out. A connection 0.1 s after the signal (the handler has
    run by then) lets it exit at once; once the socket is gone, connecting is refused
    and the waking stops."""
    wake = port > 0
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
        if wake and not gone():
            time.sleep(0.05)
            try:
                socket.create_connection((host, port), timeout=0.5).close()
            except OSError:
                wake = False


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
