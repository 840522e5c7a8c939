"""Dispatch delay: per kind, longer around the UTC date boundary, none for
OTLP records. The decision is pure (``DelayPolicy``, clock injected); the transports
hold delayed records durably at once and deliver them when due."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketq.errors import ConfigurationError
from bucketq.reservoir import BufferedReservoir, from_env
from bucketq.reservoir._policy import DAY, DelayPolicy, in_window, parse_window
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import eventually, settled

pytestmark = pytest.mark.timeout(120)

DEFAULT_WINDOW = parse_window("23:45-00:15")


def at(hhmmss: str, day: str = "2026-03-01") -> float:
    """The POSIX time of ``hhmmss`` UTC on ``day``."""
    dt = datetime.fromisoformat(f"{day}T{hhmmss}+00:00")
    return float(calendar.timegm(dt.utctimetuple()))


# -- the pure decision -----------------------------------------------------------------------


def test_the_default_window_is_23_45_to_00_15_utc():
    for t in ("23:45:00", "23:59:59", "00:00:00", "00:14:59"):
        assert in_window(at(t), DEFAULT_WINDOW), t
    for t in ("23:44:59", "00:15:00", "12:00:00", "00:15:01"):
        assert not in_window(at(t), DEFAULT_WINDOW), t


minutes = st.integers(0, 24 * 60 - 1)
times = st.floats(0, 4_102_444_800, allow_nan=False)  # 1970 .. 2100


@given(times, minutes, minutes)
def test_in_window_agrees_with_the_utc_calendar(t, a, b):
    if a == b:
        return
    window = (a * 60, b * 60)
    dt = datetime.fromtimestamp(t, UTC)
    second = dt.hour * 3600 + dt.minute * 60 + dt.second + dt.microsecond / 1e6
    expected = (a * 60 <= second < b * 60) if a < b else (second >= a * 60 or second < b * 60)
    assert in_window(t, window) == expected


@given(times, minutes, minutes)
def test_a_window_and_its_reverse_split_every_day(t, a, b):
    if a != b:
        assert in_window(t, (a * 60, b * 60)) != in_window(t, (b * 60, a * 60))


@given(times, st.integers(0, 365 * 200))
def test_in_window_depends_only_on_the_time_of_day(t, days):
    assert in_window(t, DEFAULT_WINDOW) == in_window(t + days * DAY, DEFAULT_WINDOW)


kinds = st.sampled_from(["log", "span", "metric"])
seconds = st.floats(0, 3600, allow_nan=False)


@given(kinds, st.sampled_from(["api", "otlp"]), times,
       st.dictionaries(kinds, seconds), seconds, minutes, minutes)  # fmt: skip
def test_the_dispatch_delay(kind, origin, now, by_kind, boundary, a, b):
    if a == b:
        return
    policy = DelayPolicy(by_kind, boundary, (a * 60, b * 60))
    d = policy.delay(kind, origin, now)
    if origin == "otlp":
        assert d == 0  # a collector batched them already
    elif in_window(now, policy.window):
        assert d == max(by_kind.get(kind, 0.0), boundary)
    else:
        assert d == by_kind.get(kind, 0.0)
    assert policy.active == (boundary > 0 or any(v > 0 for v in by_kind.values()))


def test_delay_configuration_from_the_environment():
    default = from_env({}).delay_policy()
    assert not default.active  # today's behaviour: no delay
    assert default.window == DEFAULT_WINDOW
    cfg = from_env({"RESERVOIR_BUFFER_DISPATCH_DELAY_BY_KIND": "span=5000,log=250",
                    "RESERVOIR_BUFFER_DATE_BOUNDARY_DELAY_MS": "600000",
                    "RESERVOIR_BUFFER_DATE_BOUNDARY_WINDOW": "23:30-00:30"})  # fmt: skip
    p = cfg.delay_policy()
    assert p.delay("span", "api", at("12:00:00")) == 5.0
    assert p.delay("log", "api", at("12:00:00")) == 0.25
    assert p.delay("metric", "api", at("12:00:00")) == 0.0
    assert p.delay("metric", "api", at("23:40:00")) == 600.0
    assert p.delay("span", "otlp", at("23:40:00")) == 0.0
    for var, bad in (("DISPATCH_DELAY_BY_KIND", "trace=5"), ("DISPATCH_DELAY_BY_KIND", "span=-1"),
                     ("DISPATCH_DELAY_BY_KIND", "span=5s"), ("DATE_BOUNDARY_DELAY_MS", "-5"),
                     ("DATE_BOUNDARY_WINDOW", "23:45"), ("DATE_BOUNDARY_WINDOW", "24:00-00:15"),
                     ("DATE_BOUNDARY_WINDOW", "00:15-00:15")):  # fmt: skip
        with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_" + var):
            from_env({"RESERVOIR_BUFFER_" + var: bad})
    with pytest.raises(ConfigurationError, match="dispatch_delay_by_kind"):
        FAST_BUFFER.with_(dispatch_delay_by_kind="span=x")


# -- through the transports ---------------------------------------------------------------------


class Ordered(FakeStorage):
    """Remembers the order in which records of every kind were stored."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    def _write(self, kind, records):
        out = super()._write(kind, records)
        self.order.extend(r.get("message") or r.get("name") for r in records)
        return out


def _span(name: str) -> dict:
    return {"project_id": "p", "trace_id": "t1", "span_id": name, "name": name}


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_a_delayed_kind_is_held_and_flushed_after_undelayed_records(backends, transport):
    """Spans wait 1 s; a span that came through OTLP and a log do not: both are stored
    before the delayed span although it was accepted first (same project, same shard)."""
    storage = Ordered()
    cfg = FAST_BUFFER.with_(dispatch_delay_by_kind="span=1000")
    buf = BufferedReservoir(storage, backends.transport(transport), cfg)
    async with buf:
        assert (await buf.ingest_spans([_span("delayed")]))["ingested"] == 1
        assert sum((await buf.transport.pending()).values()) == 1  # held at once
        await buf.ingest_spans([_span("otlp")], origin="otlp")
        await buf.ingest([{"project_id": "p", "message": "log"}])
        await settled(buf)
        await eventually(lambda: len(storage.order) == 3, what="all three stored")
        assert buf.stats()["delayed"] == 1
        text = buf.render_metrics()
    assert storage.order.index("delayed") == 2, storage.order
    assert 'reservoir_buffer_delayed_total{kind="span",shard=' in text
    with pytest.raises(ValueError, match="origin must be one of api, otlp"):
        await buf.ingest([{"project_id": "p"}], origin="collector")


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_the_date_boundary_delay_follows_the_injected_utc_clock(backends, transport):
    storage = Ordered()
    now = {"t": at("23:50:00")}
    cfg = FAST_BUFFER.with_(date_boundary_delay_ms=1000)
    buf = BufferedReservoir(storage, backends.transport(transport), cfg,
                            wall_clock=lambda: now["t"])  # fmt: skip
    async with buf:
        await buf.ingest([{"project_id": "p", "message": "boundary"}])  # 23:50: delayed
        await buf.ingest([{"project_id": "p", "message": "otlp"}], origin="otlp")
        now["t"] = at("00:15:00")  # the window has ended
        await buf.ingest([{"project_id": "p", "message": "after"}])
        await eventually(lambda: len(storage.order) == 3, what="all three stored")
        assert buf.stats()["delayed"] == 1
    assert storage.order == ["otlp", "after", "boundary"]


@pytest.mark.parametrize("transport", ["redis", "bucketq"])
async def test_a_delayed_record_is_durable_at_once(backends, transport):
    """Stopped before its delay ran out, the record is kept by the transport and a new
    buffer on it stores it."""
    cfg = FAST_BUFFER.with_(dispatch_delay_by_kind="log=3000")
    first = FakeStorage()
    buf = BufferedReservoir(first, backends.transport(transport), cfg)
    async with buf:
        await buf.ingest([{"project_id": "p", "message": "kept"}])
    report = await buf.stop()
    assert first.stored["log"] == [] and report["kept"] == 1 and report["lost"] == 0
    second = FakeStorage()
    async with BufferedReservoir(second, backends.transport(transport), cfg) as again:
        # Pending from the start, waiting for its delay: not a stall.
        assert again.buffer_health(stall_after=0.0)["ok"]
        await eventually(lambda: second.messages() == ["kept"], what="the kept record stored")
        await settled(again)


async def test_stopping_the_memory_transport_flushes_delayed_records_at_once(backends):
    """Memory holds them in this process only: stop() writes them instead of waiting out
    the delay (here an hour) or losing them."""
    storage = FakeStorage()
    cfg = FAST_BUFFER.with_(dispatch_delay_by_kind="log=3600000")
    buf = BufferedReservoir(storage, backends.transport("memory"), cfg)
    async with buf:
        await buf.ingest([{"project_id": "p", "message": "held"}])
        assert buf.buffer_health(stall_after=0.0)["ok"]  # waiting for its delay: no stall
    report = await buf.stop()
    assert report["lost"] == 0 and report["flushed"] == 1 and not report["timed_out"]
    assert storage.messages() == ["held"]


async def test_passthrough_never_delays(backends):
    storage = FakeStorage()
    buf = BufferedReservoir(storage, backends.transport("passthrough"),
                            FAST_BUFFER.with_(dispatch_delay_by_kind="log=3600000"))  # fmt: skip
    async with buf:
        assert (await buf.ingest([{"project_id": "p", "message": "now"}]))["ingested"] == 1
        assert storage.messages() == ["now"]
