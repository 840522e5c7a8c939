"""Every SDK test ends with no processor left running (spilling what a test left)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bucketq.sdk import close_all


@pytest.fixture(autouse=True)
def _close_processors() -> Iterator[None]:
    yield
    close_all(timeout=0)
