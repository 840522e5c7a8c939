"""Lazy imports of the reservoir's optional dependencies (the ``reservoir`` extra)."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "bucketq[reservoir]"


def require(module: str) -> ModuleType:
    """Import ``module`` or fail with an error that says which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"The reservoir buffer needs the {module!r} package, which is not installed. "
            f"Install it with `pip install '{EXTRA}'`."
        ) from exc
