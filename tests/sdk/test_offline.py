"""The processor against servers that are not there or do not answer (real sockets):
what cannot be sent goes to the spill, the caller never waits, nothing is lost."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from bucketq.sdk import Client, IngestHandler

from .helpers import dead_port, eventually, spilled


@pytest.fixture
def frozen_url() -> Iterator[str]:
    """A listener that accepts connections (the kernel's backlog) and never answers,
    like a server stopped with SIGSTOP."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def test_dead_server_without_fallback_everything_goes_to_the_spill(tmp_path):
    c = Client(f"http://127.0.0.1:{dead_port()}", "k", spill_dir=tmp_path, batch_wait=0.01,
               health_interval=0.2, service="off")  # fmt: skip
    for i in range(30):
        assert c.log("error", f"m{i}", n=i) is True
    assert c.flush(10)
    st = c.stats()
    assert (st["sent"], st["spilled"], st["lost_total"], st["primary_up"]) == (0, 30, 0, False)
    recs = spilled(tmp_path)
    assert sorted(r["log"]["message"] for r in recs) == sorted(f"m{i}" for i in range(30))
    assert all(r["retry"] and "unreachable" in r["reason"] for r in recs)
    assert {r["log"]["metadata"]["n"] for r in recs} == set(range(30))
    assert all(r["log"]["service"] == "off" and r["log"]["level"] == "error" for r in recs)


def test_queue_full_spills_returns_false_and_never_waits(tmp_path, frozen_url):
    c = Client(frozen_url, "k", spill_dir=tmp_path, queue_size=10, batch_size=5, workers=2,
               timeout=60, batch_wait=0)  # fmt: skip
    results = [c.log("info", f"m{i}") for i in range(200)]  # the server never answers
    st = c.stats()
    assert results.count(False) == st["queue_full"] > 0
    assert st["queued"] + st["queue_full"] == 200
    assert st["spilled"] >= st["queue_full"] and st["sent"] == 0
    # close() cannot deliver: what is queued or in flight goes to the spill too.
    assert c.close(timeout=0.2) is False
    st = c.stats()
    assert (st["spilled"], st["lost_total"], st["pending"]) == (200, 0, 0)
    msgs = [r["log"]["message"] for r in spilled(tmp_path)]
    assert sorted(msgs) == sorted(f"m{i}" for i in range(200))
    reasons = {r["reason"] for r in spilled(tmp_path)}
    assert "queue full" in reasons and any(x.startswith("shutdown") for x in reasons)


def test_the_handler_ignores_the_sdk_logger_and_its_own_threads(tmp_path):
    root = logging.getLogger()
    old = root.level
    h = IngestHandler(f"http://127.0.0.1:{dead_port()}", "k", spill_dir=tmp_path,
                      batch_wait=0.01, health_interval=0.1)  # fmt: skip
    root.addHandler(h)
    root.setLevel(logging.DEBUG)  # urllib3 logs every connection attempt at DEBUG
    try:
        for i in range(5):
            logging.getLogger("app").info("app %d", i)
        eventually(lambda: h.stats()["spilled"] == 5, what="5 spilled")
        logging.getLogger("bucketq.sdk").warning("an SDK warning")
        assert h.processor.flush(10)
    finally:
        root.removeHandler(h)
        root.setLevel(old)
        h.close()
    st = h.stats()
    assert st["queued"] == 5 and st["spilled"] == 5
    assert sorted(r["log"]["message"] for r in spilled(tmp_path)) == [f"app {i}" for i in range(5)]


EXIT_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from bucketq.sdk import IngestHandler
    url, spill = sys.argv[1], sys.argv[2]
    log = logging.getLogger("exiting")
    log.setLevel(logging.INFO)
    log.addHandler(IngestHandler(url, "k", spill_dir=spill, shutdown_timeout=0.3, timeout=60))
    for i in range(50):
        log.info("last %d", i)
    """
)


def test_exit_with_a_frozen_server_spills_the_last_records(tmp_path, frozen_url):
    subprocess.run([sys.executable, "-c", EXIT_SCRIPT, frozen_url, str(tmp_path)],
                   check=True, timeout=60)  # fmt: skip
    msgs = sorted(r["log"]["message"] for r in spilled(tmp_path))
    assert msgs == sorted(f"last {i}" for i in range(50))


def test_a_forked_child_sends_through_threads_of_its_own(tmp_path):
    import os

    c = Client(f"http://127.0.0.1:{dead_port()}", "k", spill_dir=tmp_path, batch_wait=0.01,
               health_interval=0.2)  # fmt: skip
    c.log("info", "parent")
    assert c.flush(10)
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads do not exist here
        code = 1
        try:
            for i in range(5):
                c.log("info", f"child-{i}")
            ok = c.flush(10) and c.stats()["spilled"] == 5 and c.stats()["queued"] == 5
            code = 0 if ok else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    msgs = sorted(r["log"]["message"] for r in spilled(tmp_path))
    assert msgs == ["child-0", "child-1", "child-2", "child-3", "child-4", "parent"]
    assert c.stats()["spilled"] == 1  # the parent's counters are its own


def test_a_handler_on_a_logger_that_drops_its_records_says_so_once(tmp_path, caplog):
    url = f"http://127.0.0.1:{dead_port()}"
    quiet = logging.getLogger(f"quiet-{tmp_path.name}")
    quiet.setLevel(logging.WARNING)  # what the root logger is until told otherwise
    meant = logging.getLogger(f"meant-{tmp_path.name}")
    meant.setLevel(logging.WARNING)
    h = IngestHandler(url, "k", spill_dir=tmp_path)
    ok = IngestHandler(url, "k", spill_dir=tmp_path, level=logging.WARNING)  # warnings are meant
    quiet.addHandler(h)
    meant.addHandler(ok)
    try:
        with caplog.at_level(logging.WARNING, logger="bucketq.sdk"):
            h._level_check.join(10)
            ok._level_check.join(10)
    finally:
        quiet.removeHandler(h)
        meant.removeHandler(ok)
        h.close()
        ok.close()
    said = [r.getMessage() for r in caplog.records if "IngestHandler is attached" in r.getMessage()]
    assert len(said) == 1
    assert repr(quiet.name) in said[0] and "whose level is WARNING" in said[0]
