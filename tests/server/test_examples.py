"""The README's OpenTelemetry example, run as a user runs it: a separate process whose
exporter finds ``bucketq serve`` through the standard OTEL_EXPORTER_OTLP_* variables."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from .helpers import ROOT, Serve, create_key

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")


def test_the_otlp_example_reaches_the_logs_api(serve: Serve) -> None:
    project = f"example-{uuid.uuid4().hex[:8]}"
    key = create_key(serve, project)
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": serve.url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={key}",
    }
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "otlp_logs.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "Failed to export" not in run.stderr, run.stderr
    with serve.client(key) as c:
        page = c.get("/api/v1/logs", params={"service": "checkout"}).json()
    [record] = page["logs"]
    assert (record["level"], record["message"]) == ("warn", "cart abandoned")
    assert record["metadata"]["cart"] == 42
