"""Items given back or tried too often: when a rolled-back item is due again, the
over-tried rule, and a dead letter's headers.
"""

from __future__ import annotations

from typing import Any

from ... import _validate as v
from ...bucket.options import QueueOptions
from ...bucket.times import to_datetime
from ...errors import ConfigurationError


def retry_delay(tries: int, opts: QueueOptions) -> float:
    """The default wait before a rolled-back item is delivered again (at most ``MAX_DELAY``)."""
    return opts.retry_delay(tries)


def rollback_time(now: float, delay: Any, next_t: Any, tries: int, opts: QueueOptions) -> float:
    """When a rolled-back item may be delivered again: ``delay`` seconds from now, or
    ``next_t``, or by default :func:`retry_delay` (both arguments checked here)."""
    if delay is not None and next_t is not None:
        raise ConfigurationError("Give either delay or next_t, not both.")
    if next_t is not None:
        return v.timestamp(next_t, "next_t")
    if delay is None:
        return now + retry_delay(tries, opts)
    return now + v.delay(delay)


def over_tried(tries: int, max_tries: int | None, *, rolled_back: bool = False) -> str | None:
    """Why an item goes to the dead-letter queue instead of being served (None: it does
    not): it was delivered (or, ``rolled_back``, given back) ``max_tries`` times."""
    if max_tries is None or tries < max_tries:
        return None
    how = "rolled back" if rolled_back else "delivered"
    return f"{how} {v.counted(tries, 'time')} without a commit (max_tries={max_tries})"


def dead_letter_headers(queue: str, msg_headers: Any, tries: int, reason: str, now: float) -> dict:
    """The dead letter's headers: the item's own (if they are a dict with string keys;
    anything else stored before headers were checked is kept as its repr) and why."""
    if isinstance(msg_headers, dict) and all(isinstance(k, str) for k in msg_headers):
        h = dict(msg_headers)
    elif msg_headers:
        h = {"x-original-headers": repr(msg_headers)}
    else:
        h = {}
    h.update(
        {
            "x-source-queue": queue,
            "x-dead-at": to_datetime(now),
            "x-tries": tries,
            "x-reason": reason,
        }
    )
    return h


#: Headers a dead letter carries that say why it died; a requeued item drops them.
DEAD_HEADERS = ("x-source-queue", "x-dead-at", "x-tries", "x-reason")


def requeued_headers(headers: Any) -> dict[str, Any] | None:
    """A dead letter's headers less the ones that say why it died."""
    if not isinstance(headers, dict):
        return None
    kept = {k: v for k, v in headers.items() if k not in DEAD_HEADERS}
    return kept or None


def dead_source(name: str, headers: Any) -> str:
    """The queue a dead letter of ``<name>.dlq`` came from: its ``x-source-queue``, else ``name``."""
    if isinstance(headers, dict) and isinstance(headers.get("x-source-queue"), str):
        return str(headers["x-source-queue"])
    return name
