"""The command line answers bad arguments and unreachable servers with one clear line
on stderr and a non-zero exit status, never a traceback; configuration (the reservoir's
and the server's environment variables, Spark's options, keyword options) is one
mechanism: the same text means the same value everywhere, and an error names the
variable or option and what it accepts; a missing extra says which one to install."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketq import ConfigurationError, QueueOptions, reservoir, server
from bucketq._deps import require, require_all
from bucketq._validate import cli_count, count
from bucketq.bucket import options as queue_options
from bucketq.errors import MissingDependency
from bucketq.reservoir import BufferConfig, from_env
from bucketq.reservoir import _config as reservoir_config
from bucketq.sdk import _options as sdk_options
from bucketq.spark import _ops as spark_ops
from bucketq.stream import core as stream_core

ROOT = Path(__file__).resolve().parents[2]


def bucketq(
    *args: str, timeout: float = 120, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("BUCKETQ_MONGODB_URI", "REDIS_URL"):
        env.pop(k, None)
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-m", "bucketq", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def one_clear_line(out: subprocess.CompletedProcess, *needles: str) -> str:
    err = out.stderr.strip()
    assert out.returncode != 0, out
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["dlq", "list", "--transport", "redis", "--redis-url", "nonsense"], ["--redis-url", "redis://"]),
        (["dlq", "list", "--transport", "redis", "--redis-url", "redis://x", "--limit", "-5"], ["--limit", "at least 1"]),
        (["dlq", "requeue", "--transport", "bucketq", "--limit", "0"], ["--limit"]),
        (["dlq", "list", "--transport", "bucketq", "--mongodb-uri", "localhost"], ["--mongodb-uri", "mongodb://"]),
        (["bench", "--repeat", "0"], ["--repeat"]),
        (["bench", "--n", "-5"], ["--n"]),
        (["bench", "--procs", "1,x"], ["--procs"]),
        (["store", "--port", "70000"], ["--port", "65535"]),
        (["store", "--port", "abc"], ["--port"]),
        (["serve", "--port", "70000"], ["--port", "from 0 to 65535"]),
        (["serve", "--workers", "0"], ["--workers", "at least 1; got '0'"]),
        (["queues", "watch", "--interval", "nan"], ["--interval", "a finite number greater than 0"]),
        (["bench", "stream-wake", "--gap-min", "-1"], ["--gap-min", "at least 0 seconds"]),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_line_and_exit_status_2(args, needles):
    out = bucketq(*args)
    assert out.returncode == 2
    one_clear_line(out, *needles)


@pytest.mark.parametrize(
    "args",
    [["queues", "list"], ["quarantine", "list", "--queue", "q"], ["keys", "list"],
     ["dlq", "list", "--transport", "bucketq"], ["worker", "json:dumps", "--queue", "q"]],
    ids=["queues", "quarantine", "keys", "dlq", "worker"],
)  # fmt: skip
def test_every_command_without_a_mongodb_names_the_same_three_ways(args, tmp_path):
    # a data directory of its own: no running embedded store wrote a URI there
    out = bucketq(*args, environ={"XDG_DATA_HOME": str(tmp_path)})
    one_clear_line(out, "give --mongodb-uri, set BUCKETQ_MONGODB_URI, or start the embedded "
                   "store first (`bucketq store`, or `bucketq serve`)")  # fmt: skip


@pytest.mark.parametrize(
    "command", [["queues", "list"], ["keys", "list"], ["worker", "json:dumps", "--queue", "q"]]
)
def test_a_mongodb_uri_that_is_not_one_is_refused_before_anything_runs(command):
    out = bucketq(*command, "--mongodb-uri", "localhost:27017")
    assert out.returncode == 2
    one_clear_line(out, "--mongodb-uri", "mongodb://")
    out = bucketq(*command, environ={"BUCKETQ_MONGODB_URI": "localhost:27017"})
    one_clear_line(out, "BUCKETQ_MONGODB_URI", "Fix or unset the variable")


def test_dlq_list_on_a_dead_mongodb_is_one_line():
    out = bucketq("dlq", "list", "--transport", "bucketq", "--mongodb-uri",
                  f"mongodb://127.0.0.1:{_dead_port()}/?directConnection=true")  # fmt: skip
    one_clear_line(out, "bucketq dlq list: error", "could not be reached")


def test_dlq_list_on_a_dead_redis_is_one_line():
    out = bucketq("dlq", "list", "--transport", "redis", "--redis-url",
                  f"redis://127.0.0.1:{_dead_port()}/0")  # fmt: skip
    one_clear_line(out, "bucketq dlq list: error")


def test_bench_on_a_dead_mongodb_says_so_in_one_line():
    out = bucketq("bench", "--quick", "--no-plots", "--mongodb-uri",
                  f"mongodb://127.0.0.1:{_dead_port()}")  # fmt: skip
    one_clear_line(out, "cannot reach MongoDB")


def test_a_command_other_than_serve_does_not_need_the_server_extra():
    """Only ``bucketq serve`` imports FastAPI and uvicorn: every other command works
    without the server extra (and does not pay its import at every start)."""
    script = (
        "import runpy, sys\n"
        "sys.modules.update(fastapi=None, uvicorn=None)  # as if not installed\n"
        "sys.argv = ['bucketq', 'bench', '--repeat', '0']\n"
        "runpy.run_module('bucketq', run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 2
    one_clear_line(out, "--repeat", "at least 1")


def test_store_on_a_port_in_use_says_the_address_is_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = bucketq("store", "--port", str(port))
    one_clear_line(out, f"127.0.0.1:{port}", "in use")


def test_an_old_command_name_still_runs_after_one_line_naming_the_new_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = bucketq("server", "--port", str(port))
    said, error = out.stderr.strip().splitlines()
    assert said == ("bucketq server: deprecated, use `bucketq store` (the old name goes in a "
                    "later release)")  # fmt: skip
    assert f"127.0.0.1:{port}" in error and out.returncode == 1
    commands = bucketq("--help").stdout.split("positional arguments:")[1].split()[0]
    assert "store" in commands.strip("{}").split(",") and "server" not in commands


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [("BUCKETQ_LOG_LEVEL", "verbose", "one of 'debug', 'info', 'warning', 'error'"),
     ("BUCKETQ_MAX_RECORDS", "lots", "a whole number at least 1"),
     ("RESERVOIR_BUFFER_SHARDS", "0", "a whole number at least 1")],
)  # fmt: skip
def test_serve_with_a_bad_variable_names_it_in_one_line_before_starting(var, value, says):
    out = bucketq("serve", "--port", "0", environ={var: value})
    assert out.returncode in (1, 2)
    one_clear_line(out, f"{var} must be {says}; got {value!r}.")


@pytest.mark.parametrize(
    "args", [["queues", "list"], ["quarantine", "list", "--queue", "q"], ["bench", "--quick"]]
)
def test_a_bad_mongodb_uri_variable_is_named_by_every_command(args):
    out = bucketq(*args, environ={"BUCKETQ_MONGODB_URI": "localhost"})
    one_clear_line(out, "BUCKETQ_MONGODB_URI must be a URL starting with mongodb://", "'localhost'")


# -- the reservoir's configuration --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"shards": "3"}, "shards"), ({"shards": True}, "shards"), ({"shards": 0}, "shards"),
        ({"max_batch_size": 2.5}, "max_batch_size"), ({"enabled": "yes"}, "enabled"),
        ({"cooldown_ms": -1}, "cooldown_ms"), ({"redis_url": "nonsense"}, "REDIS_URL"),
        ({"mongodb_uri": "localhost"}, "BUCKETQ_MONGODB_URI"), ({"transport": "kafka"}, "transport"),
    ],
)  # fmt: skip
def test_a_bad_buffer_config_names_the_field(kwargs, needle):
    with pytest.raises(ConfigurationError, match=needle):
        BufferConfig(**kwargs)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"REDIS_URL": "not-a-url"}, "REDIS_URL"),
        ({"BUCKETQ_MONGODB_URI": "nope"}, "BUCKETQ_MONGODB_URI"),
        ({"RESERVOIR_BUFFER_SHARDS": "nan"}, "RESERVOIR_BUFFER_SHARDS"),
        ({"RESERVOIR_BUFFER_MAX_BATCH_SIZE": "1e3"}, "RESERVOIR_BUFFER_MAX_BATCH_SIZE"),
        ({"RESERVOIR_BUFFER_ENABLED": "maybe"}, "RESERVOIR_BUFFER_ENABLED"),
    ],
)
def test_a_bad_environment_variable_is_named(env, needle):
    with pytest.raises(ConfigurationError, match=needle):
        from_env(env)


def test_good_urls_pass():
    cfg = from_env({"REDIS_URL": "redis://127.0.0.1:6379/0", "BUCKETQ_MONGODB_URI": ""})
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"


def test_a_missing_optional_dependency_says_which_extra_to_install():
    assert require("json", "reservoir").dumps([]) == "[]"
    for extra, who in (("reservoir", "reservoir buffer"), ("sdk", "logging SDK"),
                       ("server", "ingest service"), ("spark", "Spark data source")):  # fmt: skip
        with pytest.raises(MissingDependency, match=rf"{who} needs the 'no_such_mod' package.*"
                           rf"pip install 'bucketq\[{extra}\]'.*checkout.*pip install -e '\.\[{extra}\]'") as err:  # fmt: skip
            require("no_such_mod", extra)
        # One error for every missing extra: a ConfigurationError, and an ImportError
        # for code that guards an optional import.
        assert isinstance(err.value, ConfigurationError) and isinstance(err.value, ImportError)
        assert err.value.name == "no_such_mod"
    with pytest.raises(MissingDependency, match=r"'no_a', 'no_b'.*bucketq\[bench\]"):
        require_all(["json", "no_b", "no_a"], "bench")


# -- one mechanism: the same text is the same value in every table ------------------------

#: A whole-number setting of each place that reads text: (read it, what it gave).
WHOLE_NUMBER_READERS = {
    "reservoir": lambda text: from_env({"RESERVOIR_BUFFER_MAX_BATCH_SIZE": text}).max_batch_size,
    "server": lambda text: server.from_env({"BUCKETQ_MAX_RECORDS": text}).max_records,
    "spark": lambda text: (
        spark_ops.Options(
            {"uri": "mongodb://h", "queue": "q", "numPartitions": text}
        ).num_partitions
    ),
    "command line": lambda text: cli_count(1)(text),
}


@pytest.mark.parametrize("where", sorted(WHOLE_NUMBER_READERS))
@pytest.mark.parametrize(("text", "value"), [("1000", 1000), ("1_000", 1000), (" 250 ", 250)])
def test_a_whole_number_reads_alike_everywhere(where, text, value):
    assert WHOLE_NUMBER_READERS[where](text) == value


@pytest.mark.parametrize("where", sorted(WHOLE_NUMBER_READERS))
@pytest.mark.parametrize("text", ["1e3", "ten", "nan", "1.5", "", "1__000", "\u0661\u0662", "0"])
def test_a_bad_whole_number_is_refused_alike_everywhere(where, text):
    refused = argparse.ArgumentTypeError if where == "command line" else ConfigurationError
    with pytest.raises(refused) as err:
        WHOLE_NUMBER_READERS[where](text)
    assert f"must be a whole number at least 1; got {text!r}" in str(err.value)


def test_errors_name_the_variable_or_option_and_what_it_accepts():
    with pytest.raises(ConfigurationError) as err:
        from_env({"RESERVOIR_BUFFER_SHARDS": "many"})
    assert str(err.value) == (
        "RESERVOIR_BUFFER_SHARDS must be a whole number at least 1; got 'many'. "
        "Fix or unset the variable."
    )
    with pytest.raises(ConfigurationError) as err:
        server.from_env({"BUCKETQ_KEY_CACHE_MS": "5000"})
    assert str(err.value).startswith(
        "BUCKETQ_KEY_CACHE_MS must be a whole number from 0 to 1000; got '5000'."
    )
    with pytest.raises(ConfigurationError) as err:
        spark_ops.Options({"uri": "mongodb://h", "queue": "q", "MODE": "Batch"})
    assert str(err.value) == "Option mode must be one of 'auto', 'stream', 'queue'; got 'Batch'."
    with pytest.raises(ConfigurationError) as err:
        server.ServerConfig(max_records=0)
    assert str(err.value).startswith("max_records (BUCKETQ_MAX_RECORDS) must be a whole number")


@pytest.mark.parametrize("bad", ["a$b", "system.x", ".x", "x.", "a..b", "x" * 201])
def test_one_collection_name_check_for_queues_streams_and_prefixes(bad):
    """A queue name, the server's tee stream, the reservoir's prefix and Spark's queue
    option are refused alike (the same message), and each names its setting."""
    places = [
        ("QueueOptions(dead_letter_queue=...)", lambda: QueueOptions(dead_letter_queue=bad)),
        ("BUCKETQ_TEE_STREAM", lambda: server.from_env({"BUCKETQ_TEE_STREAM": bad})),
        ("RESERVOIR_BUFFER_STREAM_PREFIX",
         lambda: from_env({"RESERVOIR_BUFFER_STREAM_PREFIX": bad})),
        ("Option queue", lambda: spark_ops.Options({"uri": "mongodb://h", "queue": bad})),
    ]  # fmt: skip
    needs = set()
    for name, build in places:
        with pytest.raises(ConfigurationError) as err:
            build()
        msg = str(err.value)
        assert (name.split("(")[0] in msg) or "dead_letter_queue" in msg, msg
        needs.add(msg.split(" must be ", 1)[1].split("; got")[0])
    assert len(needs) == 1, needs


@pytest.mark.parametrize(
    "table",
    [
        reservoir_config.SETTINGS,
        server.SETTINGS,
        spark_ops.OPTIONS,
        sdk_options.OPTIONS,
        queue_options.OPTIONS,
        stream_core.OPTIONS,
    ],
    ids=["reservoir", "server", "spark", "sdk", "queue", "stream"],
)
def test_every_documented_default_reads_as_the_default(table):
    """The docs' tables show each default as text: read back, it is the code's default
    (and a check accepts every default)."""
    assert any(s.default_text for s in table)
    for s in table:
        if s.default_text:
            parsed = s.parse(s.default_text)
            expected = s.check(s.name, s.default, **s.limits)
            assert parsed == expected, s.name


@pytest.mark.parametrize(
    ("doc", "render"),
    [("reservoir.md", reservoir.config_table), ("server.md", server.config_table),
     ("spark.md", spark_ops.options_table), ("sdk.md", sdk_options.options_table),
     ("options.md", queue_options.options_table), ("stream.md", stream_core.options_table)],
)  # fmt: skip
def test_the_docs_tables_are_rendered_from_the_code(doc, render):
    text = (ROOT / "docs" / doc).read_text()
    m = re.search(r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", text, re.S)
    assert m, f"docs/{doc} lost its config-table markers"
    assert m.group(1) == render(), (
        f"regenerate docs/{doc}'s table with {render.__module__}.{render.__name__}()"
    )


#: Every whole-number setting read from text, in every table.
WHOLE_SETTINGS = [
    s
    for table in (reservoir_config.SETTINGS, server.SETTINGS, spark_ops.OPTIONS)
    for s in table
    if s.check is count
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(WHOLE_SETTINGS), st.integers(-(10**7), 10**7))
def test_every_whole_number_setting_reads_text_alike(setting, n):
    """Written plainly, with underscores or with spaces, a number is itself in every
    table; out of its range it is refused with the setting's name and the text."""
    lo, hi = setting.limits.get("lo", 0), setting.limits.get("hi")
    texts = [str(n), f"{n:_}", f" {n} "]
    if lo <= n and (hi is None or n <= hi):
        assert {setting.parse(t) for t in texts} == {n}
    else:
        for t in texts:
            with pytest.raises(ConfigurationError) as err:
                setting.parse(t)
            assert str(err.value).startswith(f"{setting.name} must be a whole number ")
            assert str(err.value).endswith(f"; got {t!r}.")
