"""Keep the embedded server running: ``bucketq serve`` and ``bucketq store`` run it under
a :class:`StoreSupervisor`.

The supervisor's thread looks at the server process every :data:`CHECK_INTERVAL`
seconds (reaping it when it exits: no zombie) and asks its storage to write (a
journaled update of one document in :data:`PROBE_DATABASE`) and to read
(``listDatabases``). It notices two deaths:

- the process exited (a signal, the OOM killer, a crash): said once, at ERROR, with the
  signal or exit code and the last lines of the server's output;
- the process lives but its storage failed: the embedded server's WiredTiger may panic
  on a write error such as a full disk and answer every command with an error, or answer
  writes with errors and nothing else, also once the disk is mended: :data:`STRIKES`
  error answers in a row, or no answer for :data:`SILENT_S` while the process runs (a
  stopped one, SIGSTOP, is waited for), and it is killed and counted as dead (a restart
  recovers it from its journal).

Then it restarts the server on the same port and data after a back-off (``backoff_s``,
doubled each failed attempt, at most :data:`BACKOFF_CAP_S`), and once ``restarts``
attempts in a row failed it gives up: ``on_give_up()`` (the command then exits non-zero,
so a supervisor of its own can act). An attempt fails when the server does not start, or
dies again within :data:`STABLE_S` of its start. Every state change is one log line
and one call of ``on_change(state)``; the :class:`StoreState` names it for ``/ready``
("restarting (attempt 2 of 10, died by SIGKILL)").

With ``bucketq serve --workers N`` the state reaches the workers through a small JSON
file (:meth:`StoreState.write`, read by :class:`StateFile`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._guard import backoff
from ._validate import one_line
from .embedded import EmbeddedServer

__all__ = [
    "DEFAULT_RESTART_BACKOFF_S",
    "DEFAULT_RESTARTS",
    "StateFile",
    "StoreState",
    "StoreSupervisor",
    "exit_cause",
]

log = logging.getLogger("bucketq.embedded")

#: Restarts in a row that may fail before the supervisor gives up.
DEFAULT_RESTARTS = 10
#: The first back-off before a restart, in seconds (doubled per failed attempt).
DEFAULT_RESTART_BACKOFF_S = 1.0
#: The longest back-off, in seconds.
BACKOFF_CAP_S = 30.0
#: A server that ran this long after its start counts as restarted for good: the next
#: death starts counting attempts from one again.
STABLE_S = 60.0
#: Seconds between two looks at the server (its process, then its storage).
CHECK_INTERVAL = 1.0
#: Storage errors in a row (answers, not silence) after which the server is restarted.
STRIKES = 3
#: How long one look at the storage may take.
PROBE_TIMEOUT_MS = 3000
#: The database of the supervisor's probe write (one document).
PROBE_DATABASE = "bucketq_supervisor"
#: Seconds a running (not stopped) server may answer no probe before it counts as failed.
SILENT_S = 30.0
#: Lines of the server's output a death report quotes.
TAIL_LINES = 10
#: A cause quoted in the state (``/ready``, 503 answers) is cut to this many characters.
CAUSE_CHARS = 200


def _stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger); True when its state
    cannot be read (no ``/proc``): silence is then never judged."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "tT"


def exit_cause(returncode: int) -> str:
    """How a process ended, in words: ``died by SIGKILL``, ``exited with code 1``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died by {name}"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class StoreState:
    """What the embedded store is doing. ``phase``: ``up``, ``restarting`` (``attempt``
    of ``restarts``, after ``cause``) or ``failed`` (gave up)."""

    phase: str
    attempt: int = 0
    restarts: int = 0
    cause: str = ""
    pid: int | None = None

    @property
    def up(self) -> bool:
        return self.phase == "up"

    def describe(self) -> str:
        """One phrase for ``/ready`` and 503 answers."""
        if self.phase == "up":
            return "up" if self.pid is None else f"up (pid {self.pid})"
        if self.phase == "restarting":
            return f"restarting (attempt {self.attempt} of {self.restarts}, {self.cause})"
        return f"failed: gave up after {self.restarts} restarts ({self.cause})"

    def write(self, path: Path) -> None:
        """Replace ``path`` with this state (read by :class:`StateFile`), whole or not at all."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)


class StateFile:
    """A :class:`StoreState` written by another process (``bucketq serve``'s parent):
    :meth:`current` reads it again at most every ``every`` seconds, so a request pays a
    clock read, not a file read. None when there is no state (no file yet)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        every: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.every = every
        self.clock = clock
        self._state: StoreState | None = None
        self._read_at = float("-inf")

    def current(self) -> StoreState | None:
        now = self.clock()
        if now - self._read_at >= self.every:
            self._read_at = now
            try:
                self._state = StoreState(**json.loads(self.path.read_text()))
            except (OSError, ValueError, TypeError):
                pass  # not written yet (or being replaced): the last state stands
        return self._state


class StoreSupervisor:
    """Watches ``server`` (started already) from a thread of its own; see the module's text.

    ``on_change(state)`` is called at every state change (from the supervisor's thread;
    it must not raise, and errors are logged), and with ``state_path`` the state is written
    there too (:class:`StateFile` reads it). ``on_give_up()`` once, when it gives up.
    :meth:`close` stops watching and stops the server (with ``keep_data``), from the
    supervisor's thread: a server it restarted is tied to that thread (it gets SIGTERM when
    the thread ends, and so when the process is killed)."""

    def __init__(
        self,
        server: EmbeddedServer,
        *,
        restarts: int = DEFAULT_RESTARTS,
        backoff_s: float = DEFAULT_RESTART_BACKOFF_S,
        on_change: Callable[[StoreState], None] | None = None,
        on_give_up: Callable[[], None] | None = None,
        state_path: Path | None = None,
        check_interval: float = CHECK_INTERVAL,
    ) -> None:
        self.server = server
        self.state_path = state_path
        self.restarts = restarts
        self.backoff_s = backoff_s
        self.check_interval = check_interval
        self._on_change = on_change
        self._on_give_up = on_give_up
        self._stop = threading.Event()
        self._keep_data = True
        self.state = StoreState("up", pid=server.pid)
        #: Whether it gave up (the command then exits non-zero).
        self.gave_up = False
        self._thread = threading.Thread(target=self._run, name="bucketq-store-supervisor",
                                        daemon=True)  # fmt: skip

    def start(self) -> StoreSupervisor:
        self._set(self.state)
        self._thread.start()
        return self

    def close(self, *, keep_data: bool = True, timeout: float = 60.0) -> None:
        """Stop watching, then stop the server (its thread does, see the class's text)."""
        self._keep_data = keep_data
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self.server.stop(keep_data=keep_data)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            log.exception("the embedded server's supervisor failed; it no longer restarts it")
        try:
            self._stop.wait()  # a server it restarted lives as long as this thread
        finally:
            self.server.stop(keep_data=self._keep_data)

    def _watch(self) -> None:
        from pymongo import MongoClient

        client: MongoClient[dict[str, Any]] = MongoClient(
            self.server.uri,
            serverSelectionTimeoutMS=PROBE_TIMEOUT_MS,
            connectTimeoutMS=PROBE_TIMEOUT_MS,
            socketTimeoutMS=PROBE_TIMEOUT_MS,
            appname="bucketq-store-supervisor",
        )
        started, strikes = time.monotonic(), 0
        attempt = 0
        try:
            while not self._stop.wait(self.check_interval):
                self.server.retry_log()
                code = self.server.returncode()
                if code is None:
                    failed = self._storage_failed(client)
                    if failed is not None:  # silence neither counts nor forgives
                        strikes = strikes + 1 if failed else 0
                    if strikes < STRIKES:
                        if attempt and time.monotonic() - started >= STABLE_S:
                            attempt = 0  # up for good: the next death counts from one
                        continue
                    cause = f"its storage failed: {self._storage_error}"
                    self.server.kill()
                else:
                    cause = exit_cause(code)
                strikes, self._silent_since = 0, None
                self._report_death(cause)
                attempt = self._restart(attempt, cause)
                if attempt < 0:
                    return
                started = time.monotonic()
        finally:
            client.close()

    _storage_error = ""
    _silent_since: float | None = None

    def _storage_failed(self, client: Any) -> bool | None:
        """Whether the store answered a journaled write or a read with an error (True),
        answered both (False) or nothing (None: neither, unless it has been silent for
        :data:`SILENT_S` while it ran)."""
        from pymongo import WriteConcern
        from pymongo.errors import OperationFailure, PyMongoError

        try:
            # The write first: a store whose writes fail may leave its reads unanswered.
            probe = client[PROBE_DATABASE].get_collection(
                "probe", write_concern=WriteConcern(j=True)
            )
            probe.update_one({"_id": "probe"}, {"$inc": {"n": 1}}, upsert=True)
            client.admin.command("listDatabases", nameOnly=True)
        except OperationFailure as exc:
            self._storage_error = one_line(exc)[:CAUSE_CHARS]
            return True
        except PyMongoError:
            # Silence: a frozen process (SIGSTOP) or a busy one is not restarted; one
            # that runs and answers nothing for SILENT_S is wedged.
            now = time.monotonic()
            if _stopped(self.server.pid):
                self._silent_since = None
            elif self._silent_since is None:
                self._silent_since = now
            elif now - self._silent_since >= SILENT_S:
                self._storage_error = f"it answered nothing for {SILENT_S:.0f} s while it ran"
                return True
            return None
        self._silent_since = None
        return False

    def _report_death(self, cause: str) -> None:
        tail = "".join(self.server.last_lines(TAIL_LINES)).rstrip()
        log.error(
            "the embedded server (pid %s on %s) is down: %s; restarting it on the same port "
            "and data (at most %d attempts). Its last output:\n%s",
            self.state.pid, self.server.address, cause, self.restarts, tail or "(none)",
        )  # fmt: skip

    def _restart(self, attempt: int, cause: str) -> int:
        """Restart until it works (the attempt it took) or the attempts run out (-1)."""
        while not self._stop.is_set():
            attempt += 1
            if attempt > self.restarts:
                self._give_up(cause)
                return -1
            self._set(StoreState("restarting", attempt, self.restarts, cause))
            wait = backoff(attempt, self.backoff_s, BACKOFF_CAP_S)
            if self._stop.wait(wait):
                return attempt
            try:
                self.server.start(tied=True)
            except Exception as exc:  # noqa: BLE001 - a failed attempt: said, counted, retried
                cause = f"restart failed: {one_line(exc)[:CAUSE_CHARS]}"
                log.warning("the embedded server did not start (attempt %d of %d): %s",
                            attempt, self.restarts, one_line(exc))  # fmt: skip
                continue
            self._set(StoreState("up", pid=self.server.pid))
            log.warning("the embedded server is back: pid %s on %s (attempt %d of %d)",
                        self.server.pid, self.server.address, attempt, self.restarts)  # fmt: skip
            return attempt
        return attempt

    def _give_up(self, cause: str) -> None:
        self.gave_up = True
        self._set(StoreState("failed", self.restarts, self.restarts, cause))
        log.error(
            "the embedded server could not be restarted in %d attempts (%s); giving up: "
            "stopping with a non-zero exit code so that a supervisor can act",
            self.restarts, cause,
        )  # fmt: skip
        if self._on_give_up is not None:
            self._on_give_up()

    def _set(self, state: StoreState) -> None:
        self.state = state
        try:
            if self.state_path is not None:
                state.write(self.state_path)
            if self._on_change is not None:
                self._on_change(state)
        except Exception:
            log.exception("publishing the embedded server's state failed")
