"""``bucketq serve`` says once that storage stopped taking records and once that it takes
them again: an outage under load is two lines, not one per request (the requests in
between are logged at debug level)."""

from __future__ import annotations

import logging

from bucketq.server._service import StorageState


def test_an_outage_is_two_lines_whatever_the_requests(caplog):
    now = [100.0]
    state = StorageState(clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="bucketq.server")
    state.answered()  # no outage: nothing to say
    for _ in range(300):
        state.failed("ServerSelectionTimeoutError: 127.0.0.1:1: connection refused")
    now[0] = 112.5
    state.answered()
    state.answered()
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "storage is not taking records (ServerSelectionTimeoutError: 127.0.0.1:1: connection "
        "refused): requests are answered 503 until it does; one line when it does",
        "storage takes records again after 12.5 s; 300 requests failed there meanwhile",
    ]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 299
