"""One processor per configuration, shared by its clients: :func:`acquire` and
:func:`release` count its users, :func:`close_all` closes every one at exit, and a
forked child starts its own afresh."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from ._options import LOGGER_NAME, Config
from ._processor import Processor

log = logging.getLogger(LOGGER_NAME)

_registry: dict[tuple, Processor] = {}
_registry_lock = threading.Lock()


def acquire(cfg: Config) -> Processor:
    """The processor of ``cfg`` (started on first use), with one more user counted."""
    key = cfg.key()
    with _registry_lock:
        proc = _registry.get(key)
        if proc is None or proc.closed:
            proc = Processor(cfg)
            _registry[key] = proc
        proc._users += 1
        return proc


def release(proc: Processor, timeout: float | None = None) -> bool:
    """One user fewer; the last one closes the processor (flushing with ``timeout``)."""
    with _registry_lock:
        proc._users -= 1
        last = proc._users <= 0
    if last:
        return proc.close(timeout)
    return proc.flush(timeout)


def _forget(proc: Processor) -> None:
    with _registry_lock:
        key = proc.cfg.key()
        if _registry.get(key) is proc:
            del _registry[key]


def processors() -> list[Processor]:
    with _registry_lock:
        return list(_registry.values())


def close_all(timeout: float | None = None) -> None:
    """Close every processor (the exit hook); each flushes for at most its own
    ``shutdown_timeout`` and all of them together for at most the largest one."""
    procs = processors()
    if not procs:
        return
    budget = max(p.cfg.shutdown_timeout for p in procs) if timeout is None else timeout
    deadline = time.monotonic() + budget
    for p in procs:
        try:
            left = max(0.0, min(p.cfg.shutdown_timeout, deadline - time.monotonic()))
            p.close(left)
        except Exception:
            log.exception("bucketq.sdk: closing a processor at exit failed")


def _after_fork() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for p in list(_registry.values()):
        p._after_fork_in_child()


atexit.register(close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
