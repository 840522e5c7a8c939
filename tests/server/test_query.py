"""``GET /api/v1/logs``: filters, newest first, paging by cursor, the key's project only."""

from __future__ import annotations

import uuid

from .helpers import Serve


def test_logs_query_filters_and_pages(serve: Serve, keys) -> None:
    project = f"q-{uuid.uuid4().hex[:8]}"
    logs = []
    for i in range(30):
        logs.append({
            "time": f"2024-05-01T10:{i // 3:02d}:00Z",  # three records share each time
            "service": "api" if i % 2 else "worker",
            "level": ("info", "warn", "error")[i % 3],
            "message": f"request {i} {'Timeout' if i % 5 == 0 else 'ok'}",
        })  # fmt: skip
    with serve.client(keys(project)) as c, serve.client(keys(project + "-other")) as other:
        assert c.post("/api/v1/ingest", json={"logs": logs}).status_code == 200
        assert other.post("/api/v1/ingest", json={"logs": logs[:5]}).status_code == 200

        seen: list[dict] = []
        cursor = None
        pages = 0
        while True:
            params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
            r = c.get("/api/v1/logs", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            seen.extend(body["logs"])
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert pages == 5
        assert sorted(x["message"] for x in seen) == sorted(x["message"] for x in logs)
        assert len({x["id"] for x in seen}) == 30
        times = [x["time"] for x in seen]
        assert times == sorted(times, reverse=True)  # newest first, across pages

        def messages(**params) -> set[str]:
            r = c.get("/api/v1/logs", params={"limit": 1000, **params})
            assert r.status_code == 200, r.text
            return {x["message"] for x in r.json()["logs"]}

        assert messages(service="api") == {x["message"] for x in logs if x["service"] == "api"}
        assert messages(level="error") == {x["message"] for x in logs if x["level"] == "error"}
        assert messages(q="timeout") == {x["message"] for x in logs if "Timeout" in x["message"]}
        window = messages(**{"from": "2024-05-01T10:02:00Z", "to": "2024-05-01T10:04:00Z"})
        assert window == {f"request {i} {'Timeout' if i % 5 == 0 else 'ok'}" for i in range(6, 12)}
        assert messages(q="request 1 ", service="api", level="warn") == {"request 1 ok"}
        assert messages(q=".*") == set()  # q is text, not a pattern

        assert c.get("/api/v1/logs", params={"cursor": "garbage"}).status_code == 400
        assert c.get("/api/v1/logs", params={"limit": 0}).status_code == 422
        assert c.get("/api/v1/logs", params={"level": "loud"}).status_code == 422
        assert c.get("/api/v1/logs", params={"from": "soon"}).status_code == 422
        assert c.get("/api/v1/logs", params={"to": "0001-01-01T00:00:00+05:00"}).status_code == 422
        assert messages(**{"from": "2024-05-01T12:05:00+02:00"}) == messages(
            **{"from": "2024-05-01T10:05:00Z"}
        )
        assert len(other.get("/api/v1/logs").json()["logs"]) == 5


def test_level_and_service_take_several_values_as_logtide_does(serve: Serve, keys) -> None:
    project = f"q-{uuid.uuid4().hex[:8]}"
    logs = [{"time": f"2024-05-01T10:00:{i:02d}Z", "service": f"s{i % 3}",
             "level": ("info", "warn", "error", "critical")[i % 4], "message": f"m{i}"}
            for i in range(24)]  # fmt: skip
    with serve.client(keys(project)) as c:
        assert c.post("/api/v1/ingest", json={"logs": logs}).status_code == 200

        def got(query: str, **params) -> tuple[set[str], int]:
            more = "".join(f"&{k}={v}" for k, v in params.items())
            r = c.get(f"/api/v1/logs?{query}{more}")
            assert r.status_code == 200, r.text
            return {x["message"] for x in r.json()["logs"]}, r.json()["total"]

        def want(keep) -> tuple[set[str], int]:
            kept = {x["message"] for x in logs if keep(x)}
            return kept, len(kept)

        bad = {"error", "critical"}
        assert got("level=error&level=critical") == want(lambda x: x["level"] in bad)
        assert got("service=s0&service=s2") == want(lambda x: x["service"] in {"s0", "s2"})
        assert got("service=s1&service=s2&level=warn&level=error") == want(
            lambda x: x["service"] in {"s1", "s2"} and x["level"] in {"warn", "error"})  # fmt: skip
        assert got("level=info") == want(lambda x: x["level"] == "info")
        # Offset paging over a list filter sees each record once.
        seen: list[str] = []
        for offset in range(0, 12, 5):
            page, total = got("level=error&level=critical", limit=5, offset=offset)
            assert total == 12
            seen += page
        assert sorted(seen) == sorted(want(lambda x: x["level"] in bad)[0])
