"""The public faces: :class:`IngestHandler` (a ``logging.Handler``) and :class:`Client`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ._options import LOGGER_NAME, make_config
from ._processor import Processor
from ._processor_state import sdk_thread
from ._record import capture, from_fields, from_log_record, needs_item
from ._registry import acquire, release

_SDK_PREFIX = LOGGER_NAME + "."
_log = logging.getLogger(LOGGER_NAME)

#: Seconds after a handler is made before it looks, once, at the loggers it was attached
#: to (dictConfig and ``addHandler`` attach it right after it is made).
LEVEL_CHECK_DELAY = 1.0


class _Shared:
    """One user of the processor shared by every client and handler of the same
    configuration (queue, threads, connections, spill)."""

    _processor: Processor

    def _acquire(self, url: str, api_key: str, options: dict[str, Any]) -> None:
        self._processor = acquire(make_config(url, api_key, **options))
        self._service = self._processor.cfg.service
        self._released = False

    def _release(self, timeout: float | None = None) -> bool:
        """Let go of the processor once (the last user stops it); True when nothing was
        left pending."""
        if self._released:
            return True
        self._released = True
        return release(self._processor, timeout)

    @property
    def processor(self) -> Processor:
        return self._processor

    def stats(self) -> dict[str, Any]:
        """Counters of this configuration: queued, queue_full, sent, retried, to_fallback,
        spilled, replayed, refused, lost (by reason), pending, fill_percentage, ..."""
        return self._processor.stats()


class Client(_Shared):
    """A lower-level client: ``log(level, message, **fields)`` queues one record and
    returns at once (True: queued; False: the queue was full and it went to the spill).

    ``fields`` become the record's metadata, except ``trace_id``, ``span_id`` and
    ``service``, which are top-level fields of the ingest API. Clients with equal
    arguments share one processor (queue, threads, connections, spill).
    """

    def __init__(self, url: str, api_key: str, **options: Any) -> None:
        self._acquire(url, api_key, options)

    def log(self, level: str | int, message: object, **fields: Any) -> bool:
        return self._processor.submit(
            from_fields(time.time(), level, message, self._service, fields)
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (default ``shutdown_timeout``) for every queued record
        to be sent or spilled; True when nothing is pending."""
        return self._processor.flush(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (``timeout``, default ``shutdown_timeout``) and let go of the processor;
        the last user of a configuration stops it and spills what is left. Idempotent."""
        return self._release(timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IngestHandler(_Shared, logging.Handler):
    """A ``logging.Handler`` that sends records to ``bucketq serve`` without blocking.

    ``IngestHandler(url, api_key, **options)``; usable from ``dictConfig`` (``"class":
    "bucketq.sdk.IngestHandler"`` with the options as keys). ``extra=`` fields go to the
    record's metadata (``trace_id``/``span_id``/``service`` to the top level), exception
    info to ``metadata["exception"]``, the logger's name to ``metadata["logger"]``.
    Records of the ``bucketq.sdk`` logger and of the SDK's own threads are ignored.
    """

    def __init__(self, url: str, api_key: str, level: int | str = logging.NOTSET,
                 **options: Any) -> None:  # fmt: skip
        super().__init__(level)
        self._acquire(url, api_key, options)
        self._level_check = threading.Timer(LEVEL_CHECK_DELAY, self._check_level)
        self._level_check.daemon = True
        self._level_check.start()

    def _check_level(self) -> None:
        """Warn once when a logger this handler is attached to drops what the handler
        would send: the root logger's level is WARNING unless set, so
        ``getLogger().addHandler(IngestHandler(...))`` alone sends no ``info()`` record.
        Give the handler ``level=logging.WARNING`` when that is what is meant."""
        wanted = self.level or logging.INFO
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        for lg in loggers:
            if not isinstance(lg, logging.Logger) or self not in lg.handlers:
                continue
            effective = lg.getEffectiveLevel()
            if effective > wanted:
                name = "root" if lg is logging.getLogger() else repr(lg.name)
                _log.warning(
                    "IngestHandler is attached to the %s logger, whose level is %s: records "
                    "below %s never reach it. Set the logger's level (for example "
                    "logger.setLevel(logging.INFO)), or give the handler level=%s if that "
                    "is meant.",
                    name, logging.getLevelName(effective), logging.getLevelName(effective),
                    logging.getLevelName(effective),
                )  # fmt: skip

    def handle(self, record: logging.LogRecord) -> Any:
        # emit is thread-safe on its own: skip Handler.handle's lock (one less wait), and
        # the filter call when there are no filters.
        if not self.filters:
            self.emit(record)
            return True
        rv = self.filter(record)
        if rv:
            if isinstance(rv, logging.LogRecord):
                record = rv
            self.emit(record)
        return rv

    def emit(self, record: logging.LogRecord) -> None:
        # The caller's thread: one small tuple with the message formatted (its args may
        # change next); a sender works out the rest (see bucketq.sdk._record).
        name = record.name
        if name == LOGGER_NAME or name.startswith(_SDK_PREFIX):
            return
        if sdk_thread.active:
            return
        try:
            if needs_item(record):
                self._processor.submit(from_log_record(record, self._service))
            else:
                self._processor.submit(capture(record))
        except Exception:  # noqa: BLE001 - the logging contract: report, never raise
            self.handleError(record)

    def flush(self) -> None:
        self._processor.flush()

    def close(self) -> None:
        self._level_check.cancel()
        self._release()
        super().close()
