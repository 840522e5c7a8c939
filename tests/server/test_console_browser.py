"""The console in a real browser: Playwright driving Debian's Chromium against one
``bucketq serve`` (buffer on, passthrough transport: a 200 means stored). Each test is
what an operator does: find a record just ingested, watch the live tail, requeue a dead
letter; and the refusals: a project's key, an action without its CSRF token.

Each test screenshots its pages at 1,280 and 390 pixels wide (the layout must render at
both). They go to a temporary directory; with ``BUCKETQ_CONSOLE_SCREENSHOTS=docs`` to
docs/console/, which docs/console.md shows (a plain run never changes the work tree). Chromium is ``/usr/bin/chromium`` (``apt-get install chromium``;
never ``playwright install``): without it these tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from bucketq.admin import Inspector
from bucketq.queue import Queue
from waiting import eventually

from .helpers import ROOT, Serve, bucketq_cli, cli_key, create_key

pytestmark = pytest.mark.xdist_group("console")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
DOCS_SHOTS = ROOT / "docs" / "console"
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
#: The live tail must show a new record within this long (the console polls every 0.5 s).
TAIL_MS = 2000
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: .ci/run installs chromium; the browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def console(mongo_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One ``bucketq serve`` for these tests, its database, an operator key and a project key."""
    database = f"bqc_{uuid.uuid4().hex[:10]}"
    s = Serve(mongo_uri, database, Path(tmp_path_factory.mktemp("console")) / "serve.log",
              RESERVOIR_BUFFER_ENABLED="true", RESERVOIR_BUFFER_TRANSPORT="passthrough",
              RESERVOIR_BUFFER_SHARDS="2", BUCKETQ_WATCH_QUEUES="*").start()  # fmt: skip
    client: MongoClient = MongoClient(mongo_uri, tz_aware=True)
    try:
        operator = cli_key(s.env, "--operator")
        project = create_key(s, "shop")
        yield {"serve": s, "db": client[database], "operator": operator, "project": project}
    finally:
        s.terminate()
        client.drop_database(database)
        client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install -e '.[test]'")
    if not shutil.which(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _signed_in(browser: Any, console: dict[str, Any], viewport: dict[str, int] = WIDE) -> Any:
    ctx = browser.new_context(viewport=viewport)
    page = ctx.new_page()
    page.goto(console["serve"].url + "/console/logs")
    page.fill("#key", console["operator"])
    page.click("button[type=submit]")
    page.wait_for_url("**/console/logs**")
    return page


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: docs/console/ when asked, else a temporary directory."""
    if os.environ.get("BUCKETQ_CONSOLE_SCREENSHOTS") == "docs":
        return DOCS_SHOTS
    return Path(tmp_path_factory.mktemp("console-shots"))


def _shot(page: Any, where: Path, name: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for label, vp in (("wide", WIDE), ("narrow", NARROW)):
        page.set_viewport_size(vp)
        page.screenshot(path=str(where / f"{name}-{label}.png"), full_page=True)
        assert (where / f"{name}-{label}.png").stat().st_size > 0
    page.set_viewport_size(WIDE)


def _ingest(console: dict[str, Any], message: str, level: str = "error", service: str = "checkout",
            **extra: Any) -> None:  # fmt: skip
    from datetime import UTC, datetime

    rec = {"time": datetime.now(UTC).isoformat(), "service": service, "level": level,
           "message": message, **extra}  # fmt: skip
    with console["serve"].client(console["project"]) as c:
        r = c.post("/api/v1/ingest", json={"logs": [rec]})
    assert r.status_code == 200, r.text


def test_a_record_just_ingested_is_found_by_search(browser, console, shots):
    from playwright.sync_api import expect

    for i, (level, service) in enumerate(
        [
            ("info", "api"),
            ("warn", "checkout"),
            ("info", "worker"),
            ("debug", "api"),
            ("error", "checkout"),
            ("info", "api"),
        ]
    ):
        _ingest(console, f"order-{i}: payment step {level}", level, service, metadata={"order": i})
    word = f"declined-{uuid.uuid4().hex[:8]}"
    _ingest(console, f"card {word} for cart 42", trace_id="ab" * 16, metadata={"cart": 42})
    page = _signed_in(browser, console)
    page.fill("input[name=q]", word)
    page.select_option("select[name=level]", "error")
    page.click("form#log-filters button[type=submit]")
    rows = page.locator("#logs tbody tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(word)
    page.goto(console["serve"].url + "/console/logs?project=shop")
    _shot(page, shots, "logs")
    page.goto(console["serve"].url + "/console/logs?project=shop&q=" + word)
    page.locator("#logs tbody tr[data-id] a").first.click()
    expect(page.locator("dl.detail")).to_contain_text("ab" * 16)
    expect(page.locator("pre.json")).to_contain_text('"cart": 42')
    _shot(page, shots, "log-detail")
    page.context.close()


def test_the_logs_page_charts_levels_and_a_trace_link_opens_the_trace(browser, console, shots):
    """The aggregation above the table (errors stand out), the project's retention, and a
    trace's records on one page from its link."""
    from datetime import UTC, datetime, timedelta

    from playwright.sync_api import expect

    s = console["serve"]
    project = f"tracing-{uuid.uuid4().hex[:6]}"  # after "shop": the other tests open shop first
    key = create_key(s, project)
    done = bucketq_cli(s.env, "keys", "retention", "--project", project, "--days", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    now = datetime.now(UTC)
    trace = f"req-{uuid.uuid4().hex[:8]}"
    recs = [{"time": (now - timedelta(minutes=40 * i)).isoformat(), "service": "api",
             "level": ("info", "info", "warn", "error")[i % 4], "message": f"step {i}"}
            for i in range(12)]  # fmt: skip
    recs += [{"time": (now - timedelta(seconds=3 - i)).isoformat(), "service": svc,
              "level": lv, "message": f"{trace} {svc}", "trace_id": trace, "span_id": f"s{i}"}
             for i, (svc, lv) in enumerate([("gateway", "info"), ("api", "info"), ("db", "critical")])]  # fmt: skip
    with s.client(key) as c:
        assert c.post("/api/v1/ingest", json={"logs": recs}).status_code == 200

    page = _signed_in(browser, console)
    page.goto(f"{s.url}/console/logs?project={project}")
    chart = page.locator("#log-chart")
    expect(chart).to_contain_text("15 records")
    expect(chart.locator("figcaption .errors")).to_have_text("4 errors")  # 3 error, 1 critical
    expect(chart.locator("li[data-level=info]")).to_contain_text("8")
    expect(chart.locator("li[data-level=critical]")).to_contain_text("1")
    expect(chart.locator("polyline[data-level=errors]")).to_have_attribute(
        "points", re.compile(r"\d")
    )
    expect(page.locator("#retention")).to_contain_text("30 days")
    _shot(page, shots, "logs-chart")

    # The filters apply to the chart: one service, one level.
    page.goto(f"{s.url}/console/logs?project={project}&service=api&level=info")
    expect(chart).to_contain_text("7 records")
    expect(chart.locator("polyline")).to_have_count(1)

    page.goto(f"{s.url}/console/logs?project={project}&q={trace}")
    page.locator("#logs td.trace a").first.click()
    page.wait_for_url("**/console/traces/**")
    rows = page.locator("#trace tbody tr[data-id]")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("gateway")  # oldest first
    expect(rows.nth(2)).to_contain_text("db")
    expect(page.locator("#trace-summary")).to_contain_text("3 records")
    _shot(page, shots, "trace")
    page.context.close()


def test_the_live_tail_shows_a_new_record_within_two_seconds(browser, console):
    from playwright.sync_api import expect

    page = _signed_in(browser, console)
    page.check("#tail-toggle")
    expect(page.locator("#tail-status")).to_contain_text("Live")
    word = f"tail-{uuid.uuid4().hex[:8]}"
    _ingest(console, f"new order {word}")
    expect(page.locator("#logs tbody tr", has_text=word)).to_be_visible(timeout=TAIL_MS)
    page.context.close()


def test_a_200000_character_message_is_cut_in_lists_and_whole_on_its_page(browser, console):
    """One huge message froze the browser on /console/logs (a table cell holding a
    200,000-character word): lists and the live tail show its start and its length, the
    record's page shows all of it."""
    from playwright.sync_api import expect

    word = f"huge-{uuid.uuid4().hex[:8]}"
    message = f"{word} " + "y" * 200_000
    _ingest(console, message)
    page = _signed_in(browser, console)
    page.goto(console["serve"].url + "/console/logs?project=shop&q=" + word)
    cell = page.locator("#logs tbody tr[data-id] td.msg")
    expect(cell).to_have_count(1)
    expect(cell.locator("a.more")).to_have_text(f"… {len(message):,} characters")
    assert word in cell.inner_text() and len(cell.inner_text()) < 600
    # The live tail: a second one arrives cut the same way.
    page.goto(console["serve"].url + "/console/logs?project=shop")
    page.check("#tail-toggle")
    expect(page.locator("#tail-status")).to_contain_text("Live")
    tail_word = f"tail-huge-{uuid.uuid4().hex[:8]}"
    tail_message = f"{tail_word} " + "z" * 200_000
    _ingest(console, tail_message)
    row = page.locator("#logs tbody tr", has_text=tail_word)
    expect(row).to_be_visible(timeout=TAIL_MS)
    assert len(row.locator("td.msg").inner_text()) < 600
    expect(row.locator("a.more")).to_contain_text(f"{len(tail_message):,} characters")
    # What the tail's poll carries: cut messages, no metadata, never cached.
    r = page.request.get(console["serve"].url + "/console/api/tail?project=shop&q=" + tail_word)
    assert r.status == 200
    assert (
        r.headers["cache-control"] == "no-store"
        and r.headers["x-content-type-options"] == "nosniff"
    )
    (rec,) = r.json()["logs"]
    assert len(rec["message"]) == 500 and rec["message_chars"] == len(tail_message)
    assert "metadata" not in rec
    # The record's page: the whole message.
    page.goto(console["serve"].url + "/console/logs?project=shop&q=" + word)
    cell.locator("a.more").click()
    expect(page.locator("dd.msg")).to_have_count(1)
    assert page.locator("dd.msg").inner_text() == message
    page.context.close()


#: Queue names a URL path cannot carry as they are.
AWKWARD = ("q with space?x#y 50%", "q/slash")


def test_queues_with_any_name_are_viewed_requeued_and_purged(browser, console):
    from playwright.sync_api import expect

    db = console["db"]
    for name in AWKWARD:
        make_dead(db, name, [{"n": 1}, {"n": 2}])
    page = _signed_in(browser, console)
    for name in AWKWARD:
        page.goto(console["serve"].url + "/console/queues")
        page.locator("#queues a", has_text=name).click()
        expect(page.locator("h1")).to_contain_text(name)
        expect(page.locator("#dead tbody tr")).to_have_count(2)
        page.locator("#dead tbody input[type=checkbox]").first.check()
        page.click('#dead-form button:text-is("Requeue")')
        page.click("#confirm")
        expect(page.locator("p.ok")).to_contain_text("requeued 1 dead letters")
        expect(page.locator("h1")).to_contain_text(name)
        page.click('#dead-form button:text-is("Delete")')
        page.click("#confirm")
        expect(page.locator("p.ok")).to_contain_text("deleted 1 dead letters")
        assert Inspector(db).dead(name) == [], name
        assert [x.payload for x in Inspector(db).peek(name)] == ['{"n": 1}'], name
    page.context.close()


def test_a_queue_name_cannot_forge_a_line_in_the_servers_log(browser, console):
    """An action on a queue whose name holds a line break is logged on one line, the
    break escaped."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    name = "nl\nFORGED bucketq.server: all is well"
    make_dead(console["db"], name, [{"n": 1}])
    page = _signed_in(browser, console)
    page.goto(console["serve"].url + "/console/queues/" + quote(name, safe=""))
    expect(page.locator("#dead tbody tr")).to_have_count(1)
    page.click('#dead-form button:text-is("Delete")')
    page.click("#confirm")
    expect(page.locator("p.ok")).to_contain_text("deleted 1 dead letters")
    log = console["serve"].output()
    assert "dead/purge on nl\\nFORGED bucketq.server: all is well" in log
    assert not [line for line in log.splitlines() if line.startswith("FORGED")]
    page.context.close()


def test_requeue_of_a_dead_letter_puts_it_back(browser, console, shots):
    from playwright.sync_api import expect

    db = console["db"]
    make_dead(db, "emails", [{"to": "a@example.com"}, {"to": "b@example.com"}])
    with Queue(db, "jobs") as jobs:
        jobs.push_many(range(5), durable=True)
    dead = Inspector(db).dead("emails")
    assert len(dead) == 2
    page = _signed_in(browser, console)
    page.goto(console["serve"].url + "/console/queues")
    expect(page.locator('#queues tr[data-name="emails"] td[data-k="dead"]')).to_have_text("2")
    # Items pushed now show in the chart and the change per second at the next samples
    # (the service samples every 2 s, the page refreshes every 2 s).
    with Queue(db, "jobs") as jobs:
        jobs.push_many(range(40), durable=True)
    expect(page.locator('#queues tr[data-name="jobs"] td[data-k="ready"]')).to_have_text(
        "45", timeout=15_000
    )
    expect(page.locator('#queues tr[data-name="jobs"] polyline')).to_have_attribute(
        "points", re.compile(r"\d"), timeout=15_000
    )
    _shot(page, shots, "queues")
    page.click('#queues a:text-is("emails")')
    expect(page.locator("#dead tbody tr")).to_have_count(2)
    _shot(page, shots, "queue")
    page.check(f'input[value="{dead[0].id}"]')
    page.click('#dead-form button:text-is("Requeue")')
    expect(page.locator("h1")).to_contain_text("Requeue dead letters?")  # asks first
    assert len(Inspector(db).dead("emails")) == 2
    page.click("#confirm")
    expect(page.locator("p.ok")).to_contain_text("requeued 1 dead letters")
    # In MongoDB: one dead letter left; the other back in emails with its own headers.
    assert [x.id for x in Inspector(db).dead("emails")] == [dead[1].id]
    back = Inspector(db).peek("emails")
    assert [(x.payload, x.headers, x.tries) for x in back] == [
        ('{"to": "a@example.com"}', {"tenant": "t1"}, 0)
    ]
    page.context.close()


def test_a_queue_made_after_the_page_was_drawn_appears(browser, console):
    # The refresh updated only the rows drawn: a queue made later (or drawn from a
    # sample older than the page, under load) never showed until a reload.
    from playwright.sync_api import expect

    page = _signed_in(browser, console)
    page.goto(console["serve"].url + "/console/queues")
    expect(page.locator("h1")).to_contain_text("Queues and streams")
    with Queue(console["db"], "late_arrival") as q:
        q.push_many(range(3), durable=True)
    expect(page.locator('#queues tr[data-name="late_arrival"] td[data-k="ready"]')).to_have_text(
        "3", timeout=15_000
    )
    page.context.close()


def test_the_ingest_page_shows_the_buffer(browser, console, shots):
    from playwright.sync_api import expect

    page = _signed_in(browser, console)
    page.goto(console["serve"].url + "/console/ingest")
    expect(page.locator("#shards tbody tr")).to_have_count(2)
    expect(page.locator("dl.detail")).to_contain_text("closed")
    _ingest(console, "one more for the rate")
    expect(page.locator("#rate-requests")).not_to_have_text("–", timeout=10_000)
    _ingest(console, "and another")
    # Two refreshes (2 s apart) make the first point pair of the rate charts.
    expect(page.locator("#spark-records")).to_have_attribute(
        "points", re.compile(r"\d"), timeout=10_000
    )
    _shot(page, shots, "ingest")
    page.context.close()


def test_a_project_key_gets_403(browser, console, shots):
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport=WIDE)
    page = ctx.new_page()
    page.goto(console["serve"].url + "/console/login")
    _shot(page, shots, "login")
    page.fill("#key", console["project"])
    with page.expect_response(lambda r: r.url.endswith("/console/login")) as resp:
        page.click("button[type=submit]")
    assert resp.value.status == 403
    expect(page.locator("p.error")).to_contain_text("operator key")
    # The key in a header is refused the same way, on a page and on the API.
    for path in ("/console/queues", "/console/api/queues"):
        r = page.request.get(console["serve"].url + path, headers={"X-API-Key": console["project"]})
        assert r.status == 403, path
    # And an operator key writes to no project: the ingest API refuses it.
    with console["serve"].client(console["operator"]) as c:
        assert c.post("/api/v1/ingest", json={"logs": []}).status_code == 403
    ctx.close()


def test_an_action_without_the_csrf_token_is_refused(browser, console):
    from playwright.sync_api import expect

    db = console["db"]
    make_dead(db, "refunds", [{"refund": 1}])
    page = _signed_in(browser, console)  # the cookie is sent: only the token is missing
    url = console["serve"].url + "/console/queues/refunds/dead/purge"
    for form in ({"confirmed": "yes"}, {"confirmed": "yes", "csrf": "0" * 64}):
        r = page.request.post(url, form=form)
        assert r.status == 403 and "CSRF" in r.text()
    # A form larger than the console reads is refused before it is parsed.
    r = page.request.post(url, form={"confirmed": "yes", "ids": "x" * 100_000})
    assert r.status == 413
    assert len(Inspector(db).dead("refunds")) == 1
    # The same POST from the page's own form (with its token) is done.
    page.goto(console["serve"].url + "/console/queues/refunds")
    page.click('#dead-form button:text-is("Delete")')
    page.click("#confirm")
    expect(page.locator("p.ok")).to_contain_text("deleted 1 dead letters")
    assert Inspector(db).dead("refunds") == []
    page.context.close()


def make_dead(db: Any, name: str, payloads: list[Any]) -> None:
    """Items of queue ``name`` moved to its dead-letter queue (max_tries=1, rolled back)."""
    q = Queue(db, name, max_tries=1, state_flush_period=0.1, bucket_max_wait=0.05)
    try:
        q.push_many(payloads, headers={"tenant": "t1"})
        q.flush()
        for _ in payloads:
            m = q.reserve(timeout=10)
            assert m is not None
            q.rollback(m)
        eventually(lambda: q.stats()["dead_lettered"] == len(payloads), 30, what="dead letters")
        q.flush()
    finally:
        q.close()


def test_metrics_export_the_watched_queues(console):
    """``BUCKETQ_WATCH_QUEUES=*``: /metrics has every queue's sizes, from the background samples."""
    db = console["db"]
    with Queue(db, "metered") as q:
        q.push_many(range(7), durable=True)

    def exported() -> str | None:
        with console["serve"].client() as c:
            text = c.get("/metrics").text
        line = 'bucketq_queue_items{kind="queue",queue="metered",state="ready"} 7.0'
        return text if line in text else None

    text = eventually(exported, 30, what="/metrics to export queue metered")
    assert "bucketq_queue_inspect_up 1.0" in text
    assert 'bucketq_queue_buckets{kind="queue",queue="metered"}' in text


def test_a_form_from_another_site_cannot_sign_the_browser_in(browser, console):
    """Login CSRF: a page of another site that posts a key to the console's login (which has
    no token yet) would sign the victim in as the attacker. The browser says where the form
    comes from; the console refuses it and sets no cookie."""
    ctx = browser.new_context()
    page = ctx.new_page()
    login = console["serve"].url + "/console/login"
    key = console["operator"]
    evil = (f'<form id=f method=post action="{login}"><input name=key value="{key}"></form>'
            "<script>document.getElementById('f').submit()</script>")  # fmt: skip
    page.route(
        "http://evil.test/**", lambda route: route.fulfill(body=evil, content_type="text/html")
    )
    with page.expect_response(login) as answer:
        page.goto("http://evil.test/")
    assert answer.value.status == 403
    assert "another site" in page.content()
    assert not [c for c in ctx.cookies() if c["name"] == "bq_console"]
    # The console's own login form, in the same browser, signs in.
    page.goto(console["serve"].url + "/console/login")
    page.fill("#key", console["operator"])
    page.click("button[type=submit]")
    page.wait_for_url("**/console/logs**")
    assert [c for c in ctx.cookies() if c["name"] == "bq_console"]
    ctx.close()
