"""Attributes a package loads on first use (PEP 562), so that a process imports only what
it uses: a Spark Python worker's ``import bucketq.spark`` loads neither the async
flavours nor the queue kinds it does not read, ``bucketq.reservoir`` not the Redis driver
until a Redis transport is asked for."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def attributes(
    package: str, where: dict[str, str], public: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A ``__getattr__`` and a ``__dir__`` for ``package``: attribute ``name`` is module
    ``where[name]``'s (relative to ``package``), imported on first use and then kept in
    the package like any other; ``public`` names are listed by ``dir()`` before then."""
    names = set(public)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | names)

    return __getattr__, __dir__
