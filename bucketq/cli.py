"""The ``bucketq`` command line."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

from . import _validate as v
from .errors import BucketQError
from .supervisor import DEFAULT_RESTART_BACKOFF_S, DEFAULT_RESTARTS

#: How long a command waits for an unreachable MongoDB before it says so.
CLI_SERVER_TIMEOUT_MS = 3000


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr (no usage block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a command may fail with through no bug of its own: bucketq's errors, and
    servers that cannot be reached or refuse (driver errors, refused connections)."""
    kinds: list[type[BaseException]] = [BucketQError, ConnectionError, TimeoutError]
    try:
        from pymongo.errors import PyMongoError

        kinds.append(PyMongoError)
    except ImportError:  # pragma: no cover - pymongo is a dependency
        pass
    if "redis" in sys.modules:  # imported only by the commands that use it
        from redis.exceptions import RedisError

        kinds.append(RedisError)
    return tuple(kinds)


def _check_reachable(uri: str) -> None:
    """Ping ``uri`` with a short server-selection timeout, so a dead server is one line
    after a few seconds, not a traceback after the driver's 30."""
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    try:
        client: MongoClient[dict[str, Any]]
        with MongoClient(uri, serverSelectionTimeoutMS=CLI_SERVER_TIMEOUT_MS) as client:
            client.admin.command("ping")
    except PyMongoError as exc:
        raise BucketQError(f"cannot reach MongoDB at {uri}: {v.one_line(exc)}") from exc


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise BucketQError(
                f"{host}:{port} is not free ({exc.strerror or exc}); another server is "
                "listening there. Choose another --port (0 picks a free one)."
            ) from exc


def _bench(args: argparse.Namespace) -> int:
    from .benchmark import CONTENDERS, DEFAULT_PLOTS_DIR, run
    from .benchmark.cli import plots_dir, run_command

    names = args.contender or list(CONTENDERS)
    unknown = [c for c in names if c not in CONTENDERS]
    if unknown:
        print(f"unknown contender(s): {unknown}; choose from {list(CONTENDERS)}", file=sys.stderr)
        return 2
    uri = v.mongodb_uri(args.mongodb_uri, running_store=False)
    if uri:
        _check_reachable(uri)
    return run_command(
        "bucketq bench",
        lambda: run(
            uri or None,
            quick=args.quick,
            n=args.n,
            sizes=args.sizes,
            procs=args.procs,
            element_n=args.element_n,
            contenders=names,
            repeat=args.repeat,
            partitions=args.partitions,
            claim=args.claim,
            write_concern=args.write_concern,
            json_path=args.json,
            plots_dir=plots_dir(args, DEFAULT_PLOTS_DIR),
        ),
        args.json,
    )


def _store(args: argparse.Namespace) -> int:
    """The embedded store in the foreground, supervised: restarted on the same port and
    data when it dies; exit 1 when it cannot be restarted (``--restarts``). While it runs
    its URI is in the running store's URI file, where other commands find it."""
    import logging

    from .embedded import EmbeddedServer, PublishedUri
    from .supervisor import StoreSupervisor

    if args.port:
        _check_port_free("127.0.0.1", args.port)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = EmbeddedServer(args.data, port=args.port, standalone=args.standalone, auth=True)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    supervisor = StoreSupervisor(
        server, restarts=args.restarts, backoff_s=args.restart_backoff, on_give_up=stop.set
    ).start()
    published: PublishedUri | None = None
    try:
        # written before the URI is printed: a script that waits for that line finds both
        published = PublishedUri(server.uri)
        print(server.uri, flush=True)
        print(
            f"embedded server pid {server.pid}, data in {server.storage_path}; the URI above "
            "carries its generated password (commands without a URI read it from "
            f"{published.path}); restarted if it dies; Ctrl-C stops it",
            file=sys.stderr,
        )
        while not stop.wait(1.0):
            pass
    finally:
        if published is not None:  # first: a command started now must not find a store stopping
            published.withdraw()
        supervisor.close(keep_data=args.data is not None)
    return 1 if supervisor.gave_up else 0


STORE_HELP = "run the embedded MongoDB-wire store in the foreground, print its URI"


def _store_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--port", type=v.cli_count(0, 65535), default=27017)
    s.add_argument("--data", help="data directory (default: a temporary one, removed on exit)")
    s.add_argument("--standalone", action="store_true", help="faster writes, no change streams")
    s.add_argument(
        "--restarts",
        type=v.cli_count(0),
        default=DEFAULT_RESTARTS,
        metavar="N",
        help=f"a server that died is restarted; after N failed restarts in a row the "
        f"command exits 1 (default {DEFAULT_RESTARTS})",
    )
    s.add_argument(
        "--restart-backoff",
        type=v.cli_number(0.01, 3600.0),
        default=DEFAULT_RESTART_BACKOFF_S,
        metavar="SECONDS",
        help=f"the first wait before a restart, doubled per failed attempt up to 30 s "
        f"(default {DEFAULT_RESTART_BACKOFF_S:g})",
    )
    s.set_defaults(func=_store)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bucketq", description="A durable bucket-packing queue on MongoDB.")
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
    b.add_argument(
        "--n", type=v.cli_count(1), help="one N for bucketq (instead of the preset's sizes)"
    )
    b.add_argument(
        "--sizes", type=v.cli_count_list(1), help="Ns for bucketq, e.g. 10000,100000,1000000"
    )
    b.add_argument(
        "--procs", type=v.cli_count_list(1), help="producer and consumer processes, e.g. 1,2,4"
    )
    b.add_argument(
        "--element-n",
        type=v.cli_count(1),
        help="per-element N at the largest size (halved below)",
    )
    b.add_argument("--contender", action="append", help="run only this contender (repeatable)")
    # Two counts K, each at least 1 and 1 by default.
    for flag, text in (
        ("--repeat", "run each (N, processes) group K times; the table shows medians and their range"),
        ("--partitions", "open the bucketq queues with partitions=K (runs only Queue/AsyncQueue contenders)"),
    ):  # fmt: skip
        b.add_argument(flag, type=v.cli_count(1), default=1, metavar="K", help=text)
    b.add_argument(
        "--claim",
        choices=("auto", "find_and_modify", "find_then_update"),
        default="auto",
        help="the bucketq queues' claim form (option claim; runs only Queue/AsyncQueue "
        "contenders unless auto)",
    )
    b.add_argument(
        "--write-concern",
        choices=("compare", "durable"),
        default="compare",
        help="compare (default): also run bucketq's Queue and per-element queue at w:1 "
        "without j (the old default) beside their durable rows, and print what the journal "
        "costs each; durable: only the durable rows",
    )
    b.add_argument("--json", metavar="PATH", help="write every figure and the environment to PATH")
    b.add_argument("--plots", metavar="DIR", help="PNG plots go here (default: bench-results/)")
    b.add_argument("--no-plots", action="store_true", help="write no plots")
    v.add_mongodb_uri(b, v.STARTS_ONE)
    b.set_defaults(func=_bench)
    # `bucketq bench` alone is the queue benchmark above; `bucketq bench NAME` runs another
    # benchmark, each adding its subcommand here with its own options.
    bench_sub = b.add_subparsers(
        dest="bench_command", required=False, title="other benchmarks", metavar="BENCHMARK"
    )
    from .benchmark.ingest.cli import add_parser as add_ingest_bench

    add_ingest_bench(bench_sub)
    from .benchmark.sdk import add_parser as add_sdk_bench

    add_sdk_bench(bench_sub)
    from .benchmark.keuss import add_parser as add_keuss_bench

    add_keuss_bench(bench_sub)
    from .benchmark.stream_wake import add_parser as add_stream_wake_bench

    add_stream_wake_bench(bench_sub)
    from .benchmark.celery import add_parser as add_celery_bench

    add_celery_bench(bench_sub)
    from .benchmark.results import add_parser as add_results_report

    add_results_report(bench_sub)
    from .benchmark.worker import add_parser as add_worker_bench

    add_worker_bench(bench_sub)
    from .benchmark.logs import add_parser as add_logs_bench

    add_logs_bench(bench_sub)

    # `store`, not `server`: beside `serve` (the HTTP service) the name says what it runs,
    # the store the queues live in, as the docs and serve's settings call it.
    _store_arguments(sub.add_parser("store", help=STORE_HELP))
    v.deprecated_alias(sub, "server", "store", "command", _store_arguments)

    from .reservoir.cli import add_dlq_parser
    from .spark.pipeline import DESCRIPTION, add_arguments, run_from_args

    add_dlq_parser(sub)
    from .server.cli import add_parsers as add_server_parsers

    add_server_parsers(sub)
    from .quarantine_cli import add_quarantine_parser

    add_quarantine_parser(sub)
    from .admin.cli import add_queues_parser

    add_queues_parser(sub)
    from .sdk.cli import add_sdk_parser

    add_sdk_parser(sub)
    from .worker_cli import add_worker_parser

    add_worker_parser(sub)
    pl = sub.add_parser(
        "pipeline",
        help="stream log records from a stream-mode queue into Parquet with Spark (needs bucketq[spark])",
        description=DESCRIPTION,
    )
    add_arguments(pl).set_defaults(func=run_from_args)
    # Shown: the commands with a help text (a deprecated alias has none).
    sub.metavar = "{" + ",".join(a.dest for a in sub._choices_actions) + "}"
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad arguments and unreachable or refusing servers end it with one
    line on stderr and a non-zero exit status, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        command = " ".join(
            x for x in ("bucketq", args.command, getattr(args, "dlq_command", None)) if x
        )
        print(f"{command}: error: {v.one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
