"""What every ``bucketq bench`` command does around its run."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any


def run_command(command: str, body: Callable[[], Any]) -> int:
    """Run ``body``: SIGTERM unwinds like Ctrl-C (worker and server processes are
    stopped, the run's databases dropped), and a run that cannot go on is one line on
    stderr, naming ``command``, and exit code 1."""
    from ..errors import BucketQError

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        body()
    except (RuntimeError, BucketQError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    return 0


def plots_dir(args: argparse.Namespace, default: str) -> str | None:
    """Where ``--plots``/``--no-plots`` put the PNGs (None: no plots)."""
    return None if args.no_plots else (args.plots or default)


def add_run_arguments(
    p: argparse.ArgumentParser, command: str, body: Callable[[argparse.Namespace], Any]
) -> None:
    """The arguments every ``bucketq bench`` sub-command ends with (``--json``,
    ``--mongodb-uri``); the sub-command runs ``body(args)`` through :func:`run_command`
    (``command`` names it in errors)."""
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    p.add_argument(
        "--mongodb-uri",
        help="use this MongoDB (default: $BUCKETQ_MONGODB_URI, else the embedded server)",
    )

    def run_from_args(args: argparse.Namespace) -> int:
        return run_command(command, lambda: body(args))

    p.set_defaults(func=run_from_args)
