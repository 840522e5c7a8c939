"""The embedded store's supervisor, its pure parts: how a death is named, the state
``/ready`` and 503 answers quote, and the state file ``bucketq serve --workers`` reads.
The supervisor at work (kills, a full or unwritable disk, giving up) is in
tests/faults/test_store_faults.py."""

from __future__ import annotations

import signal

from bucketq.supervisor import StateFile, StoreState, exit_cause


def test_a_death_is_named_by_its_signal_or_exit_code():
    assert exit_cause(-signal.SIGKILL) == "died by SIGKILL"
    assert exit_cause(-signal.SIGTERM) == "died by SIGTERM"
    assert exit_cause(1) == "exited with code 1"
    assert exit_cause(0) == "exited with code 0"
    assert exit_cause(-200) == "died by signal 200"


def test_the_state_names_itself():
    assert StoreState("up", pid=42).describe() == "up (pid 42)"
    assert StoreState("up", pid=42).up
    restarting = StoreState("restarting", 2, 10, "died by SIGKILL")
    assert not restarting.up
    assert restarting.describe() == "restarting (attempt 2 of 10, died by SIGKILL)"
    failed = StoreState("failed", 10, 10, "restart failed: no space")
    assert failed.describe() == "failed: gave up after 10 restarts (restart failed: no space)"


def test_the_state_file_is_read_again_only_after_its_interval(tmp_path):
    path = tmp_path / "state.json"
    now = [0.0]
    reader = StateFile(path, every=1.0, clock=lambda: now[0])
    assert reader.current() is None  # nothing written yet
    StoreState("restarting", 1, 10, "died by SIGKILL").write(path)
    assert reader.current() is None  # within its interval: not read again
    now[0] = 1.0
    assert reader.current() == StoreState("restarting", 1, 10, "died by SIGKILL")
    StoreState("up", pid=7).write(path)
    now[0] = 1.5
    assert not reader.current().up  # type: ignore[union-attr]
    now[0] = 2.0
    assert reader.current() == StoreState("up", pid=7)
    path.write_text("{not json")  # a torn file: the last state stands
    now[0] = 3.0
    assert reader.current() == StoreState("up", pid=7)


def test_a_quiet_servers_log_is_tried_again_without_a_line(tmp_path, caplog):
    """A server restarted while its disk was broken may say nothing more: the supervisor's
    check tries the file again, so its gap is noted and the operator hears it healed."""
    from bucketq.embedded._log import _ServerLog

    caplog.set_level("WARNING", logger="bucketq.embedded")
    path = tmp_path / "gone" / "secantusd.log"  # its directory missing: opening fails
    sink = _ServerLog(path)
    sink.RETRY_S = 0.0
    sink.write(b"started\n")
    sink.write(b"listening\n")
    assert sink.dropped == 2 and "cannot be written" in caplog.text
    sink.retry()  # still broken: nothing dropped (there was no line), nothing said again
    assert sink.dropped == 2 and caplog.text.count("cannot be written") == 1
    path.parent.mkdir()
    sink.retry()
    assert "is written again; 2 lines were dropped" in caplog.text
    assert "2 lines of the server's output are missing here" in path.read_text()
    sink.close()
