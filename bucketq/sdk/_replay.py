"""``bucketq sdk replay DIR --url URL --api-key KEY``: re-send a spill by hand.

DIR is one configuration's spill directory or any directory above them (the default
spill root, say); every segment found under it is re-sent to URL in batches, and what
the server accepted is removed. Records the server refuses stay, with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ._options import DEFAULT_BATCH_SIZE, make_config
from ._spill import ReplayResult, replay_directory, spill_directories
from ._transport import Sender


def replay(
    directory: str | Path,
    url: str,
    api_key: str,
    *,
    retry_only: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    timeout: float | None = None,
) -> ReplayResult:
    """Re-send every spill segment under ``directory`` to ``url``; remove what was
    accepted. ``retry_only=True`` leaves records the server refused before alone.
    Segments another process is still writing are skipped (``skipped_segments``)."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigurationError(f"directory {str(root)!r} does not exist or is not a directory.")
    options: dict[str, Any] = {"spill_dir": str(root), "batch_size": batch_size}
    if timeout is not None:
        options["timeout"] = timeout
    cfg = make_config(url, api_key, **options)
    sender = Sender(cfg)
    total = ReplayResult()
    try:
        for d in spill_directories(root):
            r = replay_directory(
                d,
                lambda records: sender.post(cfg.ingest_url, cfg.api_key, records),
                retry_only=retry_only,
                batch_size=batch_size,
            )
            total.sent += r.sent
            total.refused += r.refused
            total.kept += r.kept
            total.damaged += r.damaged
            total.skipped_segments += r.skipped_segments
            for k, v in r.reasons.items():
                total.reasons[k] = total.reasons.get(k, 0) + v
            if r.stopped:
                total.stopped = r.stopped
                break
    finally:
        sender.close()
    return total
