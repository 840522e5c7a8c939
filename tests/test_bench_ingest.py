"""`bucketq bench ingest`: the command line, and the open-loop generator against real
servers on loopback. No timing thresholds."""

from __future__ import annotations

import pytest

from bucketq.cli import build_parser

pytestmark = pytest.mark.bench


def test_bench_alone_is_still_the_queue_benchmark_and_ingest_is_a_subcommand():
    args = build_parser().parse_args(["bench", "--quick", "--n", "5"])
    assert args.func.__name__ == "_bench" and args.quick and args.n == 5
    assert args.bench_command is None
    args = build_parser().parse_args(["bench", "ingest", "--rate", "5", "--mode", "memory"])
    assert args.bench_command == "ingest" and args.rate == 5 and args.mode == ["memory"]
    assert args.func.__name__ == "run_from_args"
