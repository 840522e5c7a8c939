"""The data source's checks and steps without a Spark job: options are checked as the
stream checks them, and its reads and writes go through the stream's own steps."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

from bucketq.bucket import convert
from bucketq.bucket.codec import encode_item
from bucketq.errors import ConfigurationError, PayloadTooLarge
from bucketq.spark import _ops as ops
from bucketq.stream import StreamQueue
from waiting import eventually

pytestmark = pytest.mark.spark


def options(mongo_uri, db_name, **extra):
    return ops.Options({"uri": mongo_uri, "database": db_name, "queue": "s", **extra})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("bucketMaxBytes", str(32 * 1024 * 1024), "from 1024 to 16711680 bytes (MongoDB's 16 MiB"),
        ("bucketMaxBytes", "100", "from 1024 to 16711680 bytes"),
        ("bucketMaxSize", "100000", "from 1 to 65536 items"),
        ("bucketMaxSize", "ten", "a whole number from 1 to 65536 items; got 'ten'"),
        ("holeGrace", "nan", "a finite number greater than 0"),
        ("stageTimeout", "inf", "a finite number greater than 0"),
        ("numPartitions", "0", "a whole number at least 1"),
        ("startingAfter", "-1", "a whole number at least 0"),
    ],
)
def test_a_bad_option_is_refused_naming_it_and_what_it_accepts(
    mongo_uri, db_name, key, value, says
):
    with pytest.raises(ConfigurationError) as err:
        options(mongo_uri, db_name, **{key: value})
    msg = str(err.value)
    assert msg.startswith(f"Option {key} must be"), msg
    assert says in msg and "_" not in msg.split(";")[0], msg


def test_options_are_the_streams_options(mongo_uri, db_name):
    o = options(mongo_uri, db_name, bucketMaxBytes="16711680", holeGrace="2.5")
    assert o.stream_opts().bucket_max_bytes == 16711680
    assert math.isclose(o.stream_opts().hole_grace, 2.5)


def test_a_row_too_large_for_a_bucket_names_the_spark_option(db, mongo_uri, db_name):
    o = options(mongo_uri, db_name, mode="stream", bucketMaxBytes="2048")
    with pytest.raises(PayloadTooLarge, match=r"bucketMaxBytes=2048\). .*raise bucketMaxBytes"):
        ops.stage(o, "stream", "job", iter([encode_item("x" * 4000)]))


def test_staged_writes_are_packed_and_numbered_by_the_stream(db, mongo_uri, db_name):
    """Rows are grouped as pushes are, and a number closed as a hole meanwhile is
    given up for the next one (before, the task failed on the duplicate)."""
    StreamQueue(db, "s").push("first", durable=True)  # seq 1
    db.s.insert_one({"_id": 2, "hole": True, "at": None})  # a consumer closed 2
    o = options(mongo_uri, db_name, mode="stream", bucketMaxSize="4")
    m = ops.stage(o, "stream", "job", (encode_item(i) for i in range(10)))
    assert (m["buckets"], m["items"]) == (3, 10)
    staged = list(db.s.find({"stg.t": m["token"]}).sort("_id", 1))
    assert [d["_id"] for d in staged] == [3, 4, 5]  # the bucket that met seq 2 went last
    assert sorted(d["n"] for d in staged) == [2, 4, 4]


def test_the_driver_counts_only_the_holes_it_closed(db, mongo_uri, db_name):
    q = StreamQueue(db, "s", bucket_max_size=10, bucket_max_wait=0.05)
    q.push_many(list(range(10)), durable=True)  # seq 1
    q._allocate(1)  # seq 2: handed out, never written
    q.push_many(list(range(10, 20)), durable=True)  # seq 3
    src = ops.StreamSource(options(mongo_uri, db_name, holeGrace="0.3"))
    assert src.initial() == 0
    assert src.latest(0, None) == 1
    eventually(lambda: src.latest(0, None) == 3, what="the hole at 2 closed")
    assert src.holes_closed == 1
    stale = db.s.find_one({"_id": 3})
    assert src.consumer.close_hole("missing", 3, stale) is False  # there: not closed
    assert src.latest(3, None) == 3 and src.holes_closed == 1
    src.commit(3)
    assert q.position()["acked"] == 3


def test_a_newer_consumer_fences_the_query(db, mongo_uri, db_name):
    q = StreamQueue(db, "s", bucket_max_size=10, bucket_max_wait=0.05)
    q.push_many(list(range(10)), durable=True)
    src = ops.StreamSource(options(mongo_uri, db_name))
    assert src.latest(src.initial(), None) == 1
    q.consumer()
    from bucketq.errors import Fenced

    with pytest.raises(Fenced):
        src.commit(1)
    assert q.position()["acked"] == 0


def test_an_offset_of_another_incarnation_of_the_stream_fails_naming_both(
    db, mongo_uri, db_name, caplog
):
    """A checkpoint's offset names a seq of one incarnation of the stream; the same
    stream made again (dropped, or on a fresh store) numbers from 1 again. The source
    refuses the old offset instead of reading on from its seq; an offset made before
    offsets had an incarnation is taken, with a warning."""
    q = StreamQueue(db, "s", bucket_max_size=10, bucket_max_wait=0.05)
    q.push_many(list(range(20)), durable=True)
    src = ops.StreamSource(options(mongo_uri, db_name))
    first = src.offset(src.latest(src.initial(), None))
    assert first["seq"] == 2 and first["incarnation"] == src.consumer.incarnation
    src.commit(src.check(first))
    src.close()
    q.close()
    # The queue made again: its buckets 1 and 2 are other records than the checkpoint's.
    db.drop_collection("s")
    db.drop_collection("s.meta")
    q = StreamQueue(db, "s", bucket_max_size=10, bucket_max_wait=0.05)
    q.push_many(list(range(30)), durable=True)
    src = ops.StreamSource(options(mongo_uri, db_name))
    now = src.consumer.incarnation
    assert now != first["incarnation"]
    for use in (src.check, lambda o: src.commit(src.check(o))):
        with pytest.raises(ConfigurationError) as e:
            use(first)
        said = str(e.value)
        assert first["incarnation"] in said and now in said and "new checkpoint location" in said
    assert q.position()["acked"] == 0  # nothing acknowledged on the old offset's word
    # An offset without an incarnation: this stream's, said once.
    with caplog.at_level("WARNING", logger="bucketq.spark"):
        assert src.check({"seq": 2}) == 2 and src.check({"seq": 3}) == 3
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "without a stream incarnation" in caplog.records[0].getMessage()
    src.close()
    q.close()


def test_a_stream_made_before_incarnations_gets_one_when_a_consumer_opens(db):
    q = StreamQueue(db, "old", bucket_max_size=10, bucket_max_wait=0.05)
    q.push_many(list(range(5)), durable=True)
    db["old.meta"].update_one({"_id": "stream"}, {"$unset": {"incarnation": ""}})
    c = q.consumer()
    given = db["old.meta"].find_one({"_id": "stream"})["incarnation"]
    assert c.incarnation == given
    c.close()
    assert q.consumer().incarnation == given  # kept from then on
    q.close()


def test_buckets_decode_into_arrow_columns_as_json_text(db, mongo_uri, db_name):
    """Stream and queue buckets into one record batch: payloads as compact JSON (UTF-8
    as it is), headers only where an item has some, consumed items left out."""
    import datetime as dt

    from bson import ObjectId

    at = dt.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    oid = ObjectId()
    pay = [{"a": 1, "é": "ü", "t": at}, [1.5, None, True], "x", oid, b"\x00\x01"]
    cols = ops.Columns("json")
    cols.add_stream({"_id": 7, "items": b"".join(encode_item(p) for p in pay), "at": at})
    cols.add_stream({"_id": 8, "hole": True, "at": at})  # a tombstone: no rows
    items = [encode_item("plain"), encode_item({"k": 2}, {"trace": "t1"}), encode_item("gone")]
    cols.add_queue({"_id": oid, "items": b"".join(items), "done": bytes([0b100]),
                    "tries": {"1": 2}, "mature": at})  # fmt: skip
    rows = cols.record_batch().to_pylist()
    assert len(cols) == 0 and len(rows) == 7
    assert [r["payload"] for r in rows] == [
        '{"a":1,"é":"ü","t":"2025-01-02T03:04:05.678000+00:00"}',
        "[1.5,null,true]",
        '"x"',
        f'"{oid}"',
        '"AAE="',
        '"plain"',
        '{"k":2}',
    ]
    assert [(r["seq"], r["bucket"], r["index"]) for r in rows] == [
        *[(7, "7", i) for i in range(5)],
        (None, str(oid), 0),
        (None, str(oid), 1),
    ]
    assert [r["headers"] for r in rows] == [None] * 6 + ['{"trace":"t1"}']
    assert [r["tries"] for r in rows] == [0] * 6 + [2]
    assert {r["mature"] for r in rows} == {at}


def test_binary_payloads_stay_bytes_and_others_become_json(db, mongo_uri, db_name):
    cols = ops.Columns("binary")
    cols.add_stream({"_id": 1, "items": encode_item(b"\xff\x00raw") + encode_item({"v": 1})})
    rows = cols.record_batch().to_pylist()
    assert [r["payload"] for r in rows] == [b"\xff\x00raw", b'{"v":1}']


def test_json_text_is_the_same_with_either_encoder():
    import datetime as dt

    from bson import Decimal128, Int64, ObjectId

    values = [
        {"a": [1, 2.5, "é", None], "d": dt.datetime(2025, 1, 1, tzinfo=dt.UTC)},
        {"i": Int64(2**40), "o": ObjectId("0123456789ab0123456789ab"), "n": Decimal128("1.10")},
        {"b": b"\x01\x02", "nested": {"x": {"y": []}}},
    ]
    for v in values:
        assert ops.json_bytes(v) == convert._std_json(v).encode()


def test_a_write_into_a_partitioned_queue_goes_to_its_tasks_partitions(db, mongo_uri, db_name):
    o = options(mongo_uri, db_name, mode="queue", partitions="4", bucketMaxSize="10")
    for task in range(6):
        m = ops.stage(o, "queue", "job", (encode_item(i) for i in range(25)), task)
        staged = list(db.s.find({"stg.t": m["token"]}))
        assert len(staged) == 3
        assert {d.get("part", 0) for d in staged} == {task % 4}, task
    with pytest.raises(ConfigurationError, match="partitions=4 is for bucket queues"):
        options(mongo_uri, db_name, mode="stream", partitions="4")


def test_local_sessions_bind_to_loopback_and_workers_import_the_compiled_pyspark(monkeypatch):
    """A local master binds to 127.0.0.1 (SPARK_LOCAL_IP too, read by the JVM it starts),
    and its Python workers run through a script that takes Spark's pyspark.zip off
    PYTHONPATH: they import the installed pyspark, not the zip's sources."""
    import pyspark

    from bucketq.spark import prepare_session

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    conf = prepare_session("local[2]")
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    home = Path(pyspark.__file__).parent
    zip_path = home / "python" / "lib" / "pyspark.zip"
    if not zip_path.exists():
        pytest.skip("this pyspark has no python/lib/pyspark.zip")
    exe = os.environ["PYSPARK_PYTHON"]
    got = subprocess.run(
        [exe, "-c", "import pyspark, sys; print(pyspark.__file__); print(sys.path[1])"],
        env={**os.environ, "PYTHONPATH": f"{zip_path}{os.pathsep}/elsewhere"},
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert got == [str(home / "__init__.py"), "/elsewhere"]


def test_a_cluster_master_keeps_sparks_choices_unless_told(monkeypatch):
    from bucketq.spark import prepare_session

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert prepare_session("spark://spark-master.example:7077") == {}
    assert "PYSPARK_PYTHON" not in os.environ
    told = prepare_session("spark://spark-master.example:7077", bind_address="10.0.0.5")
    assert told["spark.driver.host"] == "10.0.0.5"
