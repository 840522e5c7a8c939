"""The loop of one benchmark worker, written once: open the queue, push this worker's
share, consume until the workers together committed N items, close.

Written as async code, from which ``scripts/unasync.py`` generates the sync twin, so
the two flavours differ only by their awaits. The loop holds only the
calls to the queue and the tally of what came back; the rest is
:class:`bucketq.benchmark._worker.Worker` (phase boundaries, payloads in steps, progress,
the stop-at-N rule), called once per step, never per item. The inner loops are written
out per item because a function call or a list per item would show in the client CPU
they measure.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import OperationTimeout
from .._worker import Worker


async def run(w: Worker, open_handle: Any) -> dict[str, Any]:
    """Drive the :class:`~bucketq.benchmark._contenders.Handle` that ``open_handle(uri,
    db_name)`` returns through both phases; returns the worker's report."""
    h = await open_handle(w.uri, w.db)
    w.opened()
    per_call, poll = w.per_call, w.poll

    w.begin("push")
    if per_call:
        push_many = h.push_many
        for chunk in w.chunks():
            await push_many(chunk)
    else:
        push = h.push
        for chunk in w.chunks():
            for p in chunk:
                await push(p)
    await h.flush()
    w.end("push")

    w.begin("consume")
    reserve, commit, done, idx = h.reserve, h.commit, w.done, w.idx
    reserve_many, commit_many = h.reserve_many, h.commit_many
    own = s1 = s2 = 0  # items committed; sum and sum of squares of their numbers
    check_at = w.next_check(own)
    while check_at:  # 0 once the shared counter says N items are committed
        if per_call:
            while own < check_at:
                try:
                    msgs = await reserve_many(per_call, poll)
                except OperationTimeout:  # a claim's answer was late: retrying it is safe
                    break
                if not msgs:
                    break
                for m in msgs:
                    i = m.payload["i"]
                    s1 += i
                    s2 += i * i
                await commit_many(msgs)
                own += len(msgs)
                done[idx] = own  # progress, seen by the parent
        else:
            while own < check_at:
                try:
                    m = await reserve(poll)
                except OperationTimeout:
                    break
                if m is None:
                    break
                i = m.payload["i"]
                s1 += i
                s2 += i * i
                await commit(m)
                own += 1
                done[idx] = own  # progress, seen by the parent (a store; the sum is read rarely)
        check_at = w.next_check(own)
    await h.flush()
    w.end("consume")

    t = time.monotonic()
    await h.close()
    return w.report((own, s1, s2), time.monotonic() - t)
