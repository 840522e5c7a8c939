"""A data directory's files: private writes, the directory itself and its lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import EmbeddedServerError

log = logging.getLogger("bucketq.embedded")

LOG_FILE = "secantusd.log"
LOCK_FILE = "bucketq.lock"
CREDENTIALS_FILE = "bucketq-credentials"
#: An empty configuration given with ``--config``: without it secantusd-py reads
#: ``./secantusd.toml`` (or ``~/.secantus/...``) if one exists, and such a file could
#: turn on test commands or TLS settings behind bucketq's back.
CONFIG_FILE = "secantusd.toml"


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
