"""``bucketq bench ingest``: the ingest service's request latency under an open-loop load,
with the reservoir buffer off and with each of its transports, one ``bucketq serve``
process per mode against one MongoDB server."""
