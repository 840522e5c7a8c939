"""The URI file of the running embedded store (``bucketq store``, or ``bucketq serve``
without a MongoDB URI), and finding it."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .._validate import MONGODB_URI_ENV as URI_ENV
from ._files import private_dir, write_private

#: The file in :func:`state_dir` that holds the running embedded store's URI (with its
#: generated password), written by ``bucketq store`` and ``bucketq serve``.
URI_FILE = "store.uri"
#: The name ``bucketq serve`` wrote before ``bucketq store`` wrote one too: read after
#: :data:`URI_FILE`, so a serve started before an upgrade is found until it stops.
EARLIER_URI_FILE = "serve.uri"
#: Seconds :func:`embedded_uri` waits for a starting store to write :data:`URI_FILE`.
STARTING_WAIT = 60.0
#: The commands that write :data:`URI_FILE` (``server``: ``store``'s deprecated name).
_WRITERS = (b"serve", b"store", b"server")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``bucketq serve`` keeps its embedded server's data, and the embedded store's
    URI file (0700: the URI carries the store's password), for this process's
    environment or another's (``environ``)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")) / "bucketq"


class PublishedUri:
    """:data:`URI_FILE` as one running store wrote it (0600, in a 0700 :func:`state_dir`),
    for other commands to find: the store started last is the one found. Call
    :meth:`withdraw` when that store stops."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.path = private_dir(state_dir()) / URI_FILE
        #: The URI this one replaced: a store started earlier, maybe still running.
        self.replaced = _read(self.path)
        write_private(self.path, uri + "\n")

    def withdraw(self) -> None:
        """Remove the file if it is still this store's (a store started since keeps its
        own). The URI it replaced comes back if that store still listens: with
        ``bucketq serve`` running, a ``bucketq store`` tried meanwhile does not leave
        commands without the service's store."""
        if _read(self.path) != self.uri:
            return
        earlier = _address(self.replaced)
        # The earlier store, if it still listens; one on this store's own address died
        # before this one started (what listens there is this one).
        if earlier is not None and earlier != _address(self.uri) and _listening(earlier):
            write_private(self.path, f"{self.replaced}\n")
        else:
            with contextlib.suppress(OSError):
                self.path.unlink()


def _address(uri: str | None) -> tuple[str, int] | None:
    """The one host and port ``uri`` names (as the embedded store's URI does)."""
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_uri

    if not uri:
        return None
    try:
        host, port = parse_uri(uri)["nodelist"][0]
    except (PyMongoError, ValueError, IndexError):  # not a URI bucketq wrote
        return None
    return str(host), int(port)


def _listening(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1.0).close()
    except OSError:
        return False
    return True


def embedded_uri(wait: float = STARTING_WAIT) -> str | None:
    """The URI the running embedded store (``bucketq store``, or ``bucketq serve``
    without a MongoDB URI) wrote, if any. While such a command of this user is running
    and the file is not there yet (its store is starting), wait for it, ``wait`` seconds
    at most: ``bucketq serve &`` then ``bucketq keys create`` works as typed."""
    here = state_dir()
    deadline = time.monotonic() + wait
    told = False
    while True:
        uri = _read(here / URI_FILE) or _read(here / EARLIER_URI_FILE)
        if uri is not None or time.monotonic() >= deadline:
            return uri
        found = _starting_store(here)
        if found is None:
            return None
        if not told:
            told = True
            pid, command = found
            print(f"waiting for bucketq {command} (pid {pid}) to start its embedded server "
                  f"({wait:.0f} s at most) ...", file=sys.stderr)  # fmt: skip
        time.sleep(0.2)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _starting_store(here: Path) -> tuple[int, str] | None:
    """The pid and command of a ``bucketq store``, or ``bucketq serve`` without a MongoDB
    URI, of this user that will write its URI file in ``here`` (its own environment names
    that directory), from ``/proc``; None without one (or without ``/proc``)."""
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
            command = next((b for a, b in pairs if a.endswith(b"bucketq") and b in _WRITERS), None)
            if command is None:
                continue
            serve = command == b"serve"
            if serve and any(a.startswith(b"--mongodb-uri") for a in args):
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw if b"=" in kv)
        # serve uses the URI its environment names, if any; store always starts its own
        if not (serve and env.get(URI_ENV)) and state_dir(env) == here:
            return pid, command.decode()
    return None
