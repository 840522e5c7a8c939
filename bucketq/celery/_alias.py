"""``bucketq://`` as a kombu transport alias, with no import in the user's code.

kombu finds a transport by its URL's scheme in ``kombu.transport.TRANSPORT_ALIASES``
and reads no entry point group for transports, so the alias must be in that table before
the first ``Connection``. bucketq's wheel installs this file at the top of site-packages
as ``_bucketq_kombu.py``, beside ``bucketq-celery.pth``, whose one line imports it when
Python starts (setuptools' ``distutils-precedence.pth`` works the same way). It imports
nothing else then: a finder waits for ``kombu.transport`` to load and adds the alias as
it does, then leaves ``sys.meta_path``. ``import bucketq.celery`` adds it too, where
``.pth`` files are not read. Nothing here may fail Python's start: whatever goes wrong
leaves kombu as it was.

This module is also ``bucketq.celery._alias``; it imports nothing of bucketq.
"""

from __future__ import annotations

import sys
from typing import Any

#: The URL scheme: ``bucketq://host/db`` and ``bucketq+mongodb://...`` (any MongoDB URI).
ALIAS = "bucketq"
#: What kombu imports for it.
TARGET = "bucketq.celery:Transport"
_MODULE = "kombu.transport"


def register(transport_module: Any) -> None:
    """Add the alias to ``kombu.transport`` (already loaded), unless a user set one."""
    transport_module.TRANSPORT_ALIASES.setdefault(ALIAS, TARGET)


class _AliasFinder:
    """Finds nothing itself: when ``kombu.transport`` is imported, it lets the other
    finders find it and registers the alias once the module has run."""

    bucketq_kombu_alias = True  # marks it in sys.meta_path (two copies of this file)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        _uninstall()
        from importlib.util import find_spec

        spec = find_spec(name)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            try:
                register(module)
            except Exception:  # noqa: BLE001 - kombu changed its table: import bucketq.celery says so
                pass

        loader.exec_module = exec_module  # type: ignore[union-attr]
        return spec


def _uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "bucketq_kombu_alias", False)]


def install() -> None:
    """Register the alias now if kombu's transports are loaded, else when they load."""
    try:
        loaded = sys.modules.get(_MODULE)
        if loaded is not None:
            register(loaded)
        elif not any(getattr(f, "bucketq_kombu_alias", False) for f in sys.meta_path):
            sys.meta_path.insert(0, _AliasFinder())
    except Exception:  # noqa: BLE001 - never fail Python's start over an alias
        pass
