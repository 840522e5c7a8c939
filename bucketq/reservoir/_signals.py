"""Stopping a buffer gracefully on SIGTERM/SIGINT: the HTTP server first, then the drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any

from ._buffered import BufferedReservoir

log = logging.getLogger("bucketq.reservoir")


def install_signal_handlers(
    buffer: BufferedReservoir,
    *,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    on_stopped: Callable[[dict[str, Any]], Any] | None = None,
    before_stop: Callable[[], Any] | None = None,
) -> Callable[[], None]:
    """On SIGTERM/SIGINT (once): call ``before_stop()`` and wait for it (stop the HTTP
    server: no new requests, in-flight ones finish into the buffer), then stop
    ``buffer`` gracefully (drain), then call ``on_stopped(report)``. That is LogTide's
    order: server first, then the drain. Either callback may be a coroutine function.
    Call from the running loop; returns a function that removes the handlers."""
    loop = asyncio.get_running_loop()
    holder: dict[str, asyncio.Task[None]] = {}

    async def shutdown(signum: int) -> None:
        log.warning(
            "signal %d: stopping the buffer (draining up to %d ms)",
            signum,
            buffer.config.graceful_shutdown_ms,
        )
        if before_stop is not None:
            try:
                res = before_stop()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # the drain must happen anyway
                log.exception("before_stop failed; draining the buffer anyway")
        report = await buffer.stop()
        log.warning("buffer stopped: %s", report)
        if on_stopped is not None:
            res = on_stopped(report)
            if asyncio.iscoroutine(res):
                await res

    def handler(signum: int) -> None:
        if "task" not in holder:
            holder["task"] = loop.create_task(shutdown(signum))

    for sig in signals:
        loop.add_signal_handler(sig, handler, sig)

    def remove() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return remove
