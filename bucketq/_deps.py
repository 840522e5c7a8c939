"""Optional dependencies (the extras): imported when used; a missing one is a
:class:`~bucketq.errors.MissingDependency` (a ConfigurationError and an ImportError)
that names the extra to install. The one place that says so."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from types import ModuleType

from .errors import MissingDependency

#: Who needs each extra, as the error names it.
NEEDED_BY = {
    "reservoir": "The reservoir buffer",
    "sdk": "The logging SDK",
    "server": "The ingest service",
    "spark": "The bucketq Spark data source",
    "celery": "bucketq's Celery broker (the bucketq:// transport)",
    "bench": "bucketq bench",
    "bench,server": "bucketq bench ingest",
    "worker": "bucketq worker --metrics-port",
}


def missing_extra(modules: Iterable[str], extra: str, needed_by: str = "") -> MissingDependency:
    """The error for ``modules`` not installed: who needs them, and the extra to install."""
    names = sorted(set(modules))
    who = needed_by or NEEDED_BY.get(extra, f"This part of bucketq (extra {extra!r})")
    what = ", ".join(repr(m) for m in names)
    if len(names) == 1:
        said = f"the {what} package, which is not installed. Install it"
    else:
        said = f"the packages {what}, which are not installed. Install them"
    exc = MissingDependency(
        f"{who} needs {said} with `pip install 'bucketq[{extra}]'` "
        f"(in a checkout of bucketq: `pip install -e '.[{extra}]'`)."
    )
    exc.name = names[0] if names else None
    return exc


def require(module: str, extra: str, needed_by: str = "") -> ModuleType:
    """Import ``module``, or raise :func:`missing_extra` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing_extra([exc.name or module], extra, needed_by) from exc


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


def require_all(modules: Iterable[str], extra: str, needed_by: str = "") -> None:
    """Before a run that needs all of ``modules`` starts: :func:`missing_extra` for the
    ones not installed."""
    absent = missing(modules)
    if absent:
        raise missing_extra(absent, extra, needed_by)
