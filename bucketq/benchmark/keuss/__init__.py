"""``bucketq bench keuss``: bucketq's ``Queue`` against keuss's ``bucket-mongo-safe``
queue (Node.js, the design bucketq's buckets come from), on the same MongoDB server.

Per round, bucketq first, then keuss: N items (~100-byte payloads, the same for both)
pushed by one producer process until stored, then reserved and committed one at a time
by one consumer process until N are committed and the queue is empty. bucketq runs in
``bucketq bench``'s worker (one spawned process, producer then consumer); keuss runs as
two ``node`` processes (``driver.js`` beside this file: a producer and a consumer, both
connected before the clock starts). Reported per round and as medians of the rounds:
push/s, consume/s, end-to-end/s (N over push time + consume time) for both and their
ratio, with the machine's load average, and bucketq's client CPU per item beside the
BSON floor (keuss's node CPU per item beside it).

keuss comes from the npm registry the first time (``npm install --prefix DIR keuss@2``
into ``$XDG_CACHE_HOME/bucketq/keuss``, else ``~/.cache/bucketq/keuss``, or
``--keuss-dir``); nothing of it is in bucketq's repository. It needs ``node`` and ``npm``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue as queue_mod
import shutil
import statistics
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from ... import _validate as v

DEFAULT_N = 50_000
QUICK_N = 5_000
DEFAULT_ROUNDS = 3
#: What npm installs: keuss's major version 2 (its bucket-mongo-safe backend).
KEUSS_SPEC = "keuss@2"
#: The goal: bucketq this many times keuss's consume/s and end-to-end/s.
GOAL = 15.0
DRIVER = Path(__file__).with_name("driver.js")
QUEUE = "bench"
#: How long a keuss process may take to connect and open its queue.
READY_TIMEOUT = 60.0
#: How long a keuss phase may take before the run is declared stuck.
PHASE_TIMEOUT = 900.0
NPM_TIMEOUT = 600.0


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bucketq" / "keuss"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise RuntimeError(
            f"{name} is not installed: `bucketq bench keuss` runs keuss under Node.js; "
            "install Node.js 18 or later (with npm) and run it again."
        )
    return found


def ensure_keuss(where: Path) -> str:
    """Install keuss from npm into ``where`` unless it is there; its version."""
    _tool("node")
    npm = _tool("npm")
    pkg = where / "node_modules" / "keuss" / "package.json"
    if not pkg.exists():
        where.mkdir(parents=True, exist_ok=True)
        print(f"installing {KEUSS_SPEC} from npm into {where} ...", file=sys.stderr)
        cmd = [npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", KEUSS_SPEC]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=NPM_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"`{' '.join(cmd)}` did not finish in {NPM_TIMEOUT:.0f} s; check that the "
                "npm registry is reachable and run it again."
            ) from exc
        if done.returncode != 0 or not pkg.exists():
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit code {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-600:]}"
            )
    return str(json.loads(pkg.read_text())["version"])


class _Node:
    """One ``node driver.js`` process, its stdout read line by line on a thread so that
    every wait for it has a deadline."""

    def __init__(self, mode: str, where: Path, uri: str, n: int) -> None:
        self.mode = mode
        args = [_tool("node"), str(DRIVER), mode, str(where), uri, QUEUE, str(n)]
        # keuss logs through `debug`: with DEBUG set its stderr, read only at the end, could fill.
        env = {k: val for k, val in os.environ.items() if k != "DEBUG"}
        self.p = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env,
        )  # fmt: skip
        self.lines: queue_mod.Queue[str | None] = queue_mod.Queue()
        threading.Thread(target=self._read, name=f"keuss-{mode}", daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue_mod.Empty:
            raise RuntimeError(
                f"the keuss {self.mode} process said nothing for {timeout:.0f} s."
            ) from None
        if line is None:
            self.p.wait(10)
            err = self.p.stderr.read() if self.p.stderr else ""
            raise RuntimeError(
                f"the keuss {self.mode} process ended (exit code {self.p.returncode}): {err.strip()[-2000:]}"
            )
        return dict(json.loads(line))

    def go(self) -> dict[str, Any]:
        assert self.p.stdin is not None
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        return self.answer(PHASE_TIMEOUT)

    def stop(self) -> None:
        """Closing stdin ends a process that has not finished its phase (driver.js)."""
        if self.p.stdin is not None and not self.p.stdin.closed:
            try:
                self.p.stdin.close()
            except OSError:
                pass
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def _keuss_round(uri: str, where: Path, n: int, pid: int | None = None) -> dict[str, Any]:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    from .._contenders import journaled, with_database
    from .._stats import checksum

    db_name = f"bucketq_bench_keuss_{uuid.uuid4().hex[:10]}"
    db_uri = with_database(journaled(uri), db_name)  # keuss waits for the journal as bucketq
    procs = [_Node("produce", where, db_uri, n), _Node("consume", where, db_uri, n)]
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        for p in procs:
            p.answer(READY_TIMEOUT)
        c0 = _server_cpu_s(pid)
        push = procs[0].go()
        c1 = _server_cpu_s(pid)
        consume = procs[1].go()
        c2 = _server_cpu_s(pid)
        left = list(client[db_name][QUEUE].aggregate([{"$group": {"_id": 1, "n": {"$sum": "$n"}}}]))
        remaining = int(left[0]["n"]) if left else 0
    finally:
        for p in procs:
            p.stop()
        try:
            client.drop_database(db_name)
        except PyMongoError as exc:  # never hide why the run ended
            print(f"could not drop the benchmark database {db_name}: {exc}", file=sys.stderr)
        client.close()
    expected = checksum(range(n))
    got = [(r["checksum"][0], r["checksum"][1], int(r["checksum"][2])) for r in (push, consume)]
    if got[0] != expected or got[1] != expected or remaining:
        raise RuntimeError(
            f"keuss did not deliver every item exactly once: pushed {got[0][0]:,}, committed "
            f"{got[1][0]:,} of {n:,} (checksums {'equal' if got[0] == got[1] else 'differ'}), "
            f"{remaining:,} left in the queue."
        )
    return {"push_s": push["wall_s"], "consume_s": consume["wall_s"],
            "cpu_s": push["cpu_s"] + consume["cpu_s"],
            "push_cpu_s": push["cpu_s"], "consume_cpu_s": consume["cpu_s"],
            "push_server_cpu_s": _spent(c0, c1), "consume_server_cpu_s": _spent(c1, c2),
            "push_commands": push.get("commands"),
            "consume_commands": consume.get("commands")}  # fmt: skip


def _bucketq_round(uri: str, n: int, pid: int | None = None) -> dict[str, Any]:
    from .._runner import RunSpec, run_spec

    r = run_spec(
        uri, RunSpec("bucketq Queue", n, 1, n), lambda pushed, committed: None, server_pid=pid
    )
    # One worker: the server's CPU in its phases is the run's.
    w = r.workers[0]
    if not r.items_ok:
        raise RuntimeError(f"bucketq did not deliver every item exactly once: {r.items_problem}.")
    return {"push_s": r.push_s, "consume_s": r.consume_s, "cpu_s": r.cpu_s,
            "push_cpu_s": sum(w.push_cpu_s for w in r.workers),
            "consume_cpu_s": sum(w.consume_cpu_s for w in r.workers),
            "push_commands": w.push_commands, "consume_commands": w.consume_commands,
            "push_server_cpu_s": w.push_server_cpu_s,
            "consume_server_cpu_s": w.consume_server_cpu_s,
            "floor_us": r.floor_us, "commands_per_1000": r.commands_per_1000}  # fmt: skip


def _rates(r: dict[str, Any], n: int) -> dict[str, float]:
    out = {"push": n / r["push_s"], "consume": n / r["consume_s"],
           "e2e": n / (r["push_s"] + r["consume_s"]), "cpu_us": 1e6 * r["cpu_s"] / n}  # fmt: skip
    if r.get("server_cpu_s") is not None:
        out["server_cpu_us"] = 1e6 * r["server_cpu_s"] / n
    return out


def _server_cpu_s(pid: int | None) -> float | None:
    """CPU seconds the embedded server's process used so far (Linux; None elsewhere or
    for a server given by URI): each contender's run is charged what the server spent."""
    from .._worker import process_cpu_s

    return process_cpu_s(pid)


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _charge(row: dict[str, Any], who: str, before: float | None, after: float | None) -> None:
    row[who]["server_cpu_s"] = _spent(before, after)


FIGURES = ("push", "consume", "e2e")


def run(
    mongodb_uri: str | None,
    *,
    n: int | None = None,
    quick: bool = False,
    rounds: int = DEFAULT_ROUNDS,
    keuss_dir: str | None = None,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Run the rounds, print the table, write the JSON (``json_path``); returns it."""
    from ...embedded import EmbeddedServer
    from .._runner import environment

    n = n or (QUICK_N if quick else DEFAULT_N)
    where = Path(keuss_dir) if keuss_dir else default_dir()
    version = ensure_keuss(where)
    uri = v.mongodb_uri(mongodb_uri, running_store=False) or None
    embedded = None if uri else EmbeddedServer().start()
    uri = uri or str(embedded.uri)  # type: ignore[union-attr]
    out: dict[str, Any] = {"n": n, "rounds": []}
    try:
        env = environment(uri, embedded is not None, ["bucketq Queue"])
        env["versions"]["keuss"] = version
        env["versions"]["node"] = subprocess.run(
            [_tool("node"), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        out["env"] = env
        print(f"bucketq bench keuss: N = {n:,}, {rounds} round(s), bucketq Queue then keuss "
              f"{version} bucket-mongo-safe on {env['server']['description']}", file=sys.stderr)  # fmt: skip
        pid = embedded.pid if embedded is not None else None
        for k in range(rounds):
            row: dict[str, Any] = {"load_avg_1m": [os.getloadavg()[0]]}
            print(f"round {k + 1}: bucketq ...", file=sys.stderr)
            c0 = _server_cpu_s(pid)
            row["bucketq"] = _bucketq_round(uri, n, pid)
            c1 = _server_cpu_s(pid)
            _charge(row, "bucketq", c0, c1)
            row["load_avg_1m"].append(os.getloadavg()[0])
            print(f"round {k + 1}: keuss ...", file=sys.stderr)
            row["keuss"] = _keuss_round(uri, where, n, pid)
            _charge(row, "keuss", c1, _server_cpu_s(pid))
            row["load_avg_1m"].append(os.getloadavg()[0])
            out["rounds"].append(row)
    finally:
        if embedded is not None:
            embedded.stop()
    out["summary"] = summarize(out["rounds"], n)
    _report(out)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
        print(f"every figure: {json_path}")
    return out


def summarize(rounds: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Per round: both contenders' rates and their ratios; then the medians of each."""
    per = []
    for r in rounds:
        b, k = _rates(r["bucketq"], n), _rates(r["keuss"], n)
        per.append({"bucketq": b, "keuss": k, "ratio": {f: b[f] / k[f] for f in FIGURES},
                    "floor_us": r["bucketq"]["floor_us"], "load": max(r["load_avg_1m"])})  # fmt: skip
    med = statistics.median
    return {
        "per_round": per,
        "split": _split(rounds, n),
        "median": {
            who: {
                f: med(p[who][f] for p in per)
                for f in (*FIGURES, "cpu_us", "server_cpu_us")
                if all(f in p[who] for p in per)
            }  # fmt: skip
            for who in ("bucketq", "keuss")
        }
        | {"ratio": {f: med(p["ratio"][f] for p in per) for f in FIGURES}},
        "floor_us": min(p["floor_us"] for p in per),
        "load_avg_1m": [min(p["load"] for p in per), max(p["load"] for p in per)],
    }


PHASES = ("push", "consume")


def _phase(r: dict[str, Any], phase: str, n: int) -> dict[str, Any]:
    """One contender's phase of one round, per item: wall and client CPU (µs), the
    embedded server's CPU (µs; None when not measured) and its commands (per 1,000
    items, by name: the queue's work, without connection and setup commands; None when
    not counted)."""
    from .._stats import queue_commands

    server = r.get(f"{phase}_server_cpu_s")
    commands = r.get(f"{phase}_commands")
    return {
        "wall_us": 1e6 * r[f"{phase}_s"] / n,
        "cpu_us": 1e6 * r[f"{phase}_cpu_s"] / n,
        "server_cpu_us": None if server is None else 1e6 * server / n,
        "commands_per_1000": None
        if commands is None
        else {k: 1000 * c / n for k, c in queue_commands(commands).items()},
    }


def _split(rounds: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Where each contender's time goes, phase by phase: the medians over the rounds of
    :func:`_phase`'s figures (a command's median per 1,000 items counts 0 in a round
    that did not send it)."""
    med = statistics.median
    out: dict[str, Any] = {}
    for who in ("bucketq", "keuss"):
        for phase in PHASES:
            got = [_phase(r[who], phase, n) for r in rounds]
            row: dict[str, Any] = {k: med(g[k] for g in got) for k in ("wall_us", "cpu_us")}
            servers = [g["server_cpu_us"] for g in got]
            row["server_cpu_us"] = None if None in servers else med(servers)
            counts = [g["commands_per_1000"] for g in got]
            if any(c is None for c in counts):
                row["commands_per_1000"] = None
            else:
                names = sorted({k for c in counts for k in c})
                row["commands_per_1000"] = {k: med(c.get(k, 0.0) for c in counts) for k in names}
            out.setdefault(who, {})[phase] = row
    return out


def _split_lines(split: dict[str, Any]) -> list[str]:
    """The split as a table: per contender and phase, µs per item (wall, client CPU,
    server CPU) and commands per 1,000 items."""
    lines = [
        "| contender | phase | wall µs/item | client CPU µs/item | server CPU µs/item "
        "| commands per 1,000 items |",
        "|---|---|---:|---:|---:|---|",
    ]
    for who, phases in split.items():
        for phase, row in phases.items():
            server = "-" if row["server_cpu_us"] is None else f"{row['server_cpu_us']:.2f}"
            cmds = row["commands_per_1000"]
            if cmds is None:
                named = "not counted"
            else:
                named = ", ".join(f"{k} {v:.2f}" for k, v in cmds.items() if v) or "none"
                named = f"{sum(cmds.values()):.2f} ({named})"
            lines.append(f"| {who} | {phase} | {row['wall_us']:.2f} | {row['cpu_us']:.2f} | "
                         f"{server} | {named} |")  # fmt: skip
    return lines


def _report(out: dict[str, Any]) -> None:
    s = out["summary"]
    print()
    print(
        "| round | figure | bucketq items/s | keuss items/s | bucketq / keuss | goal | load avg (1 min) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    names = {"push": "push/s", "consume": "consume/s", "e2e": "end-to-end/s"}
    rows = [(str(i + 1), p, f"{p['load']:.1f}") for i, p in enumerate(s["per_round"])]
    lo, hi = s["load_avg_1m"]
    rows.append(("median", s["median"], f"{lo:.1f}-{hi:.1f}"))
    for label, p, load in rows:
        for f in FIGURES:
            goal = f"{GOAL:g}x" if f != "push" else ""
            print(f"| {label} | {names[f]} | {p['bucketq'][f]:,.0f} | {p['keuss'][f]:,.0f} | "
                  f"{p['ratio'][f]:.1f}x | {goal} | {load} |")  # fmt: skip
    m = s["median"]
    print()
    print("where the time goes (medians of the rounds):")
    for line in _split_lines(s["split"]):
        print(line)
    print()
    print(f"client CPU per item (median): bucketq {m['bucketq']['cpu_us']:.2f} µs "
          f"({m['bucketq']['cpu_us'] / s['floor_us']:.1f}x the BSON floor of {s['floor_us']:.2f} µs: "
          f"encode + decode of each payload), keuss (node) {m['keuss']['cpu_us']:.2f} µs")  # fmt: skip
    if "server_cpu_us" in m["bucketq"] and "server_cpu_us" in m["keuss"]:
        print(f"embedded server CPU per item (median, the whole run): bucketq "
              f"{m['bucketq']['server_cpu_us']:.2f} µs, keuss {m['keuss']['server_cpu_us']:.2f} µs")  # fmt: skip
    missed = [names[f] for f in ("consume", "e2e") if m["ratio"][f] < GOAL]
    print(
        f"goal {GOAL:g}x keuss for consume and end to end: "
        + (f"missed for {', '.join(missed)}" if missed else "met")
    )


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..cli import add_bench_parser, run_command

    p = add_bench_parser(sub, "keuss", "bucketq's Queue against keuss's bucket-mongo-safe "
                         "(Node.js, from npm) on the same server", __doc__)  # fmt: skip
    p.add_argument("--n", type=v.cli_count(1), default=None,
                   help=f"items per run (default {DEFAULT_N:,}; --quick: {QUICK_N:,})")  # fmt: skip
    p.add_argument("--quick", action="store_true", help=f"{QUICK_N:,} items per run")
    p.add_argument("--rounds", type=v.cli_count(1), default=DEFAULT_ROUNDS,
                   help=f"rounds, bucketq then keuss in each (default {DEFAULT_ROUNDS})")  # fmt: skip
    p.add_argument("--keuss-dir", metavar="DIR",
                   help=f"where keuss is installed from npm (default {default_dir()})")  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    v.add_mongodb_uri(p, v.STARTS_ONE)

    def run_from_args(a: argparse.Namespace) -> int:
        return run_command("bucketq bench keuss", lambda: run(
            a.mongodb_uri, n=a.n, quick=a.quick, rounds=a.rounds, keuss_dir=a.keuss_dir,
            json_path=a.json), a.json)  # fmt: skip

    p.set_defaults(func=run_from_args)
    return p
