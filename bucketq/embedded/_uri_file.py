"""The URI file of a running ``bucketq serve`` with embedded storage, and finding it."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from .._validate import MONGODB_URI_ENV as URI_ENV

URI_FILE = "serve.uri"
#: Seconds :func:`embedded_uri` waits for a starting ``bucketq serve`` to write :data:`URI_FILE`.
STARTING_WAIT = 60.0


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``bucketq serve`` keeps its embedded server's data and URI file (0700: the
    URI carries the embedded server's password), for this process's environment or
    another's (``environ``)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")) / "bucketq"


def embedded_uri(wait: float = STARTING_WAIT) -> str | None:
    """The URI a running ``bucketq serve`` with embedded storage wrote, if any. While a
    ``bucketq serve`` of this user is running and the file is not there yet (its embedded
    server is starting), wait for it, ``wait`` seconds at most: ``bucketq serve &`` then
    ``bucketq keys create`` works as typed."""
    here = state_dir()
    path = here / URI_FILE
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            uri = path.read_text().strip() or None
        except OSError:
            uri = None
        if uri is not None or time.monotonic() >= deadline:
            return uri
        pid = _starting_serve(here)
        if pid is None:
            return None
        if not told:
            told = True
            print(f"waiting for bucketq serve (pid {pid}) to start its embedded server "
                  f"({wait:.0f} s at most) ...", file=sys.stderr)  # fmt: skip
        time.sleep(0.2)


def _starting_serve(here: Path) -> int | None:
    """The pid of a ``bucketq serve`` of this user that will write its URI file in
    ``here`` (its own environment names that directory and no MongoDB URI), from
    ``/proc``; None without one (or without ``/proc``)."""
    me, uid = os.getpid(), os.getuid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            if pid == me or os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            # `bucketq serve ...` (the console script) and `python -m bucketq serve ...`
            pairs = zip(args, args[1:], strict=False)
            if not any(a.endswith(b"bucketq") and b == b"serve" for a, b in pairs):
                continue
            if any(a.startswith(b"--mongodb-uri") for a in args):
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw if b"=" in kv)
        if not env.get(URI_ENV) and state_dir(env) == here:
            return pid
    return None
