"""Helpers of the SDK tests: wait for a condition, find a port nothing listens on."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


def eventually(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:  # fmt: skip
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s (last: {value!r})")
        time.sleep(interval)


def dead_port() -> int:
    """A loopback port nothing listens on (bound then closed: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
