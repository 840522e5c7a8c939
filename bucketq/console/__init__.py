"""The web console of ``bucketq serve`` at ``/console``: logs (search, live tail, a
record's detail), queues and streams (counts, charts, dead letters and quarantined
buckets with requeue and purge), and the ingest buffer (shards, breaker, DLQ replay).

``router`` is a FastAPI ``APIRouter`` with its own lifespan (the queue watch and its
metrics); the app includes it. Pages are rendered on the server (Jinja2, in the
``server`` extra) with a little JavaScript, all served from this package. See
docs/console.md.
"""

from ._router import router

__all__ = ["router"]
