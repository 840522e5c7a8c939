"""The server's output: a log file of bounded size, filled by a pump thread."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

log = logging.getLogger("bucketq.embedded")


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
            self._write(raw)

    def retry(self) -> None:
        """Try a failing file again without a line to write: a server that went quiet
        (or was restarted while the disk was broken) still gets its file's gap noted,
        and the operator its "written again" line, once the disk is mended."""
        with self._lock:
            if self._failing:
                self._write(b"")

    def _write(self, raw: bytes) -> None:
        now = time.monotonic()
        if self._failing and now < self._next_try:
            if raw:
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
            if raw:
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
