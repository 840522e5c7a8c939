"""The example pipeline end to end: logs from a stream queue into Parquet by project
and day, and per-minute counts per service and level."""

from __future__ import annotations

import json
import re

import pytest

from bucketq import cli
from bucketq.spark import pipeline

pytestmark = pytest.mark.spark


def test_pipeline_streams_logs_into_partitioned_parquet_with_counts(
    spark, mongo_uri, mongo_client, db_name, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = [
        "--uri",
        mongo_uri,
        "--database",
        db_name,
        "--generate",
        "3000",
        "--out",
        str(out),
        "--trigger",
        "0 seconds",
    ]
    try:
        assert cli.main(["pipeline", *argv]) == 0  # `bucketq pipeline ...`
        logs = spark.read.parquet(str(out / "logs"))
        assert logs.count() == 3000
        assert {p.name for p in (out / "logs").iterdir() if p.name.startswith("project=")} == {
            "project=acme",
            "project=globex",
            "project=initech",
        }
        assert {r.day.isoformat() for r in logs.select("day").distinct().collect()} == {
            "2025-01-01",
            "2025-01-02",
        }
        # each record's metadata as its JSON text (nothing of it dropped)
        meta = {
            int(re.match(r"request (\d+) ", r.message)[1]): json.loads(r.metadata)
            for r in logs.select("message", "metadata").collect()
        }
        assert sorted(meta) == list(range(3000))
        assert all(m["request"] == i and m["region"] in ("eu", "us") for i, m in meta.items())
        counts = spark.read.parquet(str(out / "counts"))
        assert counts.groupBy().sum("count").first()[0] == 3000
        expected = {(r.minute, r.service, r.level): r["count"] for r in counts.collect()}
        recount = (
            logs.selectExpr("date_trunc('minute', ts) AS minute", "service", "level")
            .groupBy("minute", "service", "level")
            .count()
        )
        assert {(r.minute, r.service, r.level): r["count"] for r in recount.collect()} == expected
        # run again (as `python -m bucketq.spark.pipeline`) with nothing new: nothing added
        assert pipeline.main(argv[:4] + argv[6:]) == 0
        assert spark.read.parquet(str(out / "logs")).count() == 3000
        # Run twice without --uri, `bucketq pipeline` meets a fresh embedded store with the
        # checkpoint of the last one. Here the store is made anew by dropping the database:
        # the run stops and says what to do, instead of skipping the new store's first
        # records; done as it says, every one of them arrives.
        mongo_client.drop_database(db_name)
        capsys.readouterr()
        assert cli.main(["pipeline", *argv[:5], "500", *argv[6:], "--seed", "2"]) == 1
        said = capsys.readouterr().err
        assert len(set(re.findall(r"incarnation ([0-9a-f]{24})", said))) == 2, said
        assert "give another --out" in said and "--uri" in said
        assert spark.read.parquet(str(out / "logs")).count() == 3000
        other = tmp_path / "other"
        assert cli.main(["pipeline", *argv[:4], "--out", str(other), "--trigger", "0 seconds"]) == 0
        assert spark.read.parquet(str(other / "logs")).count() == 500
    finally:
        mongo_client.drop_database(db_name)
