"""Lazy import of the SDK's HTTP library (the ``sdk`` extra)."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "bucketq[sdk]"


def require(module: str) -> ModuleType:
    """Import ``module`` or fail with an error that says which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"The logging SDK needs the {module!r} package, which is not installed. "
            f"Install it with `pip install '{EXTRA}'`."
        ) from exc
