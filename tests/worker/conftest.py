"""The worker tests' handlers write their events to a file of the test's own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# ``bucketq worker handlers:handle`` imports the handlers' module by name, as a user's.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def events(tmp_path, monkeypatch) -> Path:
    """The file the handlers append their events to (``$WORKER_OUT``)."""
    out = tmp_path / "events.txt"
    monkeypatch.setenv("WORKER_OUT", str(out))
    return out
