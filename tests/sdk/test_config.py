"""One processor per configuration; options validated with errors that name them;
records built from logging calls (extra -> metadata, exception -> a field)."""

from __future__ import annotations

import logging
import logging.config
import sys
from datetime import UTC, datetime

import pytest

from bucketq.errors import ConfigurationError
from bucketq.sdk import Client, IngestHandler
from bucketq.sdk._options import make_config
from bucketq.sdk._policy import classify, parse_retry_after
from bucketq.sdk._record import capture, from_log_record, to_wire, wire

from .helpers import dead_port


def test_same_configuration_same_processor_other_configuration_nothing_shared(tmp_path):
    url = f"http://127.0.0.1:{dead_port()}"
    a = Client(url, "k1", spill_dir=tmp_path)
    b = Client(url + "/api/v1/ingest", "k1", spill_dir=tmp_path)
    h = IngestHandler(url, "k1", spill_dir=tmp_path)
    c = Client(url, "k2", spill_dir=tmp_path)
    d = Client(url, "k1", spill_dir=tmp_path, queue_size=10)
    assert a.processor is b.processor is h.processor
    procs = [a.processor, c.processor, d.processor]
    assert len({id(p) for p in procs}) == 3
    assert len({id(p.queue) for p in procs}) == 3
    # The spill belongs to the destination (url and key), whatever the other options.
    assert a.processor.spill.directory == d.processor.spill.directory != c.processor.spill.directory
    threads = [set(p._threads) for p in procs]
    assert not (threads[0] & threads[1]) and not (threads[0] & threads[2])
    # The last user closes the shared processor; the others keep it running.
    a.close(0)
    b.close(0)
    assert not h.processor.closed
    h.close()
    assert a.processor.closed
    assert Client(url, "k1", spill_dir=tmp_path).processor is not a.processor


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"url": "ftp://x", "api_key": "k"}, "url"),
        ({"url": "http://h", "api_key": ""}, "api_key"),
        ({"url": "http://h", "api_key": "k", "queue_size": 0}, "queue_size"),
        ({"url": "http://h", "api_key": "k", "workers": 1.5}, "workers"),
        ({"url": "http://h", "api_key": "k", "batch_wait": float("nan")}, "batch_wait"),
        ({"url": "http://h", "api_key": "k", "timeout": -1}, "timeout"),
        ({"url": "http://h", "api_key": "k", "fallback_url": "http://h"}, "fallback_url"),
        ({"url": "http://h", "api_key": "k", "bogus": 1}, "bogus"),
        ({"url": "http://h", "api_key": "k", "service": ""}, "service"),
        ({"url": "http://h", "api_key": "k", "spill_segment_bytes": 10, "spill_max_bytes": 5},
         "spill_segment_bytes"),
    ],
)  # fmt: skip
def test_bad_options_name_the_argument(kwargs, names):
    with pytest.raises(ConfigurationError, match=names):
        Client(**kwargs)


def test_options_are_checked_where_declared_and_equal_values_are_one_configuration(tmp_path):
    base = {"url": "http://h:8080", "api_key": "k", "spill_dir": tmp_path}
    one = make_config(**base, batch_wait=1, queue_size=10)
    assert one == make_config(**{**base, "url": "http://h:8080/api/v1/ingest"}, batch_wait=1.0,
                              queue_size=10)  # fmt: skip
    assert one.spill_path() == make_config(**base, batch_wait=1.0, queue_size=10).spill_path()
    assert one.url == "http://h:8080" and one.ingest_url == "http://h:8080/api/v1/ingest"
    # The message names the option and what it accepts, as every option check does.
    with pytest.raises(ConfigurationError) as err:
        Client(**base, queue_size=True)
    assert str(err.value) == "queue_size must be a whole number at least 1; got True."
    with pytest.raises(
        ConfigurationError, match="service must be a non-empty string of at most 100"
    ):
        Client(**base, service="s" * 101)


def test_client_log_rejects_an_unknown_level(tmp_path):
    c = Client(f"http://127.0.0.1:{dead_port()}", "k", spill_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="level"):
        c.log("loud", "x")
    assert c.stats()["queued"] == 0


def test_log_record_to_wire_extra_exception_trace():
    logger = logging.getLogger("app.payments")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    h = Keep()
    logger.addHandler(h)
    try:
        logger.warning("paid %s", 12, extra={"order": "A1", "trace_id": "ab" * 16,
                                             "span_id": "cd" * 8})  # fmt: skip
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            logger.exception("failed")
    finally:
        logger.removeHandler(h)
    w = to_wire(from_log_record(records[0], "svc"))
    assert w["level"] == "warn" and w["message"] == "paid 12" and w["service"] == "svc"
    assert w["metadata"] == {"logger": "app.payments", "order": "A1"}
    assert (w["trace_id"], w["span_id"]) == ("ab" * 16, "cd" * 8)
    assert w["time"].endswith("+00:00")
    e = to_wire(from_log_record(records[1], "svc"))
    assert e["level"] == "error"
    assert e["metadata"]["exception"]["type"] == "ZeroDivisionError"
    assert "1 / 0" in e["metadata"]["exception"]["traceback"]


def test_what_the_caller_keeps_is_sent_like_the_whole_record():
    args = ["a"]
    r = logging.LogRecord("app.x", logging.INFO, __file__, 1, "items %s", (args,), None)
    r.__dict__.update({"order": "A1", "trace_id": "ab" * 16, "service": "other"})
    plain = logging.LogRecord("app.y", logging.DEBUG, __file__, 1, "", None, None)
    kept, kept_plain = capture(r), capture(plain)
    args.append("b")  # changed after the call: the message was formatted at call time
    r.order = "B2"
    assert len(kept_plain) == 4  # no extra=: time, level, logger, message
    w = wire(kept, "svc")
    assert w["message"] == "items ['a']" and w["metadata"] == {"logger": "app.x", "order": "A1"}
    assert (w["service"], w["trace_id"], w["level"]) == ("other", "ab" * 16, "info")
    assert w["time"] == datetime.fromtimestamp(r.created, UTC).isoformat(timespec="milliseconds")
    assert wire(kept_plain, "svc") == to_wire(from_log_record(plain, "svc"))


def test_dict_config_builds_the_handler(tmp_path):
    url = f"http://127.0.0.1:{dead_port()}"
    logging.config.dictConfig({
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"ingest": {"class": "bucketq.sdk.IngestHandler", "url": url,
                                "api_key": "k", "spill_dir": str(tmp_path),
                                "service": "dc", "level": "INFO"}},
        "loggers": {"dc.test": {"handlers": ["ingest"], "level": "DEBUG"}},
    })  # fmt: skip
    lg = logging.getLogger("dc.test")
    (h,) = lg.handlers
    try:
        assert isinstance(h, IngestHandler) and h.processor.cfg.service == "dc"
        lg.debug("below the handler's level")
        lg.info("kept")
        assert h.stats()["queued"] == 1
    finally:
        lg.removeHandler(h)
        h.close()


def test_classify_statuses_and_retry_after():
    kw = {"now": 1000.0, "backoff": 1.0, "max_retry_after": 60.0, "sent": 2}
    assert classify(200, None, b'{"received": 2, "timestamp": "t"}', **kw).kind == "ok"
    # A 2xx that is not the service's answer to these records is not delivery, and says why.
    for body, why in ((b"<!doctype html><title>Login</title>", "not JSON (it starts: '<!doctype"),
                      (b'{"received": 2, "timest', "not JSON"), (b"", "an empty body"),
                      (b'{"status": "ok"}', "without the count"), (b"[2]", "without the count"),
                      (b'{"received": true}', "without the count"),
                      (b'{"received": 1}', "received 1 of the 2 records"),
                      (b"{" + b" " * 70_000 + b"}", "more than 65536 bytes")):  # fmt: skip
        r = classify(204, None, body, url="http://x/api/v1/ingest", **kw)
        assert r.kind == "invalid" and why in r.reason and "http://x/api/v1/ingest" in r.reason, r
    r = classify(429, "7", b"", **kw)
    assert (r.kind, r.retry_after) == ("retry", 7.0)
    assert classify(503, None, b"", **kw).retry_after == 1.0
    assert classify(503, "100000", b"", **kw).retry_after == 60.0
    bad = classify(400, None, b'{"error":"Validation error","details":[{"field":"logs.0"}]}', **kw)
    assert bad.kind == "refused" and "Validation error" in bad.reason and "logs.0" in bad.reason
    assert classify(401, None, b"no", **kw).reason == "HTTP 401: no"
    assert classify(500, None, b"", **kw).kind == "refused"
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 0.0) > 0
    assert parse_retry_after("soon", 0.0) is None
    assert parse_retry_after("nan", 0.0) is None


def test_importing_the_sdk_does_not_import_urllib3():
    import subprocess

    code = "import sys, bucketq.sdk; print('urllib3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_replay_command_refuses_bad_arguments_with_a_clear_message(tmp_path, capsys):
    from bucketq.cli import main

    assert main(["sdk", "replay", str(tmp_path / "nope"), "--url", "http://127.0.0.1:1",
                 "--api-key", "k"]) == 2  # fmt: skip
    assert "does not exist" in capsys.readouterr().err
    assert main(["sdk", "replay", str(tmp_path), "--url", "ftp://x", "--api-key", "k"]) == 2
    assert "url must be an http:// or https:// URL" in capsys.readouterr().err
    # An empty directory: nothing to send, nothing left.
    assert main(["sdk", "replay", str(tmp_path), "--url", "http://127.0.0.1:1",
                 "--api-key", "k"]) == 0  # fmt: skip
    assert "sent 0 record(s)" in capsys.readouterr().out
