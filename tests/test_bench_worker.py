"""`bucketq bench worker` end to end at a tiny N: what a user reads of its table and its
JSON (each consume beside its loop, the ratio of the rounds' medians). No timing
thresholds."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.bench


def test_consume_is_reported_beside_the_hand_written_loop(mongo_uri, tmp_path):
    out = tmp_path / "worker.json"
    r = subprocess.run(
        [sys.executable, "-m", "bucketq", "bench", "worker", "--n", "300", "--rounds", "2",
         "--json", str(out), "--mongodb-uri", mongo_uri],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "time per item vs loop (target ≤ 1.10x)" in r.stdout
    res = json.loads(out.read_text())
    assert list(res["contenders"]) == ["loop", "consume", "async loop", "async consume"]
    assert res["env"]["n"] == 300 and len(res["env"]["load_avg_1m"]) == 2
    for name, base in (("consume", "loop"), ("async consume", "async loop")):
        c, b = res["contenders"][name], res["contenders"][base]
        ratios = [
            x["wall_us"] / y["wall_us"] for x, y in zip(c["rounds"], b["rounds"], strict=True)
        ]
        assert c["wall_ratio"] == statistics.median(ratios) and c["vs"] == base
        verdict = "met" if c["wall_ratio"] <= 1.10 else "missed"
        assert f"| {name} | " in r.stdout and f"{c['wall_ratio']:.2f}x ({verdict})" in r.stdout
    assert "wall_ratio" not in res["contenders"]["loop"]
