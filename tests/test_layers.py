"""scripts/check_layers.py passes on the tree and fails on an import that crosses the layers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_layers", ROOT / "scripts" / "check_layers.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_tree_keeps_its_layers():
    assert _checker().problems() == []


def test_each_kind_of_crossing_is_found(tmp_path):
    files = {
        "bucketq/__init__.py": "",
        "bucketq/errors.py": "",
        "bucketq/bucket/__init__.py": "from ..queue import Queue\n",  # upward
        "bucketq/queue/__init__.py": "Queue = 1\n",
        "bucketq/queue/_core.py": "",
        "bucketq/stream/__init__.py": "from ..queue import _core\n",  # neighbour, private
        "bucketq/sdk/__init__.py": "def f():\n    from ..benchmark import run\n",  # lazy, upward
        "bucketq/benchmark/__init__.py": "run = 1\n",
        "bucketq/newpkg/__init__.py": "",  # in no layer
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = "\n".join(_checker().problems(tmp_path))
    assert "bucketq.bucket imports bucketq.queue from a layer above it" in found
    assert "bucketq.stream imports bucketq.queue._core, its side-by-side neighbour" in found
    assert "bucketq.sdk imports bucketq.benchmark from a layer above it" in found
    assert "module bucketq.newpkg is in no layer" in found
