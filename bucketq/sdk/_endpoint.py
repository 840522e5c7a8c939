"""The health of one server the SDK sends to: up or down, paused after a Retry-After."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class Endpoint:
    """Health of one server: up, or down since a connection failure until a probe
    answers; paused until a Retry-After has passed. ``on_down`` is set when it goes down."""

    name: str
    ingest_url: str
    base_url: str
    api_key: str = field(repr=False)
    on_down: threading.Event | None = field(default=None, repr=False)
    up: bool = field(default=True, init=False)
    paused_until: float = field(default=0.0, init=False)
    reason: str = field(default="", init=False)

    def available(self, now: float) -> bool:
        return self.up and now >= self.paused_until

    def mark_down(self, reason: str) -> bool:
        was = self.up
        self.up, self.reason = False, reason
        if was:
            if self.on_down is not None:
                self.on_down.set()  # the health thread starts probing
        return was

    def mark_up(self) -> bool:
        was = self.up
        self.up, self.reason = True, ""
        return not was

    def pause(self, seconds: float, reason: str) -> None:
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)
        self.reason = reason
