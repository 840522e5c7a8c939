"""The HTTP shell: one :class:`Sender` per thread, each with its own urllib3 pool.

``post`` is "build -> one request -> interpret": the body is encoded, one POST is made
with the configured timeouts and no hidden retries, and the answer is handed to the
pure :func:`~bucketq.sdk._policy.classify`. urllib3 rather than httpx: the senders
share the interpreter lock with the application's logging calls, and urllib3 spends
several times less CPU per request.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from .._deps import require
from ._options import HEALTH_PATH, READY_PATH, Config
from ._policy import MAX_ANSWER_BYTES, Outcome, classify, connection_failed
from ._record import dumps

USER_AGENT = "bucketq-sdk/0.1"


class Sender:
    """POSTs batches and probes health; not thread-safe (one per thread)."""

    def __init__(self, cfg: Config) -> None:
        urllib3 = require("urllib3", "sdk")
        self._cfg = cfg
        self._errors = (urllib3.exceptions.HTTPError, OSError)
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=1,
            retries=False,
            timeout=urllib3.Timeout(connect=cfg.connect_timeout, read=cfg.timeout),
            headers={"User-Agent": USER_AGENT},
        )
        self._probe_timeout = urllib3.Timeout(
            connect=min(cfg.connect_timeout, 1.0), read=min(cfg.timeout, 2.0)
        )

    def post(self, url: str, api_key: str, records: list[dict[str, Any]]) -> Outcome:
        body = dumps({"logs": records}).encode("utf-8", "replace")
        try:
            r = self._pool.request(
                "POST",
                url,
                body=body,
                headers={
                    "Content-Type": "application/json",
                    "X-API-Key": api_key,
                    # The same batch sent again (after a timeout, or replayed from the
                    # spill) has the same key, and the server stores it once.
                    "Idempotency-Key": hashlib.sha256(body).hexdigest()[:40],
                },
                preload_content=False,
            )
            whole = False
            try:
                # At most one byte more than an answer may have (classify says why): an
                # endpoint that sends without end cannot hold this sender.
                data = r.read(MAX_ANSWER_BYTES + 1)
                whole = not r.read(1)
            finally:
                if not whole:
                    r.close()  # bytes left unread: the connection cannot serve another
                r.release_conn()
        except self._errors as exc:
            return connection_failed(exc)
        return classify(
            r.status,
            r.headers.get("Retry-After"),
            data or b"",
            now=time.time(),
            backoff=self._cfg.retry_backoff,
            max_retry_after=self._cfg.max_retry_after,
            sent=len(records),
            url=url,
        )

    def probe(self, base_url: str) -> bool:
        """True when the server says it can take records: ``GET /ready`` answers 2xx (or,
        on a server without ``/ready``, ``GET /health`` does). ``/health`` alone says the
        process is alive, also while its storage does not answer."""
        for path in (READY_PATH, HEALTH_PATH):
            try:
                r = self._pool.request("GET", base_url + path, timeout=self._probe_timeout)
            except self._errors:
                return False
            if r.status != 404:
                return 200 <= r.status < 300
        return False

    def close(self) -> None:
        try:
            self._pool.clear()
        except Exception:  # noqa: BLE001 - closing sockets must not fail a shutdown
            pass
