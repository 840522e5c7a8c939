"""`bucketq bench` end to end at a tiny N: every contender (bucketq sync and async, item
by item and through the _many calls, the per-element queues, mongo-taskqueue, kombu) at 1 and 2
producer/consumer processes against the test server; what a user checks of the output.
No timing thresholds."""

from __future__ import annotations

import asyncio
import io
import json
import statistics

import pytest
from pymongo import MongoClient
from rich.console import Console

from bucketq.benchmark import (
    CONTENDERS,
    RunResult,
    WorkerReport,
    build_plan,
    element_sizes,
    payload,
    run,
    spread,
    summarize,
)
from bucketq.benchmark._contenders import QUEUE_NAME
from bucketq.benchmark._report import partition_targets
from bucketq.benchmark._stats import checksum, next_check, rel_range, share
from bucketq.cli import main
from bucketq.errors import ConfigurationError

N, ELEMENT_N, PROCS = 2_000, 50, (1, 2)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: Per contender: commands that must be sent exactly once per item (per-element), or at
#: least once per run (bucketq packs ~1,000 items into one bucket document).
PER_ITEM = {
    "per-element ElementQueue": ("insert", "delete"),
    "per-element ElementQueue (w:1)": ("insert", "delete"),
    "per-element AsyncElementQueue": ("insert", "delete"),
    "mongo-taskqueue TaskQueue": ("insert", "update"),
    "kombu MongoDB transport": ("insert", "find"),
}


@pytest.fixture(scope="module")
def bench(mongo_uri, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    console = Console(file=io.StringIO(), width=220)
    doc = run(
        mongo_uri,
        sizes=[N],
        procs=PROCS,
        element_n=ELEMENT_N,
        json_path=str(out / "bench.json"),
        plots_dir=str(out / "plots"),
        console=console,
    )
    data = json.loads((out / "bench.json").read_text())
    return doc, data, console.file.getvalue(), out


def test_every_contender_ran_at_every_process_count_and_got_all_items_back(bench):
    _, data, _, _ = bench
    seen = {(r["contender"], r["producers"], r["consumers"]) for r in data["runs"]}
    assert seen == {(c, p, p) for c in CONTENDERS for p in PROCS}
    for r in data["runs"]:
        n = ELEMENT_N if CONTENDERS[r["contender"]].per_element else N
        assert r["n"] == n, r["contender"]
        assert (r["items_pushed"], r["items_consumed"], r["items_remaining"], r["items_ok"]) == (
            n,
            n,
            0,
            True,
        ), r["contender"]
        # each worker pushed its share and the consumers together committed exactly N
        assert sum(w["pushed"][0] for w in r["workers"]) == n
        assert sum(w["consumed"][0] for w in r["workers"]) == n
        assert len(r["workers"]) == r["producers"]


def test_json_has_every_figure_and_the_environment(bench):
    doc, data, _, _ = bench
    assert data == json.loads(json.dumps(doc, default=str))
    for r in data["runs"]:
        for key in ("push_per_s", "consume_per_s", "end_to_end_per_s", "cpu_us_per_item",
                    "push_cpu_us_per_item", "consume_cpu_us_per_item", "cpu_vs_floor",
                    "commands_per_1000_items"):  # fmt: skip
            assert isinstance(r[key], float) and r[key] > 0, (r["contender"], key)
        assert r["push_s"] > 0 and r["consume_s"] > 0
        assert r["end_to_end_vs_fastest_per_element"] > 0
        assert r["floor_us_measured_in_this_run"] > 0 and all(
            w["floor_us"] > 0 for w in r["workers"]
        )
    assert data["floor_us_per_item"] > 0
    assert data["payload"]["bytes_json"] > 50 and data["payload"]["bytes_bson"] > 50
    env = data["environment"]
    assert env["server"]["description"] and env["server"]["version"]
    assert env["write_concern"]
    for dist in ("bucketq", "pymongo", "kombu", "mongo-taskqueue"):
        assert env["versions"][dist], dist
    assert set(data["scaling"]) == set(CONTENDERS)
    for name, s in data["scaling"].items():
        assert len(s["runs"]) == len(PROCS), name
        assert s["cpu_us_per_item"]["spread"] is not None
        assert s["commands_per_1000_items"]["spread"] is not None
    assert data["notes"] and data["settings"]["procs"] == list(PROCS)


def test_commands_are_counted_by_name(bench):
    _, data, _, _ = bench
    assert {r["per_element"] for r in data["runs"]} == {True, False}, "both kinds ran"
    for r in data["runs"]:
        cmds, n, name = r["commands"], r["n"], r["contender"]
        if r["per_element"]:
            assert cmds.get("findAndModify", 0) >= n, name
        else:  # a claim: findAndModify, or find_then_update's update (the embedded server)
            assert cmds.get("findAndModify", 0) + cmds.get("update", 0) >= 1, name
        if r["per_element"]:
            for command in PER_ITEM[name]:
                assert cmds.get(command) == n, (name, command, cmds)
            assert r["commands_per_1000_items"] >= 3000
        else:
            # a bucket insert, a claim and a delete per ~1,000 items, not per item
            assert cmds.get("insert", 0) >= 1 and cmds.get("delete", 0) >= 1, cmds
            assert r["commands_per_1000_items"] < 100, cmds
        by_name = r["commands_per_1000_items_by_name"]
        assert by_name.get("findAndModify", 0) + by_name.get("update", 0) > 0, by_name


def test_plots_are_pngs_and_the_table_names_every_contender(bench):
    _, data, text, out = bench
    assert len(data["plots"]) == 2
    for path in data["plots"]:
        with open(path, "rb") as f:
            head = f.read(8)
            f.seek(0, 2)
            assert head == PNG_MAGIC and f.tell() > 10_000, path
    for title in (
        "Lifecycle throughput",
        "MongoDB commands per 1,000 items",
        "Scaling: cost per item",
    ):
        assert title in text
    for name in CONTENDERS:
        assert name.split()[-1] in text


def _bench_small(mongo_uri, path, *contenders: str, console=None, **kw):
    """``bucketq bench`` of 1,000 items (per-element: 20) in one process, for ``contenders``."""
    return run(
        mongo_uri,
        n=1_000,
        procs=[1],
        element_n=20,
        contenders=list(contenders),
        json_path=str(path),
        plots_dir=None,
        console=console or Console(file=io.StringIO(), width=220),
        **kw,
    )


def test_a_failed_run_does_not_lose_the_others(mongo_uri, tmp_path, monkeypatch):
    from bucketq.benchmark import _runner

    real = _runner.run_spec

    def flaky(uri, spec, *a, **kw):
        if spec.contender == "kombu MongoDB transport":
            raise RuntimeError("kombu made no progress (simulated)")
        return real(uri, spec, *a, **kw)

    monkeypatch.setattr(_runner, "run_spec", flaky)
    path = tmp_path / "bench.json"
    with pytest.raises(RuntimeError, match=r"1 run\(s\) failed.*kombu.*simulated"):
        _bench_small(mongo_uri, path, "bucketq Queue", "kombu MongoDB transport")
    data = json.loads(path.read_text())
    assert [(r["contender"], r["items_ok"]) for r in data["runs"]] == [("bucketq Queue", True)]
    assert [f["contender"] for f in data["settings"]["failed_runs"]] == ["kombu MongoDB transport"]


def test_cli_rejects_an_unknown_contender(capsys):
    assert main(["bench", "--contender", "nope", "--no-plots"]) == 2
    assert "unknown contender" in capsys.readouterr().err


def test_cli_passes_repeat_and_rejects_less_than_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--repeat", "0", "--no-plots"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--repeat" in err and "at least 1" in err and len(err.strip().splitlines()) == 1


def test_a_missing_peer_says_which_extra_to_install(monkeypatch):
    import importlib.util
    import sys

    real = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "kombu", raising=False)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m == "kombu" else real(m, *a)
    )
    with pytest.raises(ConfigurationError, match=r"kombu.*bucketq\[bench\]"):
        run("mongodb://127.0.0.1:1/", contenders=["kombu MongoDB transport"], plots_dir=None)


def test_an_embedded_server_is_fresh_for_every_group_and_after_a_million_items():
    from bucketq.benchmark._runner import FRESH_SERVER_AFTER, _Servers

    given = _Servers("mongodb://example:27017/")
    given.items = 10 * FRESH_SERVER_AFTER
    assert not given.due(new_group=True)  # a server we did not start is never touched
    s = _Servers("mongodb://example:27017/")
    s.embedded = object()
    assert not s.due(new_group=True)  # nothing went through it yet
    s.items = 10
    assert s.due(new_group=True) and not s.due(new_group=False)
    s.items = FRESH_SERVER_AFTER
    assert s.due(new_group=False)


def test_shares_checksums_and_spread():
    assert [share(10, 3, i) for i in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert sum(e - s for s, e in (share(1_000_001, 4, i) for i in range(4))) == 1_000_001
    assert checksum([1, 2, 3]) == (3, 6, 14)
    assert checksum([2, 2, 2]) != checksum([1, 2, 3])  # same count and sum, caught by the squares
    assert spread([10.0, 11.0, 12.0]) == pytest.approx(0.2)
    assert spread([5.0]) is None
    # the last items are looked for one at a time, a long run rarely
    assert next_check(0, 999, 1_000, 1) == 1
    assert next_check(0, 0, 1_000_000, 2) == 1024
    # per-element contenders: the cap at the largest N, halved below, never above bucketq's N
    assert element_sizes([10_000, 1_000_000, 100_000], 1_000) == {
        1_000_000: 1_000,
        100_000: 500,
        10_000: 250,
    }
    assert element_sizes([200], 500) == {200: 200}


def test_the_table_shows_bucketq_per_item_then_many_calls_then_per_element_and_peers(bench):
    _, data, text, _ = bench
    table = text[: text.index("MongoDB commands per 1,000 items")]
    one_process = [
        line
        for line in table.splitlines()
        if f" {N:,} │ 1 │" in line or f" {ELEMENT_N} │ 1 │" in line
    ]
    names = [line.split("│")[1].strip() for line in one_process]
    assert names == [
        "bucketq Queue",
        "bucketq AsyncQueue",
        "bucketq Queue (_many calls)",
        "bucketq AsyncQueue (_many calls)",
        "bucketq Queue (w:1)",
        "per-element ElementQueue",
        "per-element AsyncElementQueue",
        "per-element ElementQueue (w:1)",
        "mongo-taskqueue TaskQueue",
        "kombu MongoDB transport",
    ]
    many_notes = [n for n in data["notes"] if "(_many calls)" in n]
    assert len(many_notes) == 1  # one note for both _many-calls contenders
    for verb in ("push_many", "reserve_many", "commit_many"):
        assert verb in many_notes[0]


def test_durable_and_w1_rows_stand_side_by_side_with_the_journal_s_cost(bench):
    _, data, text, _ = bench
    # What each contender's write commands carried: the durable ones j: true (the peers
    # through journal=true in their URI), the (w:1) rows w: 1 alone.
    for r in data["runs"]:
        sent = set(r["write_concerns_sent"])
        if r["write_concern"] == "w:1":
            assert r["contender"].endswith("(w:1)") and sent == {'{"w": 1}'}, r["contender"]
        else:
            assert sent and all('"j": true' in wc for wc in sent), (r["contender"], sent)
    costs = data["write_concern_cost"]
    assert {(c["queue"], c["procs"]) for c in costs} == {
        (q, p) for q in ("bucketq Queue", "per-element ElementQueue") for p in PROCS
    }
    for c in costs:
        for key in ("push_per_s", "end_to_end_per_s", "cpu_us_per_item"):
            fig = c[key]
            assert fig["durable"] > 0 and fig["w1"] > 0, (c["queue"], key)
            assert fig["durable_vs_w1"] == pytest.approx(fig["durable"] / fig["w1"])
    assert "What the journal costs" in text
    from bucketq.benchmark.results import render

    page = render([data])
    assert "What the journal costs" in page and "per-element ElementQueue" in page
    # a durable row is compared with durable per-element rows, a w:1 row with w:1 ones
    for r in data["runs"]:
        others = r["end_to_end_vs_per_element"]
        assert r["end_to_end_vs_fastest_per_element"] > 0, r["contender"]
        assert others, r["contender"]


def test_cli_passes_the_write_concern_choice(monkeypatch):
    import bucketq.benchmark as bench_pkg

    seen = {}
    monkeypatch.delenv("BUCKETQ_MONGODB_URI", raising=False)
    monkeypatch.setattr(bench_pkg, "run", lambda *a, **kw: seen.update(kw))
    assert main(["bench", "--write-concern", "durable", "--no-plots"]) == 0
    assert seen["write_concern"] == "durable"
    with pytest.raises(SystemExit):
        main(["bench", "--write-concern", "w0"])


def test_durable_only_leaves_the_w1_rows_out():
    from bucketq.benchmark._runner import default_contenders

    twins = {c for c, x in CONTENDERS.items() if x.twin_of}
    assert twins == {"bucketq Queue (w:1)", "per-element ElementQueue (w:1)"}
    assert set(default_contenders(False, "compare")) == set(CONTENDERS)
    assert set(default_contenders(False, "durable")) == set(CONTENDERS) - twins
    assert "bucketq Queue (w:1)" in default_contenders(True, "compare")  # takes partitions
    with pytest.raises(ConfigurationError, match="write_concern"):
        run("mongodb://unused", write_concern="w0")


# -- the queue is empty at the end ---------------------------------------------------------


def _push_commit(handle, pushes: int, commits: int) -> None:
    for i in range(pushes):
        handle.push(payload(i))
    handle.flush()
    for _ in range(commits):
        msg = handle.reserve(5.0)
        assert msg is not None
        handle.commit(msg)
    handle.flush()
    handle.close()


async def _push_commit_async(contender, uri: str, db_name: str, pushes: int, commits: int) -> None:
    handle = await contender.open_async(uri, db_name)
    for i in range(pushes):
        await handle.push(payload(i))
    await handle.flush()
    for _ in range(commits):
        msg = await handle.reserve(5.0)
        assert msg is not None
        await handle.commit(msg)
    await handle.flush()
    await handle.close()


@pytest.mark.parametrize("name", [c for c in CONTENDERS if "(_many calls)" not in c])
def test_remaining_counts_what_the_queue_still_holds(mongo_uri, name):
    contender = CONTENDERS[name]
    db_name = f"bq_remaining_{abs(hash(name)) % 10**8}"
    try:
        contender.prepare(mongo_uri, db_name)
        assert contender.remaining(mongo_uri, db_name) == 0
        for pushes, commits, left in ((3, 1, 2), (0, 2, 0)):
            if contender.is_async:
                asyncio.run(_push_commit_async(contender, mongo_uri, db_name, pushes, commits))
            else:
                _push_commit(contender.open(mongo_uri, db_name), pushes, commits)
            assert contender.remaining(mongo_uri, db_name) == left, (pushes, commits)
    finally:
        with MongoClient(mongo_uri) as c:
            c.drop_database(db_name)


def _prepare_with(monkeypatch, name: str, extra: int, delay: float | None):
    """The run's queue starts with ``extra`` items of its own: really stored, pushed
    before the workers start, unknown to their counters and checksums."""
    from bucketq import Queue

    contender = CONTENDERS[name]
    real = contender.prepare

    def prepare(uri, db_name):
        real(uri, db_name)
        with MongoClient(uri) as client, Queue(client[db_name], QUEUE_NAME) as q:
            q.push_many([payload(10**6 + i) for i in range(extra)], delay=delay)
            q.flush()

    monkeypatch.setattr(contender, "prepare", prepare)


def test_an_item_left_in_the_queue_fails_the_run_though_the_checksums_agree(
    mongo_uri, tmp_path, monkeypatch
):
    # An item not due for an hour: the consumers never see it, commit exactly the items
    # that were pushed, and stop at N; only the parent's look at the queue finds it.
    _prepare_with(monkeypatch, "bucketq Queue", extra=1, delay=3600)
    path = tmp_path / "bench.json"
    with pytest.raises(RuntimeError, match=r"exactly once \(1 items left in the queue\)"):
        _bench_small(mongo_uri, path, "bucketq Queue")
    (r,) = json.loads(path.read_text())["runs"]
    assert r["items_consumed"] == r["items_pushed"] == 1_000
    assert sum(w["consumed"][1] for w in r["workers"]) == sum(w["pushed"][1] for w in r["workers"])
    assert (r["items_remaining"], r["items_ok"]) == (1, False)


def test_consumers_that_stop_early_leave_items_and_fail_the_run(mongo_uri, tmp_path, monkeypatch):
    # Five items already waiting: the consumer takes them first (older bucket) and stops
    # when N items are committed, five of its own short.
    _prepare_with(monkeypatch, "bucketq Queue", extra=5, delay=None)
    path = tmp_path / "bench.json"
    with pytest.raises(RuntimeError, match=r"5 items left in the queue"):
        _bench_small(mongo_uri, path, "bucketq Queue")
    (r,) = json.loads(path.read_text())["runs"]
    assert r["items_consumed"] == 1_000 and r["items_remaining"] == 5 and not r["items_ok"]


# -- --repeat -------------------------------------------------------------------------------


def test_repeat_runs_each_group_k_times_interleaved_and_reports_medians(mongo_uri, tmp_path):
    path = tmp_path / "bench.json"
    console = Console(file=io.StringIO(), width=220)
    _bench_small(
        mongo_uri,
        path,
        "bucketq Queue (_many calls)",
        "per-element ElementQueue",
        console=console,
        repeat=2,
    )
    data = json.loads(path.read_text())
    assert data["settings"]["repeat"] == 2
    # contenders interleaved within each repetition, per-element first
    assert [(r["contender"], r["repeat"]) for r in data["runs"]] == [
        (name, k)
        for k in range(2)
        for name in ("per-element ElementQueue", "bucketq Queue (_many calls)")
    ]
    assert all(r["items_ok"] for r in data["runs"])
    medians = {m["contender"]: m for m in data["medians"]}
    assert set(medians) == {"per-element ElementQueue", "bucketq Queue (_many calls)"}
    for name, m in medians.items():
        runs = [r for r in data["runs"] if r["contender"] == name]
        assert m["repeats"] == 2 and m["items_ok"]
        for key in ("push_per_s", "end_to_end_per_s", "cpu_us_per_item", "commands_per_1000_items"):
            values = [r[key] for r in runs]
            assert m["repetitions"][key]["values"] == values
            assert m[key] == pytest.approx(statistics.median(values))
            assert m["repetitions"][key]["range"] == pytest.approx(rel_range(values))
        ratios = [r["end_to_end_vs_fastest_per_element"] for r in runs]
        assert m["end_to_end_vs_fastest_per_element"] == pytest.approx(statistics.median(ratios))
    text = console.file.getvalue()
    assert "medians of 2 repetitions" in text and "range e2e / CPU" in text
    assert any("ran 2 times" in n for n in data["notes"])


def test_without_repeat_the_table_has_no_range_column(bench):
    _, data, text, _ = bench
    assert data["settings"]["repeat"] == 1 and "range e2e" not in text
    assert all(m["repeats"] == 1 for m in data["medians"])


def test_the_plan_repeats_each_group_in_a_row():
    names = ["bucketq Queue", "per-element ElementQueue"]
    plan = build_plan(names, [1_000, 10_000], [1], 50, repeat=2)
    assert [(s.n, s.contender, s.repeat) for s in plan] == [
        (25, "per-element ElementQueue", 0),
        (1_000, "bucketq Queue", 0),
        (25, "per-element ElementQueue", 1),
        (1_000, "bucketq Queue", 1),
        (50, "per-element ElementQueue", 0),
        (10_000, "bucketq Queue", 0),
        (50, "per-element ElementQueue", 1),
        (10_000, "bucketq Queue", 1),
    ]
    with pytest.raises(ConfigurationError, match="repeat"):
        build_plan(names, [1_000], [1], 50, repeat=0)


def test_a_contender_and_its_w1_twin_trade_places_every_other_repetition():
    names = ["bucketq Queue", "bucketq Queue (w:1)", "bucketq AsyncQueue"]
    plan = build_plan(names, [1_000], [1], 50, repeat=3)
    assert [(s.contender, s.repeat) for s in plan] == [
        ("bucketq Queue", 0), ("bucketq Queue (w:1)", 0), ("bucketq AsyncQueue", 0),
        ("bucketq Queue (w:1)", 1), ("bucketq Queue", 1), ("bucketq AsyncQueue", 1),
        ("bucketq Queue", 2), ("bucketq Queue (w:1)", 2), ("bucketq AsyncQueue", 2),
    ]  # fmt: skip


def _result(repeat: int, e2e_s: float, cpu_s: float, remaining: int = 0) -> RunResult:
    w = WorkerReport(0.0, e2e_s / 2, cpu_s / 2, e2e_s / 2, e2e_s, cpu_s / 2, 0.0, 2.0,
                     checksum(range(100)), checksum(range(100)))  # fmt: skip
    return RunResult("bucketq Queue", False, 100, 1, [w], 100, remaining, repeat)


def test_medians_and_ranges_of_repetitions():
    runs = [_result(0, 1.0, 0.001), _result(1, 2.0, 0.003), _result(2, 4.0, 0.002)]
    (m,) = summarize(runs)
    assert m.repeats == 3
    assert m.e2e_rate == pytest.approx(50.0)  # 100, 50, 25 items/s
    assert m.cpu_us_per_item == pytest.approx(20.0)  # 10, 30, 20 µs
    assert m.range("cpu_us_per_item") == pytest.approx((30 - 10) / 20)
    assert rel_range([5.0]) is None
    assert m.items_ok
    (bad,) = summarize([*runs, _result(3, 1.0, 0.001, remaining=2)])
    assert not bad.items_ok and bad.items_problem == (
        "1 of 4 repetitions: 2 items left in the queue"
    )


def test_partitioned_runs_are_set_beside_their_targets():
    def result(procs: int, e2e_s: float) -> RunResult:
        r = _result(0, e2e_s, 0.001)
        r.procs = procs
        return r

    summaries = summarize([result(1, 1.0), result(4, 0.8)])  # 100 and 125 items/s
    (t,) = partition_targets(summaries, 4)
    assert t["procs"] == 4 and t["end_to_end_vs_1_1"] == pytest.approx(1.25)
    assert t["end_to_end_met"] and t["end_to_end_target"] == 1.0
    assert t["commands_target"] == 2.5 and t["commands_met"]
    (slow,) = partition_targets(summarize([result(1, 1.0), result(4, 1.25)]), 4)
    assert slow["end_to_end_vs_1_1"] == pytest.approx(0.8) and not slow["end_to_end_met"]
    assert partition_targets(summaries, 1) == []  # not partitioned: no targets
    assert partition_targets(summarize([result(4, 0.8)]), 4) == []  # no 1+1 to compare


def test_partitions_opens_partitioned_queues_and_runs_only_the_queues(mongo_uri, tmp_path):
    path = tmp_path / "bench.json"
    run(
        mongo_uri,
        n=2_000,
        procs=[2],
        json_path=str(path),
        plots_dir=None,
        console=Console(file=io.StringIO(), width=220),
        partitions=3,
    )
    data = json.loads(path.read_text())
    assert data["settings"]["partitions"] == 3
    # only bucketq's Queue/AsyncQueue take partitions: the others are left out
    assert {r["contender"] for r in data["runs"]} == {
        name for name, c in CONTENDERS.items() if c.takes_options
    }
    assert all(r["items_ok"] for r in data["runs"])


def test_partitions_with_a_contender_that_has_none_is_refused(capsys):
    code = main(["bench", "--partitions", "2", "--contender", "per-element ElementQueue",
                 "--no-plots"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "--partitions 2 applies to bucketq's Queue and AsyncQueue only" in err


def test_the_results_page_shows_every_median_of_the_json(bench):
    from bucketq.benchmark.results import render

    _, data, _, _ = bench
    page = render([data])
    assert "\n## Queue lifecycle\n" in page
    section = page.split("\n## Queue lifecycle\n", 1)[1].split("What the journal costs")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith(("| bucketq ", "| per-element ",
                                                              "| mongo-taskqueue ", "| kombu "))]  # fmt: skip
    assert len(rows) == len(data["medians"])
    for m, row in zip(data["medians"], rows, strict=True):
        assert row.startswith(f"| {m['contender']} | {m['n']:,} | {m['producers']} |")
        assert f"| {m['end_to_end_per_s']:,.0f} |" in row
