"""Handlers the worker tests run (in-process, and by name under ``bucketq worker``).

Each appends one line per event to the file ``$WORKER_OUT`` (opened per write with
O_APPEND: lines from several threads or processes never mix, and what was written
survives a SIGKILL): ``EVENT<TAB>i<TAB>tries<TAB>pid``. Events: ``start`` when a handler
begins, ``done`` when it returns, ``fail`` when it raises. A payload's fields steer it:
``sleep`` (seconds, at the start), ``fail_until`` (raise ValueError while tries is
below it), ``retry`` (raise Retry(delay) on the first try; None: Retry()), ``block``
(sleep an hour while tries is below it: a stuck handler).
"""

from __future__ import annotations

import asyncio
import os
import time

from bucketq.worker import Retry


def _note(event: str, m) -> None:
    line = f"{event}\t{m.payload['i']}\t{m.tries}\t{os.getpid()}\n".encode()
    fd = os.open(os.environ["WORKER_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _verdict(m) -> None:
    p = m.payload
    if m.tries < p.get("fail_until", 0):
        _note("fail", m)
        raise ValueError(f"item {p['i']} fails on try {m.tries}")
    if "retry" in p and m.tries == 0:
        _note("fail", m)
        raise Retry(p["retry"])


def handle(m) -> None:
    _note("start", m)
    if m.tries < m.payload.get("block", 0):
        time.sleep(3600)
    time.sleep(m.payload.get("sleep", 0))
    _verdict(m)
    _note("done", m)


async def handle_async(m) -> None:
    _note("start", m)
    if m.tries < m.payload.get("block", 0):
        await asyncio.sleep(3600)
    await asyncio.sleep(m.payload.get("sleep", 0))
    _verdict(m)
    _note("done", m)


def handle_batch(msgs) -> None:
    for m in msgs:
        _note("start", m)
    for m in msgs:
        _note("done", m)


def read(path) -> list[tuple[str, int, int, int]]:
    """The events in the order they were written."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            ev, i, tries, pid = line.rstrip("\n").split("\t")
            out.append((ev, int(i), int(tries), int(pid)))
    return out


def most_at_once(events) -> int:
    """The most handlers that had started and not yet ended at one point of the file."""
    now = top = 0
    for ev, *_ in events:
        now += 1 if ev == "start" else -1
        top = max(top, now)
    return top
