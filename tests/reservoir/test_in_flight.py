"""``stats()["in_flight_by_shard"]``: the records each shard's flush consumer is writing
now (the console's ingest page shows it), back to 0 once they are settled."""

from __future__ import annotations

import pytest

from bucketq.reservoir import BufferedReservoir
from fast_settings import FAST_BUFFER
from waiting import eventually_async

from .conftest import FakeStorage
from .helpers import logs

pytestmark = pytest.mark.timeout(60)


async def test_stats_show_the_records_each_shard_is_writing(backends):
    storage = FakeStorage(gated=True)  # every write waits until the gate opens
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER.with_(shards=1))
    await buf.start()
    try:
        await buf.ingest(logs(5))

        async def writing() -> bool:
            return buf.stats()["in_flight_by_shard"].get(0) == 5

        await eventually_async(writing, 30, what="shard 0 writing 5 records")
        storage.gate.set()

        async def settled() -> bool:
            return buf.stats()["in_flight_by_shard"].get(0) == 0 and len(storage.messages()) == 5

        await eventually_async(settled, 30, what="the 5 records stored and nothing in flight")
    finally:
        storage.gate.set()
        await buf.stop()
