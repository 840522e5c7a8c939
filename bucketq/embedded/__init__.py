"""Start the embedded MongoDB-wire server (SecantusDB) as a separate process.

SecantusDB is GPL-2.0, so bucketq never imports it: it runs its command line,
``secantusd-py``, installed by the ``embedded`` extra. Tests, benchmarks and the
CLI use this whenever no MongoDB URI is given.

A data directory holds, besides the server's own files: ``secantusd.log`` (the
server's log), ``bucketq.lock`` (locked by the bucketq process that runs the
server, with both process ids) and, for a server started with ``auth=True``,
``bucketq-credentials`` (the generated user and password, mode 0600).
"""

from __future__ import annotations

# The names besides __all__ that the rest of bucketq and the tests take from here.
from .._validate import MONGODB_URI_ENV as URI_ENV  # noqa: F401
from ._files import (  # noqa: F401
    CONFIG_FILE,
    CREDENTIALS_FILE,
    LOCK_FILE,
    LOG_FILE,
    private_dir,
    write_private,
)
from ._process import find_server_command
from ._server import STOP_TIMEOUT, USER, EmbeddedServer, mongodb  # noqa: F401
from ._uri_file import (  # noqa: F401
    STARTING_WAIT,
    URI_FILE,
    PublishedUri,
    embedded_uri,
    state_dir,
)

__all__ = ["EmbeddedServer", "embedded_uri", "find_server_command", "mongodb", "state_dir"]
