"""The kombu transport in one process, through kombu's own API (what Celery calls): the
broker URL, transport options, acknowledgement as commit and rejection as rollback,
no-ack consumers, sizes and purge, what bucketq refuses, and the alias that makes
``bucketq://`` work without an import."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import fields
from datetime import UTC, datetime, timedelta

import pytest
from kombu import Connection, Exchange
from kombu import Queue as KombuQueue

import bucketq.celery
from bucketq import ConfigurationError, NotSupported, Queue
from bucketq.celery import BrokerOptions
from bucketq.celery._core import (
    DEFAULT_REJECT_TIMEOUT_GRACE,
    broker_options,
    eta_of,
    mongodb_uri,
    sanitized,
)
from celery_broker.conftest import FAST, ROOT, with_database
from waiting import eventually

# -- the URL, the options, the ETA (pure) ---------------------------------------------------


@pytest.mark.parametrize(
    "given,uri,database",
    [
        ("bucketq://h:27018/jobs", "mongodb://h:27018/jobs", "jobs"),
        ("bucketq://h", "mongodb://h", "celery"),
        ("bucketq://", "mongodb://localhost", "celery"),
        ("mongodb://u:p@a,b/app?replicaSet=rs", "mongodb://u:p@a,b/app?replicaSet=rs", "app"),
        ("mongodb+srv://c.example.net/app", "mongodb+srv://c.example.net/app", "app"),
    ],
)
def test_a_broker_url_is_a_mongodb_uri(given, uri, database):
    assert mongodb_uri(given) == (uri, database)


def test_a_bare_host_takes_kombus_user_password_and_port():
    got = mongodb_uri("db.local", userid="me", password="p@ss", port=27019)
    assert got == ("mongodb://me:p%40ss@db.local:27019/", "celery")


def test_another_scheme_is_refused_naming_the_forms():
    with pytest.raises(ConfigurationError, match=r"bucketq\+mongodb\+srv://"):
        mongodb_uri("redis://localhost:6379/0")


def test_a_password_is_not_shown():
    assert sanitized("bucketq://me:secret@h/db") == "bucketq://me:**@h/db"
    assert sanitized("mongodb://h/db") == "mongodb://h/db"


def test_transport_options_are_queue_options_checked_at_once(caplog):
    opts = broker_options({"lease": 5.0, "publish_durable": False, "max_retries": 3})
    assert opts.queue["lease"] == 5.0 and opts.publish_durable is False
    with pytest.raises(ConfigurationError, match="lease"):
        broker_options({"lease": -1})
    with pytest.raises(ConfigurationError, match="publish_durable"):
        broker_options({"publish_durable": "yes"})
    # Redis's visibility_timeout keeps its meaning: lease + reject_timeout_grace.
    assert broker_options({"visibility_timeout": 600, "lease": 20})\
        .queue["reject_timeout_grace"] == 580  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="bucketq.celery"):
        broker_options({"fanout_prefix": True, "global_keyprefix": "x"})
    assert "fanout_prefix, global_keyprefix are not bucketq's and are ignored" in caplog.text


def test_the_eta_header_is_the_mature_time():
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert eta_of({"headers": {"eta": when.isoformat()}}) == when
    assert eta_of({"headers": {"eta": "2030-01-02T03:04:05"}}) == when  # naive: UTC
    assert eta_of({"headers": {}}) is None
    with pytest.raises(ConfigurationError, match="ISO 8601"):
        eta_of({"headers": {"eta": "tomorrow"}})


# -- a connection to the test's MongoDB ------------------------------------------------------


@pytest.fixture
def url(mongo_uri, db):
    return "bucketq+" + with_database(mongo_uri, db.name)


@pytest.fixture
def conn(url):
    with Connection(url, transport_options=FAST) as c:
        yield c


def _stored(db, name="jobs"):
    """Items stored in queue ``name`` (every bucket's live count)."""
    return sum(d["live"] for d in db[name].find({}, {"live": 1}))


def test_ack_commits_and_reject_rolls_back(conn, db):
    q = conn.SimpleQueue("jobs")
    for i in range(3):
        q.put({"i": i})
    seen = [q.get(timeout=10) for _ in range(3)]
    assert sorted(m.payload["i"] for m in seen) == [0, 1, 2]
    assert not any(m.delivery_info["redelivered"] for m in seen)
    by_i = {m.payload["i"]: m for m in seen}
    by_i[0].ack()
    by_i[1].reject(requeue=True)  # back at once, marked redelivered
    by_i[2].reject(requeue=False)  # dropped, as AMQP drops it without a dead-letter exchange
    again = q.get(timeout=10)
    assert again.payload == {"i": 1} and again.delivery_info["redelivered"] is True
    again.ack()
    q.close()
    eventually(lambda: db["jobs"].count_documents({}) == 0, what="every bucket deleted")


def test_max_tries_moves_a_task_rejected_that_often_to_the_dead_letter_queue(url, db):
    with Connection(url, transport_options={**FAST, "max_tries": 2}) as c:
        q = c.SimpleQueue("jobs")
        q.put("poison")
        for _ in range(2):
            q.get(timeout=10).reject(requeue=True)
        eventually(lambda: _stored(db, "jobs.dlq") == 1, what="the task in jobs.dlq")
        eventually(lambda: _stored(db) == 0, what="the task gone from jobs")
        q.close()


def test_a_channel_closed_with_unacknowledged_messages_gives_them_back(url, db):
    with Connection(url, transport_options={**FAST, "lease": 120.0}) as c1:
        q1 = c1.SimpleQueue("jobs")
        q1.put("a")
        assert q1.get(timeout=10).payload == "a"  # never acknowledged
        q1.close()
    # Back at once (the lease is two minutes): another connection gets it again.
    with Connection(url, transport_options=FAST) as c2:
        q2 = c2.SimpleQueue("jobs")
        m = q2.get(timeout=10)
        assert m.payload == "a" and m.delivery_info["redelivered"] is True
        m.ack()
        q2.close()


def test_a_no_ack_consumer_commits_on_delivery(conn, db):
    q = conn.SimpleQueue("jobs", no_ack=True)
    q.put("x")
    assert q.get(timeout=10).payload == "x"
    q.close()
    eventually(lambda: db["jobs"].count_documents({}) == 0, what="the bucket deleted")


def test_size_and_purge(conn, db):
    ch = conn.default_channel
    KombuQueue("jobs", Exchange("jobs"), "jobs")(ch).declare()
    producer = conn.Producer(ch)
    for i in range(5):
        producer.publish({"i": i}, exchange="jobs", routing_key="jobs")
    producer.publish({"i": "later"}, exchange="jobs", routing_key="jobs", headers={
        "eta": (datetime.now(UTC) + timedelta(hours=1)).isoformat()})  # fmt: skip
    assert ch.queue_declare("jobs", passive=True).message_count == 5  # ready now
    assert ch.queue_purge("jobs") == 6  # delayed ones too
    assert ch.queue_declare("jobs", passive=True).message_count == 0
    assert _stored(db) == 0


def test_purge_leaves_what_a_consumer_holds(conn, db):
    q = conn.SimpleQueue("jobs")
    q.put("held")
    held = q.get(timeout=10)
    assert conn.default_channel.queue_purge("jobs") == 0
    held.ack()
    q.close()


# -- what bucketq refuses ---------------------------------------------------------------------


@pytest.mark.parametrize("kind,words", [("fanout", "no fan-out"), ("topic", "no topic")])
def test_fanout_and_topic_exchanges_are_refused(conn, kind, words):
    with pytest.raises(NotSupported, match=words):
        conn.default_channel.exchange_declare("x", kind)


def test_priorities_are_refused(conn):
    with pytest.raises(NotSupported, match="no message priorities"):
        conn.Producer().publish("x", routing_key="jobs", priority=5)
    with pytest.raises(NotSupported, match="x-max-priority"):
        conn.default_channel.queue_declare("jobs", arguments={"x-max-priority": 10})


def test_a_message_no_queue_takes_is_refused_not_dropped(conn, db):
    ch = conn.default_channel
    ch.exchange_declare("orders", "direct")
    with pytest.raises(NotSupported, match="would be dropped"):
        conn.Producer(ch).publish("x", exchange="orders", routing_key="nowhere")


def test_celerys_purge_works_and_its_remote_control_and_priorities_say_what_to_do(url):
    celery = pytest.importorskip("celery")
    app = celery.Celery("refusals", broker=url)
    app.conf.broker_transport_options = FAST

    @app.task(name="noop", shared=False)
    def noop():
        return None

    for _ in range(3):
        noop.delay()
    assert app.control.purge() == 3
    with pytest.raises(NotSupported, match="remote control"):
        app.control.ping(timeout=0.1)
    with pytest.raises(NotSupported, match="no message priorities"):
        noop.apply_async(priority=3)
    app.close()


# -- the alias --------------------------------------------------------------------------------


ALIAS_CHECK = """
import site, sys
if len(sys.argv) > 1:
    site.addsitedir(sys.argv[1])
import kombu.transport
print("imported" if "bucketq" in sys.modules else "not imported")
from kombu import Connection
print(type(Connection("bucketq://localhost/x").transport).__module__)
"""


def test_the_pth_line_registers_the_alias_without_importing_bucketq(site_dir):
    r = subprocess.run([sys.executable, "-c", ALIAS_CHECK, str(site_dir)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["not", "imported", "bucketq.celery._transport"]


#: The check in an interpreter that reads no ``.pth`` file (``-S``): site-packages on its
#: path as plain directories, so the hook that ``pip install bucketq`` puts there is not run.
NO_HOOK = "import sys, sysconfig; sys.path.append(sysconfig.get_paths()['purelib']); " + (
    "exec(sys.argv.pop(1))"
)


def test_without_it_kombu_does_not_know_the_scheme(site_dir):
    r = subprocess.run([sys.executable, "-S", "-c", NO_HOOK, ALIAS_CHECK], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert "No such transport: bucketq" in r.stderr
    # and importing the package registers it
    assert bucketq.celery.TARGET == "bucketq.celery:Transport"
    import kombu.transport

    assert kombu.transport.TRANSPORT_ALIASES["bucketq"] == bucketq.celery.TARGET


def test_a_connection_reaches_the_queue_the_tasks_use(conn, mongo_client, db):
    conn.SimpleQueue("jobs").put({"hello": 1})
    q = Queue(mongo_client[db.name], "jobs")
    msg = q.reserve(timeout=10)
    assert msg is not None and msg.payload["body"]
    q.commit(msg)
    q.close()


def test_the_docs_table_of_options_matches_the_code():
    text = (ROOT / "docs" / "celery.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", text, re.M))
    names = {f.name for f in fields(BrokerOptions) if f.name != "queue"}
    assert names <= set(rows)
    for name in names:
        assert rows[name] == repr(getattr(BrokerOptions(), name)), name
    assert rows["reject_timeout_grace"] == f"{DEFAULT_REJECT_TIMEOUT_GRACE:.0f}"
    # publishes are written as every queue's: on disk (the journal) unless the app chose
    assert "write_concern" not in rows and "write_concern" not in broker_options({}).queue
