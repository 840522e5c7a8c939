#!/usr/bin/env python3
"""Fail on an import that crosses bucketq's layers the wrong way (scripts/check runs it).

    python scripts/check_layers.py

Every import in bucketq/ counts, a lazy one inside a function too. The rules:

1. A module imports only from its own package and from the layers below its own
   (``LAYERS``, top first); packages side by side in one layer do not import each other.
2. Nothing imports another package's private module (a name starting with ``_`` below
   the package): packages meet through public names. The root's private modules
   (``bucketq._validate``, ``_driver``, ``_guard``, ``_deps``, ``_lazy``, ``_version``)
   are the base layer that everything shares.
3. Every module of bucketq belongs to a layer: a new package is placed in ``LAYERS``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Top first. A module may import from a lower layer, never from a higher one, and never
#: from another package of its own layer.
LAYERS: list[tuple[str, ...]] = [
    # the commands and the package's face (``bucketq/__init__.py`` loads its names lazily)
    ("bucketq", "bucketq.__main__", "bucketq.cli", "bucketq.quarantine_cli", "bucketq.worker_cli"),
    # `bucketq bench`: measures everything below; nothing in the library imports it
    ("bucketq.benchmark",),
    ("bucketq.server",),
    # the queues' Prometheus collector (the server's /metrics and the console use it)
    ("bucketq.metrics",),
    # the features built on the queue kinds, each on its own
    (
        "bucketq.admin",
        "bucketq.celery",
        "bucketq.reservoir",
        "bucketq.sdk",
        "bucketq.spark",
    ),
    # the two queue kinds, side by side
    ("bucketq.queue", "bucketq.stream"),
    # the worker: runs a handler over any queue object it is given (reserve, commit,
    # rollback, touch, drain), so it imports no queue kind and ``Queue.consume`` runs it
    ("bucketq.worker",),
    # the bucket kernel under both kinds
    ("bucketq.bucket",),
    # what every layer shares
    (
        "bucketq.embedded",
        "bucketq.supervisor",
        "bucketq.errors",
        "bucketq._deps",
        "bucketq._driver",
        "bucketq._guard",
        "bucketq._lazy",
        "bucketq._validate",
        "bucketq._version",
    ),
]
BASE = LAYERS[-1]

#: Packages that are one unit with another for these rules: the web console is a router
#: of the server's app (``bucketq serve`` mounts it at /console) and reads logs and keys
#: through the server's own modules.
UNITS = {"bucketq.console": "bucketq.server"}

#: Imports that break a rule, and why they may for now: (importer or its package, imported
#: module) -> the reason. Keep it short; each entry is a debt.
ALLOWED: dict[tuple[str, str], str] = {}


def allowed(module: str, target: str) -> bool:
    return any((module == m or module.startswith(m + ".")) and target == t for m, t in ALLOWED)


def package_of(module: str) -> tuple[str, int]:
    """The layer package a module belongs to, and its layer's index."""
    for unit, pkg in UNITS.items():
        if module == unit or module.startswith(unit + "."):
            module = pkg
    best = ("", -1)
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            # "bucketq" is the package's face (its __init__) alone, not everything below it.
            inside = module.startswith(pkg + ".") and pkg != "bucketq"
            if (module == pkg or inside) and len(pkg) > len(best[0]):
                best = (pkg, i)
    return best


def module_name(path: Path, root: Path = ROOT) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, imported module) for every import of bucketq in ``path``; ``from x import y``
    counts as ``x.y`` when ``y`` is a module, else as ``x``."""
    mod, is_pkg = module_name(path, root)
    here = mod if is_pkg else mod.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                is_module = (root / Path(*sub.split("."))).is_dir() or (
                    root / Path(*sub.split(".")).with_suffix(".py")
                ).is_file()
                found.append((node.lineno, sub if is_module else target))
    found = sorted(set(found))
    return [(line, t) for line, t in found if t == "bucketq" or t.startswith("bucketq.")]


def problems(root: Path = ROOT) -> list[str]:
    """Every import below ``root/bucketq`` that breaks a rule, one line each."""
    out = []
    for path in sorted((root / "bucketq").rglob("*.py")):
        mod, _ = module_name(path, root)
        pkg, layer = package_of(mod)
        where = f"{path.relative_to(root)}"
        if layer < 0:
            out.append(f"{where}: module {mod} is in no layer: place its package in LAYERS")
            continue
        for line, target in imports(path, root):
            tpkg, tlayer = package_of(target)
            if tpkg == pkg or (pkg in BASE and tpkg in BASE) or allowed(mod, target):
                continue
            if tlayer < 0:
                out.append(f"{where}:{line}: imports {target}, which is in no layer")
            elif tlayer < layer:
                out.append(f"{where}:{line}: {pkg} imports {target} from a layer above it")
            elif tlayer == layer and pkg not in LAYERS[0]:
                out.append(f"{where}:{line}: {pkg} imports {target}, its side-by-side neighbour")
            elif tpkg not in BASE and any(
                p.startswith("_") for p in target.split(".")[len(tpkg.split(".")) :]
            ):
                out.append(
                    f"{where}:{line}: imports {target}, a private module of {tpkg}: use its "
                    "public names"
                )
    return out


def main() -> int:
    found = problems()
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} import(s) cross the layers (scripts/check_layers.py says how).")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
