"""`bucketq bench sdk` end to end at a tiny N, two rounds: what a user reads of its table
and its JSON (each figure the median of the rounds, each SDK case's p99 beside
FileHandler's p99 of the same round). No timing thresholds."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.bench


def test_rounds_medians_and_the_p99_ratio_to_filehandler(tmp_path):
    out = tmp_path / "sdk.json"
    r = subprocess.run(
        [sys.executable, "-m", "bucketq", "bench", "sdk", "--n", "300", "--http-n", "20",
         "--delivery-n", "200", "--rounds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "median of 2 round(s)" in r.stdout
    assert "p99 / FileHandler p99 (target ≤ 1.5x)" in r.stdout
    res = json.loads(out.read_text())
    assert len(res["rounds"]) == 2
    for rnd in res["rounds"]:
        assert set(rnd) == {"sdk_up", "sdk_down", "sdk_full", "file", "http"}
    for case in ("sdk_up", "sdk_down", "sdk_full"):
        c = res["cases"][case]
        p99s = [rnd[case]["p99_us"] for rnd in res["rounds"]]
        assert c["p99_us"] == statistics.median(p99s)
        assert c["p99_us_range"] == [min(p99s), max(p99s)]
        ratios = [rnd[case]["p99_us"] / rnd["file"]["p99_us"] for rnd in res["rounds"]]
        assert c["p99_vs_file_rounds"] == ratios
        assert c["p99_vs_file"] == statistics.median(ratios)
        verdict = "met" if c["p99_vs_file"] <= 1.5 else "missed"
        assert f"{c['p99_vs_file']:.2f} (" in r.stdout and f"x, {verdict} |" in r.stdout
        assert c["rounds"] == 2
    assert "p99_vs_file" not in res["cases"]["file"]
    # Nothing is lost in any round, whatever the server did.
    for rnd in res["rounds"]:
        for case in ("sdk_up", "sdk_down", "sdk_full"):
            assert rnd[case]["stats"]["lost_total"] == 0
    # The JSON says where and when it ran, and the results page is made from it.
    assert res["machine"]["cores"] == os.cpu_count()
    assert res["run"]["argv"].startswith("bucketq bench sdk --n 300")
    assert res["run"]["load_1m"]["before"] is not None
    page = subprocess.run([sys.executable, "-m", "bucketq", "bench", "report", str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert page.returncode == 0, page.stderr
    assert "\n## Logging SDK\n" in page.stdout
    assert f"| machine | {res['machine']['cpu_model']}, {os.cpu_count()} cores" in page.stdout
    for case in ("IngestHandler, server up", "logging.FileHandler"):
        assert f"| {case} | 300 |" in page.stdout
