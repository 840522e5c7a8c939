"""The deadline arithmetic and the health record (pure: no server)."""

from __future__ import annotations

from pymongo.errors import AutoReconnect, DuplicateKeyError, NetworkTimeout, WTimeoutError

from bucketq.bucket import deadline as d


def test_a_write_gives_up_a_budget_after_its_oldest_bucket_was_due():
    assert d.write_deadline([100.0, 99.0], 0.5, 60.0) == 159.5
    # The last attempt gets what is left, never less than the floor.
    assert d.attempt_timeout(159.5, 150.0) == 9.5
    assert d.attempt_timeout(159.5, 159.4) == d.MIN_ATTEMPT_TIMEOUT
    assert d.may_retry(159.5, 159.4) and not d.may_retry(159.5, 159.5)
    assert d.backoff_within(5.0, 159.5, 158.0) == 1.5
    assert d.backoff_within(5.0, 159.5, 170.0) == 0.0


def test_a_waiting_read_keeps_its_calls_and_pauses_within_the_callers_timeout():
    # No timeout: op_timeout per call, the whole pause.
    assert d.call_timeout(10.0, None, 50.0) == 10.0
    assert d.wait_within(0.5, None, 50.0) == 0.5
    # Three seconds left: a call gets them (never less than the floor), a pause no more.
    assert d.call_timeout(10.0, 53.0, 50.0) == 3.0
    assert d.call_timeout(10.0, 53.0, 52.9) == d.MIN_ATTEMPT_TIMEOUT
    assert d.call_timeout(2.0, 53.0, 50.0) == 2.0
    assert d.wait_within(0.5, 53.0, 50.0) == 0.5
    assert d.wait_within(5.0, 53.0, 50.0) == 3.0
    # The timeout has passed: no more pauses (the read returns empty).
    assert d.wait_within(0.5, 53.0, 53.0) is None


def test_a_state_flush_gets_at_most_half_a_lease():
    assert d.state_flush_timeout(10.0, 30.0) == 10.0
    assert d.state_flush_timeout(10.0, 2.0) == 1.0


def test_what_counts_as_an_unanswered_call():
    assert d.is_unanswered(NetworkTimeout("timed out"))
    assert d.is_unanswered(AutoReconnect("refused"))
    assert d.is_unanswered(d.StartupBusy("busy"))
    assert not d.is_unanswered(DuplicateKeyError("dup"))  # the server answered
    assert not d.is_unanswered(WTimeoutError("wtimeout"))


def test_health_says_since_when_and_clears_on_the_next_answer():
    h = d.Health("queue q")
    assert h.report(0.0)["ok"]
    h.failed(NetworkTimeout("timed out"), 10.0)
    h.failed(NetworkTimeout("timed out again"), 12.0)
    r = h.report(15.0)
    assert not r["ok"] and r["unreachable_since"] == 10.0 and r["unreachable_for"] == 5.0
    assert r["last_error"] == "NetworkTimeout: timed out again" and r["last_error_at"] == 12.0
    h.answered(16.0)
    r = h.report(17.0)
    assert r["ok"] and r["unreachable_since"] is None and r["last_answer_at"] == 16.0
    assert r["last_error"]  # kept, for whoever looks after the fact


def test_clients_bucketq_builds_get_timeouts_the_uri_does_not_set():
    got = d.client_timeouts("mongodb://h/?socketTimeoutMS=5&connecttimeoutms=7")
    assert "socketTimeoutMS" not in got and "connectTimeoutMS" not in got
    assert got["serverSelectionTimeoutMS"] > 0 and got["waitQueueTimeoutMS"] > 0
    assert d.client_timeouts(None) == d.CLIENT_TIMEOUTS_MS
