"""Several worker processes (``bucketq worker --processes P``): a supervisor and the
channel between it and each of them.

The supervisor starts P children, each ``python -m bucketq.worker_cli ... --child-fd N``
(``bucketq worker`` without the other commands' parsers) with
a queue object of its own (so their claims spread over the queue's partitions), and one
socket each (the child's end of a socketpair, its descriptor N). Down the socket go
``stop`` and ``abort`` lines; up it, every ``REPORT_PERIOD`` seconds, the child's
``stats()`` and ``health()`` as one JSON line, which the supervisor serves as metrics.

Signals: children run in a session of their own, so a terminal's Ctrl-C reaches the
supervisor alone, which passes each signal on as ``stop`` (the first) or ``abort`` (the
second). A signal sent to every process at once (systemd's default) counts once in a
child: a request moves a worker to at least a level, never one further. A child that
reads the end of its socket (its supervisor died) stops as on SIGTERM.

A child that exits 0 stopped by itself (``--max-items``, its queue drained) and is done;
when every child is, so is the supervisor. One that exits otherwise while the supervisor
runs is replaced (``core.Restarts``): at once if
it lived a while or stopped itself because a handler was stuck past its time limit
(``EXIT_STUCK``: the stuck thread ends with its process), after a growing back-off if it
keeps dying young, and after five young deaths in a row the supervisor gives up, stops
the others and exits 1. On a stop it waits for each child's drain; a child still alive
``stop_wait`` seconds later is told to abort, and one alive ``ABORT_WAIT`` after that
is killed (its items come back when their lease runs out: nothing is lost).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import core

log = logging.getLogger("bucketq.worker")

_monotonic = time.monotonic

#: Seconds a child told to abort gets before it is killed.
ABORT_WAIT = 10.0
#: The longest report line a child may send (bytes): anything longer is dropped.
MAX_REPORT = 1 << 20


@dataclass(eq=False)
class _Child:
    index: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    started: float
    buf: bytearray = field(default_factory=bytearray)
    report: dict[str, Any] | None = None
    reported_at: float = 0.0
    told: int = core.RUNNING
    eof: bool = False


class Supervisor:
    """Runs ``processes`` children of ``bucketq worker`` with the arguments ``argv``
    (everything but ``--processes`` and the metrics endpoint) and the environment
    ``env``; see the module docstring. :meth:`run` returns the exit status."""

    def __init__(
        self, argv: list[str], processes: int, *, stop_wait: float, env: dict[str, str]
    ) -> None:
        self.argv = argv
        self.processes = processes
        self.stop_wait = stop_wait
        self.env = env
        self._stop = core.StopState()
        self._restarts = core.Restarts()
        self._children: dict[int, _Child] = {}
        self._due: dict[int, float] = {}  # index -> when to start its replacement
        self._codes: list[int | None] = []
        # The counters (worker, queue) of children that exited: totals never go back.
        self._retired: dict[str, Any] = {}
        self._retired_queue: dict[str, int] = {}
        self._lock = threading.Lock()  # the metrics thread reads the reports
        self._sel = selectors.DefaultSelector()
        self.restarts = 0

    def stop(self, now: bool = False) -> None:
        self._stop.request(core.ABORTING if now else core.STOPPING, "stop()")

    def run(self) -> int:
        saved = {
            sig: signal.signal(sig, lambda s, _f: self._stop.signal(signal.Signals(s).name))
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for i in range(self.processes):
                self._start(i)
            return self._loop()
        finally:
            for sig, old in saved.items():
                signal.signal(sig, old)
            for c in list(self._children.values()):
                self._kill(c)

    def _loop(self) -> int:
        since: float | None = None  # when the stop began
        aborted_at: float | None = None
        while True:
            now = _monotonic()
            level = self._stop.news()
            if level is not None:
                what = "stop" if level == core.STOPPING else "abort"
                log.info("supervisor: %s (%s): telling %d worker process(es) to %s",
                         "stopping" if level == core.STOPPING else "stopping at once",
                         self._stop.reason, len(self._children), what)  # fmt: skip
                since = since or now
                aborted_at = now if level == core.ABORTING else aborted_at
            for c in list(self._children.values()):
                self._tell(c)
            if not self._children and (self._stop.level >= core.STOPPING or not self._due):
                return core.exit_status(self._codes)
            if (
                since is not None
                and self._stop.level < core.ABORTING
                and now - since > self.stop_wait
            ):
                self._stop.request(core.ABORTING, f"not stopped within {self.stop_wait:g} s")
            if aborted_at is not None and now - aborted_at > ABORT_WAIT:
                for c in list(self._children.values()):
                    log.error("supervisor: worker process %d did not stop; killed (its items "
                              "come back when their lease runs out)", c.proc.pid)  # fmt: skip
                    self._kill(c)
                    self._ended(c, None)
                continue
            for key, _ in self._sel.select(timeout=core.CONTROL_PERIOD):
                self._read(key.data)
            for c in list(self._children.values()):
                code = c.proc.poll()
                if code is not None:
                    self._ended(c, code)
            if self._stop.level == core.RUNNING:
                for i, at in list(self._due.items()):
                    if at <= _monotonic():
                        del self._due[i]
                        self._start(i)
            else:
                self._due.clear()

    def _start(self, index: int) -> None:
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bucketq.worker_cli", *self.argv, "--child-fd", str(fd)],
                pass_fds=(fd,),
                env=self.env,
                start_new_session=True,
            )
        finally:
            theirs.close()
        mine.setblocking(False)
        c = _Child(index, proc, mine, _monotonic())
        self._children[index] = c
        self._sel.register(mine, selectors.EVENT_READ, c)
        log.info("supervisor: worker process %d started (%d of %d)", proc.pid, index + 1,
                 self.processes)  # fmt: skip

    def _tell(self, c: _Child) -> None:
        """Pass the stop level on to ``c`` (once per level)."""
        level = self._stop.level
        if level > c.told:
            c.told = level
            try:
                c.sock.sendall(b"stop\n" if level == core.STOPPING else b"abort\n")
            except OSError:
                pass  # it is gone: its exit is seen next

    def _read(self, c: _Child) -> bool:
        """Read what ``c`` sent; False when there was nothing (now, or ever again)."""
        if c.eof:
            return False
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            c.eof = True
            self._sel.unregister(c.sock)
            return False
        c.buf += data
        *lines, rest = bytes(c.buf).split(b"\n")
        c.buf = bytearray(rest if len(rest) <= MAX_REPORT else b"")
        for line in lines[-1:]:  # only the latest report counts
            try:
                report = json.loads(line)
            except ValueError:
                log.warning("supervisor: worker process %d sent a report that is not JSON",
                            c.proc.pid)  # fmt: skip
                continue
            with self._lock:
                c.report, c.reported_at = report, _monotonic()
        return True

    def _ended(self, c: _Child, code: int | None) -> None:
        for _ in range(64):  # its last report may still be in the socket
            if not self._read(c):
                break
        with self._lock:
            del self._children[c.index]
            if c.report is not None:
                self._retired = core.add_stats(self._retired, c.report.get("worker") or {})
                for k, n in (c.report.get("queue") or {}).items():
                    if isinstance(n, int):
                        self._retired_queue[k] = self._retired_queue.get(k, 0) + n
        if not c.eof:
            self._sel.unregister(c.sock)
        c.sock.close()
        if self._stop.level >= core.STOPPING or code == 0:
            # Stopping, or it stopped by itself (max_items, its queue drained): done.
            self._codes.append(code)
            log.info("supervisor: worker process %d exited (%s)", c.proc.pid, code)
            return
        lived = _monotonic() - c.started
        wait = self._restarts.exited(code, lived)
        if wait is None:
            log.error(
                "supervisor: worker processes keep exiting soon after they start (the last, %d, "
                "with status %s); giving up", c.proc.pid, code,
            )  # fmt: skip
            self._codes.append(1)
            self._stop.request(core.STOPPING, "worker processes keep failing")
            return
        self.restarts += 1
        why = (
            "a handler was stuck past its time limit"
            if code == core.EXIT_STUCK
            else f"exit status {code}"
        )
        log.warning("supervisor: worker process %d exited (%s) after %.1f s; starting another "
                    "in %.1f s", c.proc.pid, why, lived, wait)  # fmt: skip
        self._due[c.index] = _monotonic() + wait

    def _kill(self, c: _Child) -> None:
        if c.proc.poll() is None:
            c.proc.kill()
        try:
            c.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("supervisor: worker process %d does not die", c.proc.pid)

    # -- what the metrics endpoint reads ----------------------------------------------------

    def reports(self) -> list[dict[str, Any]]:
        """The latest report of each live child (``worker`` and ``queue`` stats), then one
        with the summed counters of those that exited (its worker stats marked
        ``retired``), if any did."""
        with self._lock:
            out = [c.report for c in self._children.values() if c.report is not None]
            if self._retired:
                out.append({"worker": {**self._retired, "retired": True},
                            "queue": dict(self._retired_queue)})  # fmt: skip
            return out

    def health(self) -> dict[str, Any]:
        """Ok while every child runs, reported within ``3 * REPORT_PERIOD`` and is ok."""
        now = _monotonic()
        with self._lock:
            children = list(self._children.values())
        procs = []
        ok = len(children) == self.processes and self._stop.level == core.RUNNING
        for c in children:
            fresh = c.report is not None and now - c.reported_at <= 3 * core.REPORT_PERIOD
            h = (c.report or {}).get("health") or {}
            good = fresh and bool(h.get("ok"))
            ok = ok and good
            procs.append({"pid": c.proc.pid, "ok": good, "status": h.get("status") if fresh
                          else "no report", "in_hand": h.get("in_hand")})  # fmt: skip
        return {"ok": ok, "state": core.LEVELS[self._stop.level], "processes": procs,
                "restarts": self.restarts}  # fmt: skip


class ChildChannel:
    """A worker process's end of its supervisor's socket: ``stop``/``abort`` lines (and
    the end of the socket) stop ``worker``; its reports go up every ``REPORT_PERIOD``."""

    def __init__(self, fd: int, worker: Any, queue: Any) -> None:
        os.set_inheritable(fd, False)  # not to a process the handler starts
        self._sock = socket.socket(fileno=fd)
        self._worker = worker
        self._queue = queue
        self._done = threading.Event()
        self._sending = threading.Lock()  # the last report and a periodic one: whole lines

    def start(self) -> ChildChannel:
        for fn, name in ((self._listen, "listen"), (self._report_loop, "report")):
            threading.Thread(target=fn, name=f"bucketq-worker-{name}", daemon=True).start()
        return self

    def _listen(self) -> None:
        try:
            for line in self._sock.makefile("rb"):
                cmd = line.strip()
                if cmd == b"stop":
                    self._worker.stop(reason="the supervisor said stop")
                elif cmd == b"abort":
                    self._worker.stop(now=True, reason="the supervisor said abort")
        except OSError:
            pass  # the same as its end: the supervisor is gone
        if not self._done.is_set():
            self._worker.stop(reason="the supervisor process is gone")

    def _report_loop(self) -> None:
        while not self._done.wait(core.REPORT_PERIOD):
            if not self.report():
                return

    def report(self) -> bool:
        try:
            line = json.dumps(
                {"pid": os.getpid(), "worker": self._worker.stats(),
                 "queue": self._queue.stats(), "health": self._worker.health()},
                default=str,
            )  # fmt: skip
            with self._sending:
                self._sock.sendall(line.encode() + b"\n")
            return True
        except OSError:
            return False

    def close(self) -> None:
        """Send the last report (its final counters) and stop reporting."""
        self._done.set()
        self.report()
