"""Automatic overflow: a project whose writes keep failing while other
projects' are stored moves to the overflow shard for a cool-down, so it neither blocks
its shard-mates nor opens the breaker for everyone. The decision is pure
(``ProjectOverflow``); end to end with real MongoDB storage that refuses one project."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stored_logs import astored_logs

from bucketq.errors import ConfigurationError
from bucketq.reservoir import BufferedReservoir, MongoReservoir, from_env
from bucketq.reservoir._policy import ProjectOverflow
from fast_settings import FAST_BUFFER

from .conftest import FakeClock
from .helpers import eventually

pytestmark = pytest.mark.timeout(180)


# -- the pure decision -----------------------------------------------------------------------


def test_a_project_failing_alone_moves_after_its_failures_and_comes_back_after_the_cooldown():
    clock = FakeClock()
    ov = ProjectOverflow(3, 60.0, clock)
    assert ov.observe({"calm"}, {"noisy"}) == []
    assert ov.observe({"calm"}, {"noisy"}) == []
    assert ov.observe({"calm"}, {"noisy"}) == ["noisy"]
    assert set(ov.moved) == {"noisy"}
    assert ov.observe({"calm"}, {"noisy"}) == []  # already moved
    clock.advance(59.9)
    assert ov.expire() == []
    clock.advance(0.1)
    assert ov.expire() == ["noisy"] and not ov.moved
    # Still failing: moved again after as many failures, not at once.
    assert ov.observe(set(), {"noisy"}) == []
    assert ov.observe({"calm"}, {"noisy"}) == []
    assert ov.observe({"calm"}, {"noisy"}) == ["noisy"]


def test_an_outage_moves_nobody_and_a_success_resets_the_count():
    clock = FakeClock()
    ov = ProjectOverflow(2, 60.0, clock)
    for _ in range(10):  # every project fails: not any one project's trouble
        assert ov.observe(set(), {"a", "b", "c"}) == []
        clock.advance(1)
    ov2 = ProjectOverflow(2, 60.0, clock)
    assert ov2.observe({"calm"}, {"noisy"}) == []
    assert ov2.observe({"calm", "noisy"}, set()) == []  # stored: the streak ends
    assert ov2.observe({"calm"}, {"noisy"}) == []
    assert ov2.observe({"calm"}, {"noisy"}) == ["noisy"]


def test_other_projects_must_have_stored_since_the_streak_began():
    clock = FakeClock()
    ov = ProjectOverflow(2, 60.0, clock)
    ov.observe({"calm"}, set())  # calm stored before noisy's trouble began
    clock.advance(1)
    assert ov.observe(set(), {"noisy"}) == []
    clock.advance(1)
    assert ov.observe(set(), {"noisy"}) == []  # nobody else stored since: an outage?
    clock.advance(1)
    assert ov.observe({"calm"}, {"noisy"}) == ["noisy"]


flushes = st.lists(
    st.tuples(
        st.sets(st.sampled_from("abcd")),  # stored
        st.sets(st.sampled_from("abcd")),  # failed
        st.sampled_from([0.0, 0.5, 7.0]),  # seconds before the flush
    ),
    max_size=40,
)


@given(flushes, st.integers(1, 4), st.sampled_from([1.0, 10.0]))
def test_project_overflow_matches_a_model_that_reads_the_whole_history(history, n, cooldown):
    """The incremental tracker against the rule read off the full history: p moves at a
    flush it failed in when it is not moved, its failures since its last all-stored
    flush (or its return from the overflow shard) reach n, and another project stored
    since the first."""
    clock = FakeClock(0.0)
    ov = ProjectOverflow(n, cooldown, clock)
    seen: list[tuple[float, set[str], set[str]]] = []
    until: dict[str, float] = {}
    reset_at: dict[str, int] = {}  # index of the flush after which p's streak restarts
    for stored, failed, dt in history:
        clock.advance(dt)
        now = clock()
        back = ov.expire()
        assert sorted(back) == sorted(p for p, u in until.items() if u <= now)
        for p in back:
            reset_at[p] = len(seen)  # its failures count again from here
        until = {p: u for p, u in until.items() if u > now}
        seen.append((now, stored - failed, failed))
        expected = []
        for p in sorted(failed):
            start = reset_at.get(p, 0)
            for i in range(len(seen) - 1, -1, -1):
                if p in seen[i][1]:
                    start = max(start, i + 1)
                    break
            streak = [i for i in range(start, len(seen)) if p in seen[i][2]]
            if p in until or len(streak) < n:
                continue
            since = seen[streak[0]][0]
            if any(t >= since and (s - {p}) for t, s, _ in seen[: len(seen)]):
                expected.append(p)
        got = ov.observe(stored, failed)
        assert got == expected
        for p in got:
            until[p] = now + cooldown
        assert set(ov.moved) == set(until)


def test_auto_overflow_configuration():
    cfg = from_env({})
    assert cfg.auto_overflow_failures == 0 and cfg.total_shards == cfg.shards  # off
    on = from_env({"RESERVOIR_BUFFER_AUTO_OVERFLOW_FAILURES": "5",
                   "RESERVOIR_BUFFER_AUTO_OVERFLOW_COOLDOWN_MS": "1000"})  # fmt: skip
    assert on.total_shards == on.shards + 1 and on.auto_overflow_cooldown_ms == 1000
    with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_AUTO_OVERFLOW_FAILURES"):
        from_env({"RESERVOIR_BUFFER_AUTO_OVERFLOW_FAILURES": "-1"})
    with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_AUTO_OVERFLOW_COOLDOWN_MS"):
        from_env({"RESERVOIR_BUFFER_AUTO_OVERFLOW_COOLDOWN_MS": "0"})


# -- end to end: real MongoDB that refuses one project's writes ----------------------------------


class Refusing(MongoReservoir):
    """MongoDB storage that refuses (as a throttled store would) every record of the
    projects in ``refused``, by index, and stores the others."""

    def __init__(self, db, refused: set[str]) -> None:
        super().__init__(db)
        self.refused = refused
        self.refusals = 0

    async def ingest(self, logs):
        bad = [i for i, r in enumerate(logs) if r.get("project_id") in self.refused]
        good = [r for i, r in enumerate(logs) if i not in set(bad)]
        res = await super().ingest(good) if good else {"ingested": 0, "failed": 0, "errors": []}
        assert res["failed"] == 0, res
        self.refusals += len(bad)
        errors = [{"index": i, "error": "throttled: write quota exceeded"} for i in bad]
        return {"ingested": len(good), "failed": len(bad), "errors": errors}


def _logs(project: str, n: int, round_: int) -> list[dict]:
    return [{"project_id": project, "service": "api", "level": "info",
             "message": f"{project}-{round_}-{i}", "time": "2026-03-01T12:00:00Z"}
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_a_refused_project_moves_to_the_overflow_shard_and_comes_back(
    backends, adb, transport, caplog
):
    caplog.set_level(logging.WARNING, "bucketq.reservoir")
    clock = FakeClock()
    storage = Refusing(adb, {"noisy"})
    # One shard: without the overflow shard, noisy and calm share everything. The breaker
    # opens after 3 failed flushes in a row; noisy fails far more often than that.
    cfg = FAST_BUFFER.with_(shards=1, auto_overflow_failures=2, auto_overflow_cooldown_ms=60_000,
                     max_retry_attempts=10_000, failure_threshold=3)  # fmt: skip
    buf = BufferedReservoir(storage, backends.transport(transport), cfg, clock=clock)
    calm_sent = 0
    async with buf:
        rnd = 0

        async def round_trip() -> None:
            nonlocal rnd, calm_sent
            rnd += 1
            assert (await buf.ingest(_logs("calm", 5, rnd) + _logs("noisy", 5, rnd)))["failed"] == 0
            calm_sent += 5

        async def moved() -> bool:
            await round_trip()
            return "noisy" in buf.stats()["overflowed"]

        await eventually(moved, what="noisy moved to the overflow shard")
        # Its retries and its new records now wait on the overflow shard (1), not shard 0.
        refusals = storage.refusals
        for _ in range(3):
            await round_trip()
        await eventually(lambda: storage.refusals >= refusals + 50, what="noisy refused on")

        async def calm_stored_shard_0_empty() -> bool:
            pend = await buf.transport.pending()
            stored = len(await astored_logs(adb, {"project_id": "calm"}))
            return pend[0] == 0 and pend[1] > 0 and stored == calm_sent

        await eventually(calm_stored_shard_0_empty, what="calm stored, noisy all on shard 1")
        noisy_sent = 5 * rnd
        assert buf.stats()["breaker"] == "closed" and buf.stats()["bypassed"] == 0
        assert len(await astored_logs(adb, {"project_id": "noisy"})) == 0
        assert buf.shard_of("noisy") == 1 and buf.shard_of("calm") == 0

        # The cause goes away and the cool-down runs out: noisy is back on its shard.
        storage.refused.clear()
        clock.advance(60)
        assert buf.shard_of("noisy") == 0
        assert buf.stats()["overflowed"] == []

        async def noisy_stored() -> bool:
            return len(await astored_logs(adb, {"project_id": "noisy"})) == noisy_sent

        await eventually(noisy_stored, what="noisy's held records stored")
        text = buf.render_metrics()
    assert 'reservoir_buffer_overflow_moves_total{event="moved"} 1.0' in text
    assert 'reservoir_buffer_overflow_moves_total{event="back"} 1.0' in text
    assert "reservoir_buffer_overflow_projects 0.0" in text
    logged = [r.getMessage() for r in caplog.records]
    assert any("project noisy moved to the overflow shard 1" in m for m in logged), logged
    assert any("project noisy is back on its own shard" in m for m in logged), logged
