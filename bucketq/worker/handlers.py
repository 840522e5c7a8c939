"""Finding a handler by name (``bucketq worker MODULE:FUNCTION``) and telling an async
one from a sync one."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from ..errors import ConfigurationError


def is_async(handler: Any) -> bool:
    """An ``async def`` function (or a callable object whose ``__call__`` is one, or a
    ``functools.partial`` of one): its calls are awaited, not run in a thread."""
    while hasattr(handler, "func") and not inspect.isfunction(handler):  # functools.partial
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - the object's own __call__
    )


def load_handler(spec: str) -> Any:
    """The callable ``spec`` names, ``package.module:function`` (``function`` may be a
    dotted attribute path). The current directory is importable, as it is for ``python
    -m``. Errors say what to write instead."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(
            f"The handler must be given as MODULE:FUNCTION (e.g. myapp.tasks:send_email); "
            f"got {spec!r}."
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"Cannot import the handler's module {module_name!r}: {exc}. Run the command "
            "where the module can be imported (or set PYTHONPATH)."
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(
                f"Module {module_name!r} has no {attr!r}: name a function defined there."
            ) from None
    if not callable(obj):
        raise ConfigurationError(f"{spec} is not callable: name the handler function.")
    return obj
