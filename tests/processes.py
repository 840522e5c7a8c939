"""Processes as a test sees them from ``/proc``, and frozen for real: SIGSTOP (their
connections stay open, nothing answers) until a block ends, then SIGCONT. Import from
any test (``tests/`` is on ``sys.path``)::

    from processes import alive, frozen
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from waiting import eventually


def state(stat: str) -> str | None:
    """The state letter in a ``/proc`` ``stat`` file (``T`` stopped, ``Z`` zombie, ...),
    or None when the process or thread is gone."""
    try:
        with open(stat) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def alive(pid: int) -> bool:
    """``pid`` runs (or sleeps, or is stopped): neither gone nor a zombie."""
    return state(f"/proc/{pid}/stat") not in (None, "Z")


def _all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (a thread that is gone counts as stopped)."""
    tasks = f"/proc/{pid}/task"
    return all(state(f"{tasks}/{tid}/stat") in (None, "T", "t") for tid in os.listdir(tasks))


@contextmanager
def frozen(pid: int | None) -> Iterator[None]:
    """SIGSTOP ``pid`` until the block ends; the block starts once every thread of it is
    stopped (a thread already running may otherwise answer one more request)."""
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        if os.path.isdir(f"/proc/{pid}/task"):
            eventually(lambda: _all_stopped(pid), what=f"process {pid} to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
