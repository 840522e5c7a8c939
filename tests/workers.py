"""Worker processes for the multi-process and fault tests (run by path, not imported).

    python tests/workers.py consume URI DB QUEUE OUTFILE [--options JSON]
        reserve+commit until idle for --idle seconds; append "payload_id\\ttries" lines.
    python tests/workers.py hold URI DB QUEUE OUTFILE --commit N [--flush-commits]
        reserve N+rest items, commit N of them, print READY and sleep (to be killed).
    python tests/workers.py push URI DB QUEUE OUTFILE --count N
        push N items, append the id of each item whose receipt resolved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pymongo import MongoClient  # noqa: E402

from bucketq import Queue  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("uri")
    ap.add_argument("db")
    ap.add_argument("queue")
    ap.add_argument("out")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--commit", type=int, default=0)
    ap.add_argument("--flush-commits", action="store_true")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    a = ap.parse_args()
    client = MongoClient(a.uri)
    q = Queue(client[a.db], a.queue, **json.loads(a.options))
    out = open(a.out, "a", buffering=1)  # noqa: SIM115 - line-buffered, survives SIGKILL
    if a.mode == "consume":
        while True:
            m = q.reserve(timeout=a.idle)
            if m is None:
                break
            q.commit(m)
            out.write(f"{m.payload['i']}\t{m.tries}\n")
        q.close()
    elif a.mode == "hold":
        for _ in range(a.commit):
            m = q.reserve(timeout=10)
            q.commit(m, flush=a.flush_commits)
            out.write(f"{m.payload['i']}\t{m.tries}\n")
        q.reserve(timeout=10)  # one more, never committed
        print("READY", flush=True)
        time.sleep(3600)
    elif a.mode == "push":
        for i in range(a.start, a.start + a.count):
            r = q.push({"i": i})
            if i % 50 == 49:
                r.wait()
                out.write("".join(f"{k}\n" for k in range(i - 49, i + 1)))
        q.close()
    else:
        raise SystemExit(f"unknown mode {a.mode}")


if __name__ == "__main__":
    main()
