"""A process that uses one flavour imports only that one: Spark's Python workers (which
read and acknowledge streams with the sync classes) do not load the async shells."""

import ast
import subprocess
import sys

import pytest

LOADED = "import sys; print(sorted(m for m in sys.modules if m.startswith('bucketq')))"


def loaded(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\n{LOADED}"], capture_output=True, text=True, check=True
    )
    return ast.literal_eval(out.stdout)


def test_the_spark_source_loads_no_async_shell() -> None:
    mods = loaded("import bucketq.spark.source\nfrom bucketq.spark import _ops\n_ops.StreamQueue")
    assert "bucketq.stream._sync.stream" in mods
    assert "bucketq.bucket._sync.producer" in mods
    assert not [m for m in mods if "._async" in m]


def test_the_async_flavour_loads_no_sync_shell() -> None:
    mods = loaded("from bucketq.stream import AsyncStreamQueue")
    assert "bucketq.stream._async.stream" in mods
    assert not [m for m in mods if "._sync" in m]


def test_the_names_are_the_classes() -> None:
    from bucketq import bucket, stream
    from bucketq.bucket._async.producer import AsyncProducer
    from bucketq.stream._sync.stream import StreamQueue

    assert stream.StreamQueue is StreamQueue
    assert bucket.AsyncProducer is AsyncProducer
    assert set(stream.__all__) <= set(dir(stream))
    with pytest.raises(AttributeError, match="NoSuchName"):
        stream.NoSuchName  # noqa: B018
