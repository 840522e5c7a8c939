"""The command line answers bad arguments and unreachable servers with one clear line
on stderr and a non-zero exit status, never a traceback; the reservoir's configuration
checks types and names the variable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bucketq import ConfigurationError
from bucketq.reservoir import BufferConfig
from bucketq.reservoir._config import from_env

ROOT = Path(__file__).resolve().parents[2]


def bucketq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("BUCKETQ_MONGODB_URI", "REDIS_URL"):
        env.pop(k, None)
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
        (["dlq", "inspect", "--transport", "redis", "--redis-url", "nonsense"], ["--redis-url", "redis://"]),
        (["dlq", "inspect", "--transport", "redis", "--redis-url", "redis://x", "--limit", "-5"], ["--limit", "at least 1"]),
        (["dlq", "replay", "--transport", "bucketq", "--limit", "0"], ["--limit"]),
        (["dlq", "inspect", "--transport", "bucketq", "--mongodb-uri", "localhost"], ["--mongodb-uri", "mongodb://"]),
        (["bench", "--repeat", "0"], ["--repeat"]),
        (["bench", "--n", "-5"], ["--n"]),
        (["bench", "--procs", "1,x"], ["--procs"]),
        (["server", "--port", "70000"], ["--port", "65535"]),
        (["server", "--port", "abc"], ["--port"]),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_line_and_exit_status_2(args, needles):
    out = bucketq(*args)
    assert out.returncode == 2
    one_clear_line(out, *needles)


def test_dlq_inspect_on_a_dead_mongodb_is_one_line():
    out = bucketq("dlq", "inspect", "--transport", "bucketq", "--mongodb-uri",
                  f"mongodb://127.0.0.1:{_dead_port()}/?directConnection=true")  # fmt: skip
    one_clear_line(out, "bucketq dlq inspect: error", "could not be reached")


def test_dlq_inspect_on_a_dead_redis_is_one_line():
    out = bucketq("dlq", "inspect", "--transport", "redis", "--redis-url",
                  f"redis://127.0.0.1:{_dead_port()}/0")  # fmt: skip
    one_clear_line(out, "bucketq dlq inspect: error")


def test_bench_on_a_dead_mongodb_says_so_in_one_line():
    out = bucketq("bench", "--quick", "--no-plots", "--mongodb-uri",
                  f"mongodb://127.0.0.1:{_dead_port()}")  # fmt: skip
    one_clear_line(out, "cannot reach MongoDB")


def test_server_on_a_port_in_use_says_the_address_is_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = bucketq("server", "--port", str(port))
    one_clear_line(out, f"127.0.0.1:{port}", "in use")


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
    from bucketq.reservoir._deps import require as reservoir_require
    from bucketq.sdk._deps import require as sdk_require

    assert reservoir_require("json").dumps([]) == "[]"
    with pytest.raises(
        ImportError, match=r"reservoir buffer needs the 'no_such_mod'.*bucketq\[reservoir\]"
    ):
        reservoir_require("no_such_mod")
    with pytest.raises(ImportError, match=r"logging SDK needs the 'no_such_mod'.*bucketq\[sdk\]"):
        sdk_require("no_such_mod")
