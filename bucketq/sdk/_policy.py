"""What a sender does with an answer: pure decisions, no I/O.

:func:`classify` maps an HTTP status (or a connection failure) to an :class:`Outcome`:

======================  ========  =====================================================
answer                  kind      what the sender does
======================  ========  =====================================================
2xx, the service's      ok        counted as sent
2xx, any other body     invalid   batch spilled with the reason (replayed later),
                                  endpoint paused for ``health_interval``
connection failure      down      endpoint marked down, batch requeued (writeback)
429, 503, 502, 504      retry     endpoint paused for Retry-After (capped), batch requeued
any other 4xx/5xx       refused   batch spilled with the server's reason, not retried
======================  ========  =====================================================

The service's answer to an ingest is a JSON object whose ``received`` is the number of
records sent (``bucketq serve`` and LogTide answer so). A 2xx with anything else is not
delivery: an HTML page (a wrong URL, a proxy's login page), a JSON cut short, another
JSON. Counting it as sent would drop the records without a word.
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
INVALID = "invalid"

#: Bytes of an answer read at most: the service's answers are far smaller; a larger body
#: is not its answer, and reading on would let an endpoint hold a sender without end.
MAX_ANSWER_BYTES = 64 * 1024

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


def not_the_answer(body: bytes, sent: int) -> str | None:
    """Why a 2xx ``body`` is not the service's answer to ``sent`` records, or None."""
    text = body[:MAX_ANSWER_BYTES].decode("utf-8", "replace")
    start = " ".join(text[:80].split())
    if len(body) > MAX_ANSWER_BYTES:
        return f"answered more than {MAX_ANSWER_BYTES} bytes (it starts: {start!r})"
    try:
        doc = json.loads(text)
    except ValueError:
        return f"answered a body that is not JSON (it starts: {start!r})" if start else (
            "answered an empty body")  # fmt: skip
    received = doc.get("received") if isinstance(doc, dict) else None
    if not isinstance(received, int) or isinstance(received, bool):
        return f"answered a JSON without the count of records received (it starts: {start!r})"
    if received != sent:
        return f"answered that it received {received} of the {sent} records sent"
    return None


def classify(
    status: int,
    retry_after: str | None,
    body: bytes,
    *,
    now: float,
    backoff: float,
    max_retry_after: float,
    sent: int,
    url: str = "",
) -> Outcome:
    """The :class:`Outcome` of an HTTP answer to a POST of ``sent`` records to ``url``."""
    if 200 <= status < 300:
        why = not_the_answer(body, sent)
        if why is None:
            return Outcome(OK, status)
        where = f" {url}" if url else ""
        return Outcome(INVALID, status, f"HTTP {status}: the server at{where} {why}: that is "
                       "not the ingest service's answer; is the URL right?")  # fmt: skip
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
