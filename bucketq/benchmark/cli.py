"""What every ``bucketq bench`` command does around its run."""

from __future__ import annotations

import argparse
import inspect
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import _validate as v


def run_command(command: str, body: Callable[[], Any], json_path: str | None = None) -> int:
    """Run ``body``: SIGTERM unwinds like Ctrl-C (worker and server processes are
    stopped, the run's databases dropped), and a run that cannot go on is one line on
    stderr, naming ``command``, and exit code 1. The JSON the run wrote to ``json_path``
    gets the machine and the load while it ran (:class:`.machine.Run`)."""
    from ..errors import BucketQError
    from .machine import Run

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with Run(command) as run:
            body()
    except (RuntimeError, BucketQError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    run.stamp(json_path)
    return 0


def plots_dir(args: argparse.Namespace, default: str) -> str | None:
    """Where ``--plots``/``--no-plots`` put the PNGs (None: no plots)."""
    return None if args.no_plots else (args.plots or default)


def add_bench_parser(sub: Any, name: str, help: str, doc: str | None) -> argparse.ArgumentParser:
    """The ``bucketq bench NAME`` sub-command; ``doc`` (its module's docstring) is shown
    as written in its ``--help``."""
    return sub.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_run_arguments(
    p: argparse.ArgumentParser,
    command: str,
    run: Callable[..., Any],
    *,
    only: tuple[str, Sequence[str]],
) -> None:
    """The arguments every ``bucketq bench`` sub-command ends with: ``--WHAT`` to run
    only some of ``only = (WHAT, choices)``, ``--json``, ``--mongodb-uri``. The
    sub-command calls ``run(mongodb_uri, json_path=..., **options)`` through
    :func:`run_command` (``command`` names it in errors), where ``options`` are
    ``run``'s other keywords taken from the arguments of the same name (``WHATs`` is
    the ``--WHAT`` list)."""
    what, choices = only
    p.add_argument(f"--{what}", dest=f"{what}s", action="append", choices=choices,
                   help=f"run only this {what} (repeatable)")  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    v.add_mongodb_uri(p, v.STARTS_ONE)
    names = [k for k, x in inspect.signature(run).parameters.items()
             if x.kind is x.KEYWORD_ONLY and k != "json_path"]  # fmt: skip

    def run_from_args(args: argparse.Namespace) -> int:
        options = {k: getattr(args, k) for k in names}
        return run_command(
            command, lambda: run(args.mongodb_uri, json_path=args.json, **options), args.json
        )

    p.set_defaults(func=run_from_args)
