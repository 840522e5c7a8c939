"""The ``bucketq bench ingest`` subcommand: its options and the call into the runner."""

from __future__ import annotations

import argparse

from ... import _validate as v
from ._stats import MODES


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ingest",
        help="latency of `bucketq serve`'s POST /api/v1/ingest, buffer off and per transport",
        description=(
            "Open-loop load on POST /api/v1/ingest: requests at a constant arrival rate, each "
            "latency measured from its scheduled send time. One `bucketq serve` process per "
            "mode (buffer off, memory, redis, bucketq, passthrough), each with fresh "
            "collections on the same MongoDB server."
        ),
    )
    p.add_argument("--quick", action="store_true", help="30 s per mode instead of 180 s")
    p.add_argument("--rate", type=float, help="requests per second (default 100)")
    p.add_argument("--duration", type=float, help="seconds of load per mode (default 180)")
    p.add_argument("--batch", type=int, help="log records per request (default 10)")
    p.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        help="run only this mode (repeatable; default: all of them)",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="also double the rate from --rate until p95 passes 1 s or errors appear, per mode",
    )
    p.add_argument(
        "--sweep-duration", type=float, help="seconds per sweep step (default 20, --quick 10)"
    )
    p.add_argument(
        "--limits",
        action="store_true",
        help="instead: capacity (100 records per request, p95 < 250 ms), overload at twice it, "
        "and the hostile neighbour run; default modes off, memory, redis, bucketq",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=("capacity", "hostile"),
        help="with --limits, run only this part (repeatable): capacity (the capacity search "
        "and the overload at twice it) or hostile (the hostile neighbour)",
    )
    p.add_argument(
        "--hostile-duration",
        type=float,
        help="seconds of the hostile neighbour's good traffic, in alternating quiet and hostile "
        "windows of up to 5 s (default 60, --quick 20)",
    )
    p.add_argument(
        "--layout",
        action="append",
        choices=("buckets", "documents"),
        help="how the service stores log records (repeatable; default buckets): documents is "
        "one document per record, the layout of releases before the bucketed log store; with "
        "both, each mode runs with each, side by side",
    )
    p.add_argument("--json", metavar="PATH", help="write every figure and the environment to PATH")
    p.add_argument("--plots", metavar="DIR", help="the PNG goes here (default: bench-results/)")
    p.add_argument("--no-plots", action="store_true", help="write no plot")
    v.add_mongodb_uri(p, v.STARTS_ONE)
    p.add_argument("--redis-url", help="Redis for the redis mode (default: $REDIS_URL)")
    p.set_defaults(func=run_from_args)
    return p


def run_from_args(args: argparse.Namespace) -> int:
    from ..cli import plots_dir, run_command
    from ._runner import DEFAULT_PLOTS_DIR, run, settings_for

    def body() -> None:
        settings = settings_for(quick=args.quick, rate=args.rate, duration=args.duration,
                                batch=args.batch, modes=args.mode, sweep=args.sweep,
                                sweep_duration=args.sweep_duration, redis_url=args.redis_url,
                                limits=args.limits, only=args.only,
                                hostile_duration=args.hostile_duration,
                                layouts=args.layout)  # fmt: skip
        run(args.mongodb_uri, settings, json_path=args.json,
            plots_dir=plots_dir(args, DEFAULT_PLOTS_DIR))  # fmt: skip

    return run_command("bucketq bench ingest", body, args.json)
