"""The worker's decisions, without a queue: options, failure delays, the stop state
machine, time limits over slots, restarts, counters (``bucketq.worker.core``, a private
module: its rules have no public face of their own)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bucketq import ConfigurationError
from bucketq.worker import Retry, TimeLimitExceeded, WorkerOptions, core
from bucketq.worker_cli import queue_options


class Transient(OSError):
    pass


def test_failure_delay_takes_retry_then_the_most_specific_class_then_none():
    table = {OSError: 30.0, Transient: lambda tries: 5.0 * tries, TimeLimitExceeded: 1.0}
    assert core.failure_delay(Retry(7), 1, table) == 7.0
    assert core.failure_delay(Retry(), 1, table) is None  # Retry() alone: the back-off
    assert core.failure_delay(Transient(), 3, table) == 15.0  # its own entry, with tries
    assert core.failure_delay(ConnectionResetError(), 1, table) == 30.0  # an OSError
    assert core.failure_delay(TimeLimitExceeded(), 1, table) == 1.0
    assert core.failure_delay(ValueError(), 1, table) is None
    assert core.failure_delay(ValueError(), 1, None) is None


def test_a_retry_for_function_that_returns_nonsense_is_refused_by_name():
    with pytest.raises(ConfigurationError, match=r"retry_for\[ValueError\]"):
        core.failure_delay(ValueError(), 1, {ValueError: lambda tries: -1})
    with pytest.raises(ConfigurationError, match="Retry"):
        Retry(float("nan"))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"concurrency": 0}, "concurrency must be a whole number from 1 to 1024"),
        ({"time_limit": 0}, "time_limit must be a finite number greater than 0"),
        ({"batch": True}, "batch must be a whole number"),
        ({"retry_for": {"ValueError": 3}}, "is not an exception class"),
        ({"retry_for": [ValueError]}, "retry_for must be a dict of exception classes"),
        ({"retry_for": {ValueError: math.inf}}, r"retry_for\[ValueError\]"),
        ({"concurency": 2}, "Unknown worker option"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, says):
    with pytest.raises(ConfigurationError, match=says):
        WorkerOptions.build(**options)


def test_the_defaults():
    o = WorkerOptions.build()
    assert (o.concurrency, o.batch, o.time_limit, o.drain_timeout, o.max_items) == (
        1, None, core.DEFAULT_TIME_LIMIT, None, None,
    )  # fmt: skip


def test_a_signal_moves_one_level_and_a_request_never_back():
    s = core.StopState()
    s.request(core.STOPPING, "the supervisor said stop")
    s.signal("SIGTERM")  # the same stop sent to the process group: it is the second
    assert (s.level, s.reason) == (core.ABORTING, "SIGTERM")
    s.request(core.STOPPING, "late")
    assert s.level == core.ABORTING
    s2 = core.StopState()
    s2.request(core.STOPPING, "stop()")
    s2.request(core.STOPPING, "the supervisor said stop")  # the same level: counts once
    assert (s2.level, s2.reason) == (core.STOPPING, "stop()")
    assert s2.news() == core.STOPPING and s2.news() is None


def _slot(gen: int, started: float, limit: float, expired: int = 0) -> core.Slot:
    s = core.Slot(0)
    s.expired = expired
    s.current = (["m"], started, started + limit, gen)
    return s


def test_time_limits_over_slots():
    idle = core.Slot(1)
    running = _slot(1, 100.0, 10.0)
    late = _slot(2, 100.0, 1.0)
    expired = _slot(3, 90.0, 1.0, expired=3)
    slots = [idle, running, late, expired]
    assert [s for s, _ in core.overdue(slots, 102.0)] == [late]
    assert core.in_hand(slots) == 2  # the expired one is no longer this worker's
    assert core.stuck(slots, 102.0) == 1  # 11 s past its limit
    assert core.stuck(slots, 91.5) == 0  # not yet STUCK_AFTER past it
    assert core.next_look([running], 109.95) == pytest.approx(0.05)
    assert core.next_look([idle], 0.0) == core.CONTROL_PERIOD


def test_touches_come_every_period_and_not_for_expired_deliveries():
    running, expired = _slot(1, 100.0, 1000.0), _slot(2, 100.0, 1.0, expired=2)
    assert list(core.touch_due([running, expired], 105.0, 10.0)) == []
    assert list(core.touch_due([running, expired], 111.0, 10.0)) == [["m"]]
    assert list(core.touch_due([running], 115.0, 10.0)) == []  # touched at 111
    assert core.touch_period(30.0, 10.0) == pytest.approx(40.0 / 3)


def test_restarts_back_off_while_processes_die_young_and_give_up():
    r = core.Restarts(young=10.0, give_up=3, base=0.5, cap=30.0)
    assert r.exited(1, 3600.0) == 0.0  # it lived: start another at once
    assert r.exited(core.EXIT_STUCK, 0.1) == 0.0  # it asked to be replaced
    assert 0 < r.exited(1, 0.5) <= 0.5
    assert 0 < r.exited(1, 0.5) <= 1.0
    assert r.exited(1, 0.5) is None
    assert core.exit_status([0, 0]) == 0
    assert core.exit_status([0, None]) == 1


def test_counters_of_exited_processes_add_up():
    a = core.tally_stats([core.Tally()])
    t = core.Tally()
    t.committed, t.failed = 5, 1
    t.observe(0.002)
    b = core.tally_stats([t])
    total = core.add_stats(core.add_stats({}, a), b)
    assert (total["committed"], total["failed"]) == (5, 1)
    assert sum(total["handler_seconds"]["counts"]) == 1
    assert total["handler_seconds"]["counts"][1] == 1  # 2 ms: the (1 ms, 5 ms] bucket


def test_health_says_why_not():
    assert core.health(core.RUNNING, 4, 0, 0.1, True) == (True, "running")
    assert core.health(core.RUNNING, 4, 4, 0.1, True)[1].startswith("every handler (4) is stuck")
    assert not core.health(core.RUNNING, 4, 0, 0.1, False)[0]
    assert "control loop" in core.health(core.RUNNING, 4, 0, 60.0, True)[1]


def test_a_failure_log_line_names_ids_tries_and_type_never_the_payload():
    fmt, args, extra = core.failure_record("jobs", ["a.1", "a.2"], 3, "ValueError", "failed", 20.0)
    line = fmt % args
    assert line == "queue jobs: item a.1, a.2 failed (try 3): ValueError; delivered again in 20 s"
    assert extra == {"queue": "jobs", "items": ["a.1", "a.2"], "tries": 3,
                     "exception": "ValueError", "outcome": "failed", "retry_in": 20.0}  # fmt: skip
    fmt, args, _ = core.failure_record("jobs", ["a.1"], 5, "ValueError", "dead_letter", None)
    assert (fmt % args).endswith("to the dead-letter queue")
    try:
        try:
            raise KeyError("secret")
        except KeyError as exc:
            raise Retry(5) from exc
    except Retry as r:
        assert core.exception_name(r) == "Retry (from KeyError)"
        assert core.failure_reason(r) == "Retry: retry in 5 s"


def test_queue_options_on_the_command_line_are_read_by_their_checks():
    assert queue_options(["max_tries=5", "lease=60", "prefetch=0"]) == {
        "max_tries": 5, "lease": 60.0, "prefetch": 0,
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="max_tries must be a whole number"):
        queue_options(["max_tries=five"])
    with pytest.raises(ConfigurationError, match="NAME=VALUE with NAME one of"):
        queue_options(["colour=red"])


def test_the_docs_table_is_rendered_from_the_code():
    text = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()
    m = re.search(r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", text, re.S)
    assert m, "docs/worker.md lost its config-table markers"
    assert m.group(1) == core.options_table(), (
        "regenerate docs/worker.md's table with bucketq.worker.core.options_table()"
    )
