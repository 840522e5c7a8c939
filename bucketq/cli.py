"""The ``bucketq`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .embedded import URI_ENV


def _bench(args: argparse.Namespace) -> int:
    from .benchmark import CONTENDERS, DEFAULT_PLOTS_DIR, run
    from .errors import BucketQError

    names = args.contender or list(CONTENDERS)
    unknown = [c for c in names if c not in CONTENDERS]
    if unknown:
        print(f"unknown contender(s): {unknown}; choose from {list(CONTENDERS)}", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C: workers are stopped, the run's database dropped, the
    # embedded server stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run(
            args.mongodb_uri,
            quick=args.quick,
            n=args.n,
            sizes=args.sizes,
            procs=args.procs,
            element_n=args.element_n,
            contenders=names,
            repeat=args.repeat,
            json_path=args.json,
            plots_dir=None if args.no_plots else (args.plots or DEFAULT_PLOTS_DIR),
        )
    except (RuntimeError, BucketQError) as exc:
        print(f"bucketq bench: {exc}", file=sys.stderr)
        return 1
    return 0


def _int_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def _server(args: argparse.Namespace) -> int:
    from .embedded import EmbeddedServer

    server = EmbeddedServer(args.data, port=args.port, standalone=args.standalone).start()
    print(server.uri, flush=True)
    print(
        f"embedded server pid {server.pid}, data in {server.storage_path}; Ctrl-C stops it",
        file=sys.stderr,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if not server.running():
            print("the embedded server exited", file=sys.stderr)
            return 1
    server.stop(keep_data=args.data is not None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bucketq", description="A durable bucket-packing queue on MongoDB."
    )
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "bench",
        help="benchmark bucketq against one-document-per-item queues on one server",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="100,000 items (per-element 500) plus a small scaling slice: under two minutes",
    )
    b.add_argument("--n", type=int, help="one N for bucketq (instead of the preset's sizes)")
    b.add_argument("--sizes", type=_int_list, help="Ns for bucketq, e.g. 10000,100000,1000000")
    b.add_argument("--procs", type=_int_list, help="producer and consumer processes, e.g. 1,2,4")
    b.add_argument("--element-n", type=int, help="per-element N at the largest size (halved below)")
    b.add_argument("--contender", action="append", help="run only this contender (repeatable)")
    b.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="run each (N, processes) group K times; the table shows medians and their range",
    )
    b.add_argument("--json", metavar="PATH", help="write every figure and the environment to PATH")
    b.add_argument("--plots", metavar="DIR", help="PNG plots go here (default: bench-results/)")
    b.add_argument("--no-plots", action="store_true", help="write no plots")
    b.add_argument(
        "--mongodb-uri", help=f"use this MongoDB (default: ${URI_ENV}, else the embedded server)"
    )
    b.set_defaults(func=_bench)
    # `bucketq bench` alone is the queue benchmark above; `bucketq bench NAME` runs another
    # benchmark, each adding its subcommand here with its own options.
    bench_sub = b.add_subparsers(
        dest="bench_command", required=False, title="other benchmarks", metavar="BENCHMARK"
    )
    from .benchmark.ingest.cli import add_parser as add_ingest_bench

    add_ingest_bench(bench_sub)
    from .sdk._bench import add_parser as add_sdk_bench

    add_sdk_bench(bench_sub)

    s = sub.add_parser(
        "server", help="run the embedded MongoDB-wire server in the foreground, print its URI"
    )
    s.add_argument("--port", type=int, default=27017)
    s.add_argument("--data", help="data directory (default: a temporary one, removed on exit)")
    s.add_argument("--standalone", action="store_true", help="faster writes, no change streams")
    s.set_defaults(func=_server)

    from .reservoir.cli import add_dlq_parser
    from .spark.pipeline import DESCRIPTION, add_arguments, run_from_args

    add_dlq_parser(sub)
    from .server.cli import add_parsers as add_server_parsers

    add_server_parsers(sub)
    from .quarantine_cli import add_quarantine_parser

    add_quarantine_parser(sub)
    from .sdk._replay import add_sdk_parser

    add_sdk_parser(sub)
    pl = sub.add_parser(
        "pipeline",
        help="stream log records from a stream-mode queue into Parquet with Spark (needs bucketq[spark])",
        description=DESCRIPTION,
    )
    add_arguments(pl).set_defaults(func=run_from_args)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
