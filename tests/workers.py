"""Worker processes for the multi-process and fault tests (run by path, not imported).

Every mode opens ``Queue(MongoClient(URI)[DB], QUEUE, **json.loads(--options))`` and
appends lines to OUTFILE (line-buffered, so what was written survives a SIGKILL).

    push     push --count items {"i": start..}; after each --batch, wait for the receipts
             and append the ids whose receipts resolved ("i" per line). With --begun FILE,
             append each batch's first id there before pushing it. Prints stats().
    consume  reserve+commit until idle for --idle s; append "i<TAB>tries" per commit.
             Prints stats() as JSON at the end.
    hold     reserve --reserve items, commit --commit of them (--flush-commits: fenced
             flush each), sleep --gap s, commit --late more without a flush, print READY
             and sleep until killed. Appends "i<TAB>tries<TAB>early|late" per commit.
    zombie   like hold (commits flushed), then read one stdin line (sent once the test has
             frozen and resumed it), commit what it still holds, serve whatever reserve()
             gives for --idle s (appending "again<TAB>i"), print stats() as JSON, close.
    poison   reserve; roll back items with payload["poison"] (delay --delay), commit the
             rest; append "t<TAB>i<TAB>tries<TAB>commit|rollback".
    drain    push --count items with a long bucket_max_wait (left open), reserve
             --reserve, commit --commit, print READY; on SIGTERM drain(timeout=0),
             print the report as JSON and exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pymongo import MongoClient

from bucketq import Queue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("uri")
    ap.add_argument("db")
    ap.add_argument("queue")
    ap.add_argument("out")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--reserve", type=int, default=0)
    ap.add_argument("--commit", type=int, default=0)
    ap.add_argument("--late", type=int, default=0)
    ap.add_argument("--gap", type=float, default=0.0)
    ap.add_argument("--delay", type=float, default=0.3)
    ap.add_argument("--flush-commits", action="store_true")
    ap.add_argument("--begun", default=None)
    a = ap.parse_args()
    client = MongoClient(a.uri)
    q = Queue(client[a.db], a.queue, **json.loads(a.options))
    out = open(a.out, "a", buffering=1)  # noqa: SIM115 - line-buffered, survives SIGKILL
    {
        "push": push,
        "consume": consume,
        "hold": hold,
        "zombie": zombie,
        "poison": poison,
        "drain": drain,
    }[a.mode](q, a, out)


def push(q, a, out) -> None:
    end = a.start + a.count
    begun = open(a.begun, "a", buffering=1) if a.begun else None  # noqa: SIM115
    for lo in range(a.start, end, a.batch):
        hi = min(lo + a.batch, end)
        if begun:
            begun.write(f"{lo}\n")
        receipts = q.push_many([{"i": i} for i in range(lo, hi)])
        q.flush()
        for r in receipts:
            assert r.wait(0)
        out.write("".join(f"{i}\n" for i in range(lo, hi)))
        if a.pause:
            time.sleep(a.pause)
    q.close()
    print(json.dumps(q.stats()), flush=True)


def consume(q, a, out) -> None:
    while (m := q.reserve(timeout=a.idle)) is not None:
        q.commit(m, flush=a.flush_commits)
        out.write(f"{m.payload['i']}\t{m.tries}\n")
    q.close()
    print(json.dumps(q.stats()), flush=True)


def _reserve_and_commit(q, a, out, *, flush: bool) -> list:
    held = []
    for _ in range(a.reserve):
        m = q.reserve(timeout=10)
        assert m is not None, "nothing to reserve"
        held.append(m)
    for m in held[: a.commit]:
        assert q.commit(m, flush=flush)
        out.write(f"{m.payload['i']}\t{m.tries}\tearly\n")
    return held[a.commit :]


def hold(q, a, out) -> None:
    rest = _reserve_and_commit(q, a, out, flush=a.flush_commits)
    time.sleep(a.gap)
    for m in rest[: a.late]:
        q.commit(m)
        out.write(f"{m.payload['i']}\t{m.tries}\tlate\n")
    print("READY", flush=True)
    time.sleep(3600)


def zombie(q, a, out) -> None:
    rest = _reserve_and_commit(q, a, out, flush=True)
    print("READY", flush=True)
    sys.stdin.readline()  # the test froze us past the lease, then resumed us
    for m in rest:
        q.commit(m)  # in memory only: the lease is gone, so this must never land
    while (m := q.reserve(timeout=a.idle)) is not None:
        out.write(f"again\t{m.payload['i']}\n")
        q.commit(m)
    time.sleep(3 * q.options.state_flush_period)
    print(json.dumps(q.stats()), flush=True)
    q.close()


def poison(q, a, out) -> None:
    while (m := q.reserve(timeout=a.idle)) is not None:
        if m.payload.get("poison"):
            q.rollback(m, delay=a.delay)
            out.write(f"{time.time()}\t{m.payload['i']}\t{m.tries}\trollback\n")
        else:
            q.commit(m)
            out.write(f"{time.time()}\t{m.payload['i']}\t{m.tries}\tcommit\n")
    q.close()


def drain(q, a, out) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    for i in range(a.start, a.start + a.count):
        q.push({"i": i})
    _reserve_and_commit(q, a, out, flush=True)
    print("READY", flush=True)
    while not stop:
        time.sleep(0.02)
    t0 = time.monotonic()
    report = q.drain(timeout=0)
    report["drain_seconds"] = time.monotonic() - t0
    print(json.dumps(report), flush=True)
    q.close()


if __name__ == "__main__":
    main()
