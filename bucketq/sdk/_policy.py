"""What a sender does with an answer: pure decisions, no I/O.

:func:`classify` maps an HTTP status (or a connection failure) to an :class:`Outcome`:

======================  ========  =====================================================
answer                  kind      what the sender does
======================  ========  =====================================================
2xx                     ok        counted as sent
connection failure      down      endpoint marked down, batch requeued (writeback)
429, 503, 502, 504      retry     endpoint paused for Retry-After (capped), batch requeued
any other 4xx/5xx       refused   batch spilled with the server's reason, not retried
======================  ========  =====================================================
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

OK = "ok"
DOWN = "down"
RETRY = "retry"
REFUSED = "refused"

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one POST: ``kind`` (ok/down/retry/refused), the status (0 when no
    answer came), a human reason, and for ``retry`` the seconds to wait."""

    kind: str
    status: int = 0
    reason: str = ""
    retry_after: float = 0.0


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def reason_from_body(status: int, body: bytes) -> str:
    """The server's reason: ``error``/``message``/``detail(s)`` of a JSON body, else its
    text (both cut to 500 characters), prefixed with the status."""
    text = body[:4000].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        parts = []
        for key in ("error", "message", "detail", "details"):
            if key in doc and doc[key] not in (None, ""):
                v = doc[key]
                parts.append(v if isinstance(v, str) else json.dumps(v, default=str))
        if parts:
            text = ": ".join(parts)
    return f"HTTP {status}: {text[:500]}" if text else f"HTTP {status}"


def classify(
    status: int,
    retry_after: str | None,
    body: bytes,
    *,
    now: float,
    backoff: float,
    max_retry_after: float,
) -> Outcome:
    """The :class:`Outcome` of an HTTP answer."""
    if 200 <= status < 300:
        return Outcome(OK, status)
    if status in RETRYABLE_STATUSES:
        wait = parse_retry_after(retry_after, now)
        wait = backoff if wait is None else wait
        return Outcome(RETRY, status, reason_from_body(status, body), min(wait, max_retry_after))
    return Outcome(REFUSED, status, reason_from_body(status, body))


def connection_failed(exc: BaseException) -> Outcome:
    """The :class:`Outcome` of a request that got no HTTP answer."""
    text = str(exc) or type(exc).__name__
    return Outcome(DOWN, 0, f"{type(exc).__name__}: {text[:300]}")


def should_start_drain(fill_percent: float, start_percent: float, running: bool) -> bool:
    return not running and fill_percent >= start_percent


def should_stop_drain(fill_percent: float, stop_percent: float) -> bool:
    return fill_percent <= stop_percent
