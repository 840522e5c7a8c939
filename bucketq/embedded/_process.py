"""The server's process: its command, tied to its parent, alive or gone, woken to stop."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import EmbeddedServerError

_COMMAND = "secantusd-py"
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
    """A ``preexec_fn`` that has the kernel SIGKILL the server when its parent dies,
    however it dies (Linux ``PR_SET_PDEATHSIG``).

    Chosen over a watchdog process or pipe because it costs nothing at start and needs
    nothing from the parent to fire. SIGKILL, not SIGTERM: the kernel sends the signal
    again each time the server passes to another thread of the dying parent, and
    secantusd-py's SIGTERM handler, entered again while it runs, deadlocks and leaves
    the server running; what the server acknowledged on disk (bucketq's clients ask for
    the journal) the next start recovers. The kernel sends it when the *thread* that
    started the server exits, so by default (``tied`` None) it is set only from the main
    thread; ``tied=True`` sets it from any thread (a caller whose thread outlives the
    server: the supervisor's), ``False`` never. Untied (and off Linux) the server outlives
    a killed owner, and the next start on its data directory stops it (see
    :meth:`EmbeddedServer.start`)."""
    if tied is None:
        tied = threading.current_thread() is threading.main_thread()
    if not sys.platform.startswith("linux") or not tied:
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sig = os.getpid(), int(signal.SIGKILL)

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
