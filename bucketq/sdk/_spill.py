"""The disk spill: what cannot be queued or sent is appended here instead of being lost.

One directory per configuration holds JSON-lines segments, each line
``{"log": <the ingest record>, "reason": "...", "retry": true|false, "at": ISO time}``.
A writer appends to its own active segment (named ``<time_ns>-<pid>-<n>.jsonl``) and
holds an exclusive ``flock`` on it, so another process or a replay never reads a
segment that is still being written; at ``segment_bytes`` it starts the next one.
Past ``max_bytes`` the oldest closed segment is deleted and its records are counted as
lost (``lost["spill_bound"]``) with a warning. Lines that cannot be parsed are set aside
in ``damaged-*.jsonl`` beside the segments, counted and never deleted.

:meth:`Spill.replay` re-sends closed segments through a ``send(records) -> Outcome``
callable and removes what was accepted; ``retry: false`` lines (refused by the server)
are kept unless ``retry_only=False``. A segment is rewritten once it has been gone
through, so a crash in the middle of one can send part of it again: replay is
at-least-once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._options import DEFAULT_SPILL_MAX_BYTES, DEFAULT_SPILL_SEGMENT_BYTES, LOGGER_NAME
from ._policy import OK, REFUSED, Outcome
from ._record import dumps, iso_time

try:  # POSIX; elsewhere segments are not locked (one process per spill directory)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(LOGGER_NAME)

SEGMENT_SUFFIX = ".jsonl"
DAMAGED_PREFIX = "damaged-"


def _lock(fd: int, *, wait: bool) -> bool:
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def segment_paths(directory: Path) -> list[Path]:
    """The segments of a spill directory, oldest first (names sort by creation time)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [
        directory / n
        for n in sorted(names)
        if n.endswith(SEGMENT_SUFFIX) and not n.startswith(DAMAGED_PREFIX)
    ]


def spill_directories(root: Path) -> list[Path]:
    """``root`` itself if it holds segments, else every directory below it that does."""
    root = Path(root)
    found = []
    for dirpath, _dirs, files in os.walk(root):
        if any(f.endswith(SEGMENT_SUFFIX) and not f.startswith(DAMAGED_PREFIX) for f in files):
            found.append(Path(dirpath))
    return sorted(found)


def encode_lines(records: Iterable[dict[str, Any]], reason: str, retry: bool) -> bytes:
    """The spill lines of ``records``: each record encoded once, the common tail (reason,
    retry, time) encoded once for all of them."""
    tail = dumps({"reason": reason, "retry": retry, "at": iso_time(time.time())})
    tail = "," + tail[1:] + "\n"
    return "".join(['{"log":' + dumps(r) + tail for r in records]).encode("utf-8", "replace")


@dataclass
class ReplayResult:
    """What a replay did: records accepted (``sent``), kept because refused (``refused``)
    or because the server went away (``kept``), damaged lines set aside, and why it
    stopped early (empty when it went through everything)."""

    sent: int = 0
    refused: int = 0
    kept: int = 0
    damaged: int = 0
    skipped_segments: int = 0
    stopped: str = ""
    reasons: dict[str, int] = field(default_factory=dict)


class Spill:
    """Append-only, size-bounded, rotated JSON-lines spill of one configuration."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_bytes: int = DEFAULT_SPILL_MAX_BYTES,
        segment_bytes: int = DEFAULT_SPILL_SEGMENT_BYTES,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        self._meta = meta
        self._lock = threading.Lock()
        self._file: Any = None
        self._path: Path | None = None
        self._active_bytes = 0
        self._seq = 0
        self._total: int | None = None
        self._dirty = False
        self.written = 0
        self.lost: dict[str, int] = {}
        self.damaged = 0

    # -- writing ---------------------------------------------------------------------
    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._meta is not None:
            meta_path = self.directory / "config.json"
            if not meta_path.exists():
                meta_path.write_text(json.dumps(self._meta, indent=1) + "\n")
        self._seq += 1
        path = self.directory / f"{time.time_ns():020d}-{os.getpid()}-{self._seq}{SEGMENT_SUFFIX}"
        f = open(path, "ab")  # noqa: SIM115 - held open across calls, closed by _close
        _lock(f.fileno(), wait=True)
        self._file, self._path = f, path
        self._active_bytes = 0
        if self._total is None:
            self._total = self._disk_bytes()

    def _close_active(self) -> None:
        if self._file is not None:
            try:
                self._file.close()  # releases the flock
            finally:
                self._file = None
                self._path = None

    def _disk_bytes(self) -> int:
        total = 0
        for p in segment_paths(self.directory):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def append(self, records: list[dict[str, Any]], reason: str, *, retry: bool = True,
               flush: bool = True) -> int:  # fmt: skip
        """Append ``records`` (ingest records) with ``reason``; return how many were written.
        A disk error is logged and counted as ``lost["spill_failed"]`` (nothing else can
        hold them), never raised into the caller."""
        if not records:
            return 0
        data = encode_lines(records, reason, retry)
        n = len(records)
        with self._lock:
            try:
                if self._file is None:
                    self._open()
                self._file.write(data)
                self._active_bytes += len(data)
                self._total = (self._total or 0) + len(data)
                self.written += n
                if flush:
                    self._file.flush()
                else:
                    self._dirty = True
                if self._active_bytes >= self.segment_bytes:
                    self._close_active()
                    self._enforce_bound()
            except OSError as exc:
                self.lost["spill_failed"] = self.lost.get("spill_failed", 0) + n
                log.error("could not spill %d record(s) to %s (%s); they are lost",
                          n, self.directory, exc)  # fmt: skip
                self._close_active()
                return 0
        return n

    def _enforce_bound(self) -> None:
        self._total = self._disk_bytes()
        if self._total <= self.max_bytes:
            return
        for path in segment_paths(self.directory):
            if self._total <= self.max_bytes:
                break
            if path == self._path:
                continue
            try:
                with open(path, "rb") as f:
                    if not _lock(f.fileno(), wait=False):
                        continue  # another writer's active segment, or being replayed
                    # Counted in small reads: a whole segment read at once (4 MiB) raises
                    # glibc's mmap threshold, and the process's memory creeps up after it.
                    lines = size = 0
                    while chunk := f.read(1 << 16):
                        lines += chunk.count(b"\n")
                        size += len(chunk)
                    path.unlink()
            except FileNotFoundError:
                continue
            self._total -= size
            self.lost["spill_bound"] = self.lost.get("spill_bound", 0) + lines
            log.warning(
                "spill directory %s is over spill_max_bytes=%d: deleted its oldest segment "
                "%s with %d record(s); raise spill_max_bytes or replay the spill sooner",
                self.directory, self.max_bytes, path.name, lines,
            )  # fmt: skip

    def flush(self) -> None:
        """Write buffered lines to the operating system (cheap when there are none)."""
        if not self._dirty:
            return
        with self._lock:
            self._dirty = False
            if self._file is not None:
                try:
                    self._file.flush()
                except OSError as exc:
                    log.error("could not flush the spill in %s: %s", self.directory, exc)

    def rotate(self) -> None:
        """Close the active segment so that a replay can take it."""
        with self._lock:
            self._close_active()
            self._dirty = False

    def close(self) -> None:
        self.rotate()

    def has_segments(self) -> bool:
        return bool(segment_paths(self.directory))

    # -- replaying -------------------------------------------------------------------
    def replay(
        self,
        send: Callable[[list[dict[str, Any]]], Outcome],
        *,
        retry_only: bool = True,
        batch_size: int = 100,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> ReplayResult:
        """Re-send every closed segment (the active one is closed first)."""
        self.rotate()
        return replay_directory(
            self.directory, send, retry_only=retry_only, batch_size=batch_size,
            should_stop=should_stop,
        )  # fmt: skip


def replay_directory(
    directory: Path,
    send: Callable[[list[dict[str, Any]]], Outcome],
    *,
    retry_only: bool = True,
    batch_size: int = 100,
    should_stop: Callable[[], bool] = lambda: False,
) -> ReplayResult:
    """Re-send the closed segments of one spill directory; see :class:`Spill`."""
    result = ReplayResult()
    for path in segment_paths(Path(directory)):
        if result.stopped:
            break
        if should_stop():
            result.stopped = "stopped"
            break
        try:
            f = open(path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            continue
        with f:
            if not _lock(f.fileno(), wait=False):
                result.skipped_segments += 1
                continue
            if not path.exists():  # replayed and removed by someone else meanwhile
                continue
            _replay_segment(path, f, send, retry_only, batch_size, should_stop, result)
    return result


def _replay_segment(path: Path, f: Any, send: Callable[[list[dict[str, Any]]], Outcome],
                    retry_only: bool, batch_size: int, should_stop: Callable[[], bool],
                    result: ReplayResult) -> None:  # fmt: skip
    """Stream one locked segment: send its lines in batches, write what stays to a
    temporary file that replaces the segment at the end (memory: one batch)."""
    tmp = path.with_name(path.name + ".tmp")
    aside = path.with_name(DAMAGED_PREFIX + path.name)
    outs: dict[str, Any] = {}
    counts = {"kept": 0, "damaged": 0}

    def write(name: str, target: Path, line: bytes) -> None:
        if name not in outs:
            outs[name] = open(target, "wb" if name == "keep" else "ab")  # noqa: SIM115
        outs[name].write(line if line.endswith(b"\n") else line + b"\n")

    def keep(entries: list[dict[str, Any]]) -> None:
        for e in entries:
            write("keep", tmp, dumps(e).encode("utf-8", "replace"))
        counts["kept"] += len(entries)

    chunk: list[dict[str, Any]] = []

    def send_chunk() -> None:
        if result.stopped or should_stop():
            result.stopped = result.stopped or "stopped"
            keep(chunk)
            result.kept += len(chunk)
            return
        outcome = send([e["log"] for e in chunk])
        if outcome.kind == OK:
            result.sent += len(chunk)
        elif outcome.kind == REFUSED:
            for e in chunk:
                e["reason"], e["retry"] = outcome.reason, False
            keep(chunk)
            result.refused += len(chunk)
            result.reasons[outcome.reason] = result.reasons.get(outcome.reason, 0) + len(chunk)
        else:  # down or retry: keep this batch and the rest of the segment for next time
            keep(chunk)
            result.kept += len(chunk)
            result.stopped = outcome.reason or outcome.kind

    try:
        for line in f:
            if not line.strip():
                continue
            if result.stopped:
                write("keep", tmp, line)
                counts["kept"] += 1
                result.kept += 1
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not isinstance(entry.get("log"), dict):
                    raise ValueError("not a spill line")
            except ValueError:
                write("damaged", aside, line)
                counts["damaged"] += 1
                continue
            if retry_only and entry.get("retry", True) is False:
                write("keep", tmp, line)
                counts["kept"] += 1
                result.kept += 1
                continue
            chunk.append(entry)
            if len(chunk) >= batch_size:
                send_chunk()
                chunk = []
        if chunk:
            send_chunk()
    finally:
        for out in outs.values():
            out.flush()
            os.fsync(out.fileno())
            out.close()
    if counts["damaged"]:
        result.damaged += counts["damaged"]
        log.warning("spill segment %s had %d damaged line(s); set aside in %s",
                    path, counts["damaged"], aside.name)  # fmt: skip
    if counts["kept"] == 0:
        path.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        return
    os.replace(tmp, path)
