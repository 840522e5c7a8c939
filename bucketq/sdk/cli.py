"""``bucketq sdk replay DIR --url URL --api-key KEY``: re-send a spill by hand.

DIR is one configuration's spill directory or any directory above them (the default
spill root, say); every segment found under it is re-sent to URL in batches, and what
the server accepted is removed. Records the server refuses stay, with its reason.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import _validate as v
from ..errors import ConfigurationError
from ._options import DEFAULT_BATCH_SIZE
from ._replay import replay


def _run(args: argparse.Namespace) -> int:
    try:
        r = replay(args.dir, args.url, args.api_key, retry_only=args.retryable_only,
                   batch_size=args.batch_size)  # fmt: skip
    except ConfigurationError as exc:
        print(f"bucketq sdk replay: {exc}", file=sys.stderr)
        return 2
    print(f"sent {r.sent} record(s); {r.refused} refused, {r.kept} kept, "
          f"{r.damaged} damaged line(s) set aside, {r.skipped_segments} segment(s) in use")  # fmt: skip
    for reason, n in sorted(r.reasons.items()):
        print(f"  refused {n}: {reason}")
    if r.stopped:
        print(f"stopped early: {r.stopped}", file=sys.stderr)
        return 1
    return 0 if (r.refused == 0 and r.skipped_segments == 0) else 1


def add_sdk_parser(sub: Any) -> None:
    """Add ``bucketq sdk replay`` to an argparse sub-parser set."""
    p = sub.add_parser("sdk", help="the logging SDK's tools (replay a spill)")
    ss = p.add_subparsers(dest="sdk_command", required=True)
    r = ss.add_parser(
        "replay",
        help="re-send a logging SDK spill directory to a server and remove what it accepted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("dir", help="a spill directory (or a directory above several)")
    r.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    r.add_argument("--api-key", required=True, help="an API key of the project to send to")
    r.add_argument("--batch-size", type=v.cli_count(1), default=DEFAULT_BATCH_SIZE,
                   help=f"records per request (default {DEFAULT_BATCH_SIZE})")  # fmt: skip
    r.add_argument("--retryable-only", action="store_true",
                   help="leave records the server refused before (4xx) in the spill")  # fmt: skip
    r.set_defaults(func=_run)
