"""Optional dependencies (the extras): imported when used, and a missing one is an error
that says which extra to install."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

from .errors import ConfigurationError


def requirer(needed_by: str, extra: str) -> Callable[[str], ModuleType]:
    """``require(module)``: import ``module``, or raise an ImportError saying that
    ``needed_by`` needs it and to install ``extra``."""

    def require(module: str) -> ModuleType:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"{needed_by} needs the {module!r} package, which is not installed. "
                f"Install it with `pip install '{extra}'`."
            ) from exc

    return require


def missing(modules: Iterable[str]) -> list[str]:
    """Which of ``modules`` cannot be imported (found without importing them)."""
    from importlib.util import find_spec

    def present(m: str) -> bool:
        if m in sys.modules:  # kombu replaces its module object: its __spec__ is None
            return True
        try:
            return find_spec(m) is not None
        except (ImportError, ValueError):
            return False

    return sorted({m for m in modules if not present(m)})


def require_all(modules: Iterable[str], needed_by: str, install: str) -> None:
    """A :class:`ConfigurationError` naming what of ``modules`` is missing, before a run
    that needs them all starts; ``install`` says how to get them."""
    absent = missing(modules)
    if absent:
        raise ConfigurationError(
            f"{needed_by} needs {', '.join(absent)}, which is not installed. {install}"
        )
