"""What a 503 means for what is stored: a real ``bucketq serve`` (buffer off)
whose storage is frozen (SIGSTOP) while a request's records are handed to it.

- a 503 given before the hand-over (the record gate, the deadline) stored nothing;
- a request whose records were handed over waits for their outcome past its deadline
  (the grace): storage back within it, the answer is a 200 and the records are stored;
- storage silent past the grace: a 503 that says its records may be stored.

So what is stored is what was answered 200, plus at most the records of 503s that say
they may be stored. A client waits up to 30 s: a hang fails by its timeout."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from processes import frozen
from pymongo import MongoClient

from bucketq.embedded import EmbeddedServer
from bucketq.server import _keys
from waiting import eventually

from .helpers import Serve, log_batch
from .test_admission import metric

# At debug level: a request waiting for its outcome past its deadline says so there.
ENV = {"BUCKETQ_INGEST_TIMEOUT_MS": "3000", "BUCKETQ_MAX_RECORDS_IN_FLIGHT": "10",
       "BUCKETQ_RETRY_AFTER_S": "1", "BUCKETQ_LOG_LEVEL": "debug"}  # fmt: skip
NOTHING = "Nothing of this request was stored"
MAYBE = "Some records of this request may be stored"


def test_a_503_says_what_was_stored_and_a_handed_over_request_waits_for_its_outcome(
    storage: EmbeddedServer, tmp_path: Path
) -> None:
    serve = Serve(storage.uri, "handed", tmp_path / "serve.log", **ENV).start()
    assert storage.pid is not None
    with serve.stops_cleanly():
        with MongoClient(storage.uri) as client:
            key = _keys.create_key(client["handed"], "handed")
        with serve.client(key) as c, ThreadPoolExecutor(2) as pool:

            def post(prefix: str, n: int) -> httpx.Response:
                return c.post("/api/v1/ingest", json=log_batch(n, prefix=prefix))

            assert post("before", 1).status_code == 200
            answers: dict[str, httpx.Response] = {}
            with frozen(storage.pid):
                a = pool.submit(post, "a", 5)
                # a's records are handed over and it is past its deadline: in its grace
                eventually(lambda: "waiting" in serve.output() and "5 log records" in
                           serve.output(), what="the request to wait past its deadline")  # fmt: skip
                # 5 + 6 records would pass BUCKETQ_MAX_RECORDS_IN_FLIGHT: refused at once
                answers["b"] = post("b", 6)
            answers["a"] = a.result()
            with frozen(storage.pid):
                # silent past the deadline and the grace
                answers["c"] = post("c", 4)
            text = c.get("/metrics").text

            def stored() -> Counter[str]:
                r = c.get("/api/v1/logs", params={"limit": 100})
                assert r.status_code == 200, r.text
                return Counter(x["message"].split("-")[0] for x in r.json()["logs"])

            # what was stored settles once storage answers again (c's write may land)
            eventually(lambda: stored()["a"] == 5, what="a's records")
            got = stored()

    a, b, cc = answers["a"], answers["b"], answers["c"]
    assert a.status_code == 200 and a.json()["received"] == 5, a.text
    assert b.status_code == 503 and NOTHING in b.json()["message"], b.text
    assert "BUCKETQ_MAX_RECORDS_IN_FLIGHT" in b.json()["message"], b.text
    assert cc.status_code == 503 and MAYBE in cc.json()["message"], cc.text
    assert all(int(r.headers["Retry-After"]) > 0 for r in (b, cc))
    # stored: the 200s' records, none of the "nothing stored" 503's, at most c's
    assert got["before"] == 1 and got["a"] == 5 and got["b"] == 0 and got["c"] in (0, 4), got
    assert metric(text, "bucketq_ingest_unsettled_total", reason="timeout") == 1, text
    assert metric(text, "bucketq_admission_refused_total", reason="records") == 1, text
    assert "Traceback" not in serve.output()
