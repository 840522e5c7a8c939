"""The disk spill: JSON lines per configuration, rotation, the size bound and its lost
counter, replay that removes what was accepted and keeps what was refused, damaged lines
set aside, segments in use left alone."""

from __future__ import annotations

import json
from pathlib import Path

from bucketq.sdk._policy import Outcome
from bucketq.sdk._spill import DAMAGED_PREFIX, Spill, segment_paths


def rec(i: int) -> dict:
    return {"time": "2026-01-01T00:00:00+00:00", "service": "t", "level": "info",
            "message": f"m{i}", "metadata": {"i": i, "text": "é" * 3}}  # fmt: skip


def lines(directory: Path) -> list[dict]:
    out = []
    for p in segment_paths(directory):
        out.extend(json.loads(x) for x in p.read_text().splitlines())
    return out


def test_append_writes_json_lines_with_reason(tmp_path):
    s = Spill(tmp_path / "c", meta={"url": "http://x"})
    assert s.append([rec(1), rec(2)], "queue full") == 2
    s.close()
    got = lines(tmp_path / "c")
    assert [g["log"] for g in got] == [rec(1), rec(2)]
    assert {g["reason"] for g in got} == {"queue full"} and all(g["retry"] for g in got)
    assert json.loads((tmp_path / "c" / "config.json").read_text()) == {"url": "http://x"}


def test_nothing_spilled_creates_no_file(tmp_path):
    s = Spill(tmp_path / "c")
    s.flush()
    s.close()
    assert not (tmp_path / "c").exists()


def test_segments_rotate_and_the_bound_deletes_the_oldest_counting_its_records(tmp_path):
    one = len(json.dumps({"log": rec(0)}))  # about one line
    s = Spill(tmp_path, segment_bytes=one * 10, max_bytes=one * 35)
    for i in range(200):
        s.append([rec(i)], "r")
    s.close()
    kept = lines(tmp_path)
    total = sum(p.stat().st_size for p in segment_paths(tmp_path))
    assert total <= one * 35 + one * 2
    assert len(segment_paths(tmp_path)) >= 3
    # What is left is the newest records, in order, and the counter says how many went.
    msgs = [k["log"]["message"] for k in kept]
    assert msgs == [f"m{i}" for i in range(200 - len(kept), 200)]
    assert s.lost == {"spill_bound": 200 - len(kept)}


def test_replay_removes_accepted_and_keeps_refused_with_the_reason(tmp_path):
    s = Spill(tmp_path)
    s.append([rec(i) for i in range(250)], "unreachable")
    sent: list[dict] = []

    def send(records):
        if any(r["message"] == "m120" for r in records):
            return Outcome("refused", 400, "HTTP 400: Validation error")
        sent.extend(records)
        return Outcome("ok", 200)

    r = s.replay(send, batch_size=100)
    assert (r.sent, r.refused, r.stopped) == (150, 100, "")
    assert sent == [rec(i) for i in range(250) if not 100 <= i < 200]
    left = lines(tmp_path)
    assert [x["log"] for x in left] == [rec(i) for i in range(100, 200)]
    assert all(x["reason"] == "HTTP 400: Validation error" and x["retry"] is False for x in left)
    # An automatic replay leaves refused records alone; a manual one sends them again.
    r2 = s.replay(lambda recs: Outcome("ok", 200))
    assert (r2.sent, r2.kept) == (0, 100)
    r3 = s.replay(lambda recs: Outcome("ok", 200), retry_only=False)
    assert r3.sent == 100 and lines(tmp_path) == []


def test_replay_stops_when_the_server_goes_away_and_keeps_the_rest(tmp_path):
    s = Spill(tmp_path, segment_bytes=2000, max_bytes=10**7)
    s.append([rec(i) for i in range(100)], "r")
    calls = []

    def send(records):
        calls.append(len(records))
        return Outcome("ok", 200) if len(calls) == 1 else Outcome("down", 0, "refused")

    r = s.replay(send, batch_size=10)
    assert r.sent == 10 and r.stopped == "refused"
    assert [x["log"]["message"] for x in lines(tmp_path)] == [f"m{i}" for i in range(10, 100)]


def test_damaged_lines_are_set_aside_not_deleted(tmp_path):
    s = Spill(tmp_path)
    s.append([rec(1)], "r")
    s.close()
    seg = segment_paths(tmp_path)[0]
    with open(seg, "ab") as f:
        f.write(b'{"log": {"message": "trunc\n[1,2]\n')
    s.append([rec(2)], "r")
    r = s.replay(lambda recs: Outcome("ok", 200))
    assert r.sent == 2 and r.damaged == 2
    aside = list(tmp_path.glob(DAMAGED_PREFIX + "*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b'{"log": {"message": "trunc\n[1,2]\n'
    assert segment_paths(tmp_path) == []


def test_a_segment_being_written_is_not_replayed_by_another_spill(tmp_path):
    writer = Spill(tmp_path)
    writer.append([rec(1)], "r")  # its active segment stays open and locked
    other = Spill(tmp_path)
    sent: list[dict] = []
    r = other.replay(lambda recs: sent.extend(recs) or Outcome("ok", 200))
    assert sent == [] and r.skipped_segments == 1
    writer.close()
    r = other.replay(lambda recs: sent.extend(recs) or Outcome("ok", 200))
    assert sent == [rec(1)] and r.skipped_segments == 0


def test_unencodable_values_are_kept_as_text(tmp_path):
    s = Spill(tmp_path)
    r = rec(1)
    r["metadata"]["obj"] = object()
    r["metadata"]["when"] = {1, 2}
    poison = rec(2)
    cycle: dict = {"name": "loop"}
    cycle["self"] = cycle
    poison["metadata"].update({(1, 2): "tuple key", "nan": float("nan"), "inf": float("-inf"),
                               "cycle": cycle})  # fmt: skip
    s.append([r, poison, rec(3)], "r")
    s.close()
    got = lines(tmp_path)  # strict JSON: json.loads would accept NaN, the server may not
    meta = got[0]["log"]["metadata"]
    assert meta["obj"].startswith("<object object") and sorted(meta["when"]) == [1, 2]
    bad = got[1]["log"]["metadata"]
    assert (bad["(1, 2)"], bad["nan"], bad["inf"]) == ("tuple key", "nan", "-inf")
    assert bad["cycle"]["name"] == "loop" and got[2]["log"] == rec(3)
    for p in segment_paths(tmp_path):
        assert b"NaN" not in p.read_bytes() and b"Infinity" not in p.read_bytes()
