"""Spark settings for the sessions bucketq starts itself (``bucketq pipeline``,
bench/spark_bench.py, the tests): loopback binding and compiled pyspark in Python workers.

Binding: Spark binds the driver to the address the host name resolves to, and when that
is a loopback address it picks the first external interface instead (and warns). A
local master needs no other host, so it binds to 127.0.0.1 unless told otherwise
(``SPARK_LOCAL_IP``, or ``bind_address``); a cluster master keeps Spark's choice unless
told.

Python workers: Spark starts its Python processes with ``$SPARK_HOME/python/lib/pyspark.zip``
first on ``PYTHONPATH``, and Python compiles every module it imports from a zip anew in
each process (the zip holds sources only). A streaming query's source runs in such a
process, started when the query starts, and the JVM gives it 10 s to connect back
(``PythonWorkerFactory``, not configurable): compiling pyspark costs far more CPU than
importing the installed, compiled package, and on a loaded machine it can miss the 10 s
("Python worker failed to connect back"). When the zip is the installed
pyspark's own copy (a pip-installed pyspark, whose package directory is SPARK_HOME), a
local session runs its workers through a small script that takes the zip off
``PYTHONPATH``, so they import the same pyspark, compiled.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

LOOPBACK = "127.0.0.1"


def is_local(master: str) -> bool:
    """A master whose executors all run on this host: ``local[...]``, or a standalone
    master on a loopback address (one that no other host can join)."""
    if master.startswith("local"):
        return True
    host = master.removeprefix("spark://").split(":")[0]
    return master.startswith("spark://") and host in (LOOPBACK, "localhost")


def _pyspark_home() -> Path | None:
    """The pip-installed pyspark's directory when it is the Spark that will run, else None."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).resolve().parent
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and Path(spark_home).resolve() != home:
        return None  # another Spark: its zip may be another pyspark
    return home


def worker_python() -> str | None:
    """An executable that runs this interpreter with the installed pyspark's zip taken
    off ``PYTHONPATH`` (written once per interpreter, in the temporary directory), or
    None where that does not apply (no zip, another SPARK_HOME, not POSIX)."""
    home = _pyspark_home()
    if home is None or os.name != "posix":
        return None
    zip_path = home / "python" / "lib" / "pyspark.zip"
    if not zip_path.exists():
        return None
    z, exe = str(zip_path), sys.executable
    script = (
        "#!/bin/sh\n"
        "# Written by bucketq (bucketq/spark/_session.py): Spark's Python workers import the\n"
        "# installed, compiled pyspark instead of compiling pyspark.zip's sources anew.\n"
        f"zip={shlex.quote(z)}\n"
        'case "$PYTHONPATH" in\n'
        '  "$zip") PYTHONPATH= ;;\n'
        '  "$zip":*) PYTHONPATH=${PYTHONPATH#"$zip":} ;;\n'
        "esac\n"
        "export PYTHONPATH\n"
        f'exec {shlex.quote(exe)} "$@"\n'
    )
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"bucketq-spark-python-{os.getuid()}-{digest}"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, path)  # atomic: a concurrent writer wrote the same bytes
    return str(path)


def prepare_session(master: str, bind_address: str | None = None) -> dict[str, str]:
    """Prepare this process's environment for a session on ``master`` (before its JVM
    starts) and return the Spark settings to build it with.

    Binding: ``bind_address``, else ``$SPARK_LOCAL_IP``, else 127.0.0.1 for a master on
    this host (:func:`is_local`); it is set as ``SPARK_LOCAL_IP`` (the JVM then never
    looks at the external interfaces) and as the driver's host and bind address.
    Python workers: for a master on this host, unless ``$PYSPARK_PYTHON`` names one,
    ``PYSPARK_PYTHON`` is :func:`worker_python` (pyspark reads it when the session
    starts; the path exists on this host only, so never for other masters)."""
    conf: dict[str, str] = {}
    here = is_local(master)
    bind = bind_address or os.environ.get("SPARK_LOCAL_IP") or (LOOPBACK if here else None)
    if bind:
        os.environ["SPARK_LOCAL_IP"] = bind
        conf["spark.driver.bindAddress"] = bind
        conf["spark.driver.host"] = bind
    if here and not os.environ.get("PYSPARK_PYTHON"):
        exe = worker_python()
        if exe:
            os.environ["PYSPARK_PYTHON"] = exe
    return conf
