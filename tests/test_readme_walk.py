"""The README walked as a new user would: its queue example, its service, console and SDK
snippets, then the service page's OpenTelemetry example and its tee stream into
``bucketq pipeline`` (docs/server.md), run as they are written, in one shell, with a
temporary HOME and no MongoDB URI (the embedded server, as a new user gets it). The answers
the pages show (``# {...}`` under a command, ``...`` standing for anything) must be what the
service answers. So the README cannot drift from what works.

What the walk changes, and why: a free port in place of 8080 (the suite runs in parallel);
``python -m pip install`` lines are left out (the test extra has installed what they
install); the Python snippets run as files (the SDK's followed by one query for its
record); the JVM gets the Spark tests' start-up options. Everything else is the pages' text.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from jvm import class_archive, jvm_options

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("readme_walk")]


def section(readme: str, heading: str) -> str:
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    return readme[start : end if end > 0 else len(readme)]


def blocks(text: str, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(text) if kind == lang]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shown_answers(block: str) -> list[re.Pattern[str]]:
    """The answers a shell block shows: its ``# {...`` lines, ``...`` standing for anything."""
    out = []
    for ln in block.splitlines():
        shown = ln.strip()
        if shown.startswith("# {"):
            answer = shown[2:].split("     ")[0].strip()  # a comment may follow the answer
            out.append(re.compile(".*?".join(map(re.escape, answer.split("...")))))
    return out


def walk_script(readme: str, server_doc: str, port: int) -> tuple[str, list[re.Pattern[str]]]:
    """The shell script of the walk, and the answers the pages show for it."""
    (first,) = blocks(section(readme, "## A queue in ten lines"), "python")
    (serve,) = blocks(section(readme, "## The ingest service"), "sh")
    (sdk,) = blocks(section(readme, "## The logging SDK"), "python")
    (console,) = blocks(section(readme, "## The web console"), "sh")
    (otel,) = blocks(section(server_doc, "### Sending with OpenTelemetry"), "sh")[:1]
    (parquet,) = blocks(section(server_doc, "## Into Spark: the tee stream"), "sh")

    def shell(block: str) -> str:
        kept = [ln for ln in block.splitlines() if not ln.startswith("python -m pip install")]
        text = "\n".join(kept).replace("bucketq serve &", f"bucketq serve --port {port} &")
        return text.replace("8080", str(port))

    def python(name: str, code: str) -> list[str]:
        return [f"cat > {name}.py <<'PY'", code.replace("8080", str(port)), "PY",
                f"python {name}.py"]  # fmt: skip

    script = "\n".join([
        "set -e -o pipefail",
        "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT",
        *python("first", first),
        shell(serve),
        "echo",
        shell(console),
        shell(otel),
        "echo",
        *python("sdk_snippet", sdk),
        f'curl -s "localhost:{port}/api/v1/logs?service=sdk_snippet" -H "X-API-Key: $KEY"',
        "echo",
        shell(parquet),
    ])  # fmt: skip
    return script, [p for b in (serve, otel, parquet) for p in shown_answers(b)]


def test_the_readme_ingest_path_works_as_written(tmp_path):
    if shutil.which("java") is None and not os.environ.get("CI"):
        pytest.skip("the pipeline step needs a Java runtime")
    port = free_port()
    script, answers = walk_script(
        (ROOT / "README.md").read_text(), (ROOT / "docs" / "server.md").read_text(), port
    )
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BUCKETQ_", "RESERVOIR_", "XDG_", "OTEL_"))}  # fmt: skip
    tmp = tmp_path / "tmp"  # Spark's temporary files: in pytest's directory, not /tmp
    tmp.mkdir()
    class_archive(str(tmp))
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), TMPDIR=str(tmp),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               JAVA_TOOL_OPTIONS=jvm_options(str(tmp)))  # fmt: skip
    # Its own process group: on a timeout the shell's background services go with it
    # (its EXIT trap does not run when it is killed).
    walk = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = walk.communicate(timeout=280)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(walk.pid, signal.SIGKILL)
    said = stdout + "\n--- stderr ---\n" + stderr
    assert walk.returncode == 0, said
    assert "{'to': 'a@example.com'}" in stdout, said  # the queue example's first item
    for shown in answers:
        assert shown.search(stdout), f"the pages show {shown.pattern!r}; the walk said:\n{said}"
    assert re.search(r"^bq_[0-9a-f]{72}$", stdout, re.M), said  # the console's operator key
    assert stdout.count('"received":1') == 2, said  # the first ingest and the tee's
    assert "payment declined" in stdout, said  # GET /api/v1/logs found it
    assert '"service":"checkout"' in stdout and "cart abandoned" in stdout, said
    assert "order placed" in stdout, said  # the SDK snippet's record, read back
    assert "1 records in total" in stdout, said  # only what the tee saw
    import pyarrow.parquet as pq

    stored = pq.read_table(work / "out" / "logs").to_pylist()
    assert [r["message"] for r in stored] == ["to parquet"]
    # The embedded store's files are the user's alone.
    share = home / ".local" / "share" / "bucketq"
    assert (share.stat().st_mode & 0o777) == 0o700
