"""The ingest service: ``bucketq serve``.

A FastAPI app over the reservoir (``MongoReservoir`` storage, the optional buffer):
LogTide-shaped ``POST /api/v1/ingest`` (+ ``/spans``, ``/metrics``), OTLP/HTTP
``/v1/logs`` and ``/v1/traces`` (protobuf and JSON), ``GET /api/v1/logs``, ``/metrics``,
``/health``, ``/ready``; API keys per project (``bucketq keys``). Install with
``pip install 'bucketq[server]'``; the dependencies are imported on first use.
See ``docs/server.md``.
"""

from __future__ import annotations

from typing import Any

from ._config import SETTINGS, ServerConfig, config_table, from_env


def create_app(*args: Any, **kwargs: Any) -> Any:
    """Build the app (see :func:`bucketq.server._app.create_app`); needs ``bucketq[server]``."""
    from .._deps import require

    return require("bucketq.server._app", "server").create_app(*args, **kwargs)


__all__ = ["SETTINGS", "ServerConfig", "config_table", "create_app", "from_env"]
