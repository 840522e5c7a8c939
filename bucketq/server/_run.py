"""``bucketq serve``: storage (a MongoDB URI, or the embedded server started for it),
then the app under uvicorn on one bound socket. uvicorn handles SIGTERM/SIGINT: it
stops accepting, lets in-flight requests finish, then the app's lifespan stops the
buffer within ``RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS`` and logs its report.

``--workers N``: N processes (uvicorn's supervisor, spawned) serve the one socket; each
builds its app with :func:`worker_app` from the environment the parent set (the storage
URI, the database). Metrics are kept in prometheus_client's multiprocess mode (a
directory of the parent's, removed at the end), so ``/metrics`` from any worker counts
every worker's requests. SIGTERM reaches the parent, which stops each worker gracefully.

The embedded store runs under a :class:`~bucketq.supervisor.StoreSupervisor` in this
(the parent) process: when it dies it is restarted, requests get 503 at once meanwhile and
``/ready`` names the state (the workers read it from a file the parent writes); when it
cannot be restarted, ``bucketq serve`` stops and exits 1."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..embedded import URI_ENV, EmbeddedServer, PublishedUri, private_dir, state_dir
from ..reservoir import from_env as buffer_from_env
from ..supervisor import StateFile, StoreSupervisor
from ._config import DEFAULT_HOST, DEFAULT_PORT, STOP_SIGNALS, ServerConfig, from_env
from ._middleware._base import Middleware

log = logging.getLogger("bucketq.server")

#: prometheus_client's multiprocess directory (read when it is first imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: What a worker logs at, and the URL it logs (set by the parent).
_WORKER_LOG_LEVEL_ENV = "BUCKETQ_SERVE_WORKER_LOG_LEVEL"
#: The file where the parent keeps the embedded store's state for the workers.
_STORE_STATE_ENV = "BUCKETQ_SERVE_STORE_STATE"
#: Listen backlog: connections the kernel holds until a worker accepts them.
BACKLOG = 2048
#: Seconds a ``--workers`` process may take to answer uvicorn's health ping (its start
#: included) before uvicorn replaces it.
WORKER_HEALTHCHECK_S = 60


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, made as ``loop.create_server`` would make it. Its protocol
    is ``IPPROTO_TCP``, not 0: asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only
    on sockets that say so, and accepted sockets inherit the listener's. With Nagle on,
    the answer's body (uvicorn writes the head and the body separately) waited for the
    client's delayed ACK of the head, adding the ACK delay to every answer."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve(
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    config: ServerConfig | None = None,
    data: str | None = None,
    log_level: str = "info",
    workers: int = 1,
) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit code."""
    import uvicorn

    from ._admission import configure as configure_protocol
    from ._app import create_app

    cfg = config or from_env()
    bcfg = buffer_from_env()
    store: StoreSupervisor | None = None
    published: PublishedUri | None = None
    #: What stops the service when the store cannot be restarted (set once it runs).
    stoppers: list[Callable[[], None]] = []
    sock = bind(host, port)  # fail on a busy port before starting anything
    # Listening at once: a client that connects while storage and the app start waits in
    # the backlog and is answered when they are up, instead of being refused (a script's
    # `bucketq serve &` then `curl ...` works as typed).
    sock.listen(BACKLOG)
    try:
        if not cfg.mongodb_uri:
            data_dir = Path(data) if data else private_dir(state_dir()) / "serve-data"
            embedded = EmbeddedServer(data_dir, auth=True).start()
            store = _supervise(embedded, cfg, workers, stoppers)
            cfg = cfg.with_(mongodb_uri=embedded.uri)
            published = PublishedUri(cfg.mongodb_uri)
            log.warning(
                "no BUCKETQ_MONGODB_URI: started the embedded MongoDB server on %s (data in "
                "%s; its URI, with the generated password, in %s)",
                embedded.address, data_dir, published.path,
            )  # fmt: skip
            if bcfg.transport == "bucketq" and not bcfg.mongodb_uri:
                bcfg = bcfg.with_(mongodb_uri=embedded.uri)
        if store is not None:
            from ._app import AT_FORCED_EXIT

            def cleanup(
                supervisor: StoreSupervisor = store, uri: PublishedUri | None = published
            ) -> None:
                if uri is not None:
                    uri.withdraw()
                supervisor.close(keep_data=True)

            AT_FORCED_EXIT.append(cleanup)
        if workers > 1:
            code = _serve_workers(cfg, bcfg.graceful_shutdown_ms, sock, host, workers, log_level,
                                  stoppers)  # fmt: skip
            return 1 if store is not None and store.gave_up else code
        app = create_app(
            cfg, buffer_config=bcfg, store=(lambda: store.state) if store is not None else None
        )
        # Everything loaded so far (the HTTP stack, the driver, the app) lives as long as
        # the process: frozen, a full collection no longer walks it on the event loop,
        # where every answer in flight waits for it.
        gc.collect()
        gc.freeze()
        bound = sock.getsockname()
        app.state.listen_url = f"http://{host}:{bound[1]}"
        uv: Any = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            log_level=log_level,
            timeout_graceful_shutdown=max(1, bcfg.graceful_shutdown_ms // 1000),
            lifespan="on",
            http=configure_protocol(cfg),
        )
        server = uvicorn.Server(uv)
        stoppers.append(lambda: setattr(server, "should_exit", True))
        # uvicorn restores these handlers after its graceful shutdown and re-raises the
        # signal it caught: with the defaults the process would die there, before the
        # embedded server is stopped below. These only note it.
        caught: list[int] = []
        previous = {sig: signal.signal(sig, lambda s, _f: caught.append(s)) for sig in STOP_SIGNALS}
        try:
            server.run(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if caught:
            log.info("stopped by signal %d", caught[0])
        svc = getattr(app.state, "svc", None)
        if svc is not None and svc.stop_incomplete:
            return 1  # records were kept by the transport or lost: say so to the supervisor
        if store is not None and store.gave_up:
            return 1  # the store could not be restarted: a supervisor of ours must act
        return 0 if server.started else 1
    finally:
        sock.close()
        if published is not None:  # first: a command started now must not find a store stopping
            published.withdraw()
        if store is not None:
            store.close(keep_data=True)
            if store.state_path is not None:
                shutil.rmtree(store.state_path.parent, ignore_errors=True)


def _supervise(
    embedded: EmbeddedServer, cfg: ServerConfig, workers: int, stoppers: list[Callable[[], None]]
) -> StoreSupervisor:
    """The embedded store's supervisor (started). With workers its state goes to a file
    (their environment names it); the service stops when the supervisor gives up."""
    path: Path | None = None
    if workers > 1:
        path = Path(tempfile.mkdtemp(prefix="bucketq-store-")) / "state.json"
        os.environ[_STORE_STATE_ENV] = str(path)

    def give_up() -> None:
        for stop in stoppers:
            stop()

    return StoreSupervisor(
        embedded,
        restarts=cfg.store_restarts,
        backoff_s=cfg.store_restart_backoff_ms / 1000,
        on_give_up=give_up,
        state_path=path,
    ).start()


def _serve_workers(
    cfg: ServerConfig, graceful_ms: int, sock: socket.socket, host: str, workers: int,
    log_level: str, stoppers: list[Callable[[], None]],
) -> int:  # fmt: skip
    """``workers`` processes on ``sock`` until SIGTERM/SIGINT; 0 when every one ended so."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from ._admission import configure as configure_protocol

    metrics_dir = tempfile.mkdtemp(prefix="bucketq-metrics-")
    # What the workers read (spawned: a fresh interpreter each, with this environment).
    os.environ[MULTIPROC_ENV] = metrics_dir
    os.environ[URI_ENV] = cfg.mongodb_uri
    os.environ["BUCKETQ_DATABASE"] = cfg.database
    os.environ[_WORKER_LOG_LEVEL_ENV] = log_level
    try:
        uv: Any = uvicorn.Config(
            "bucketq.server._run:worker_app",
            factory=True,
            workers=workers,
            log_config=None,
            access_log=False,
            log_level=log_level,
            timeout_graceful_shutdown=max(1, graceful_ms // 1000),
            # A worker answers uvicorn's health ping only once its imports are done; on a
            # loaded machine a spawned worker took longer than uvicorn's 5 s, and each
            # was killed before it served, over and over.
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
            lifespan="on",
            http=configure_protocol(cfg),
        )
        supervisor = Multiprocess(uv, sockets=[sock])
        stoppers.append(supervisor.should_exit.set)
        log.info("bucketq serve listening on http://%s:%d (%d workers)",
                 host, sock.getsockname()[1], workers)  # fmt: skip
        supervisor.run()
        codes = [p.exitcode for p in supervisor.processes]
        log.info("workers stopped (exit codes %s)", codes)
        # A worker ends by the signal it was stopped with (uvicorn re-raises it) after a
        # graceful stop; one whose buffer stop was incomplete exits 1 (_ExitIncomplete).
        return 0 if all(c in _STOPPED_BY_SIGNAL for c in codes) else 1
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def worker_app() -> Any:
    """The app of one ``--workers`` process (uvicorn calls it in the worker)."""
    from ._admission import configure as configure_protocol
    from ._app import create_app

    level = os.environ.get(_WORKER_LOG_LEVEL_ENV, "info")
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")  # fmt: skip
    cfg = from_env()
    configure_protocol(cfg)
    state = os.environ.get(_STORE_STATE_ENV)
    store = StateFile(state).current if state else None
    app = create_app(cfg, buffer_config=buffer_from_env(), store=store)
    gc.collect()
    gc.freeze()  # as in serve(): the long-lived objects out of every collection
    return _ExitIncomplete(app)


#: A worker's exit codes after a graceful stop: 0, or killed by the re-raised signal.
_STOPPED_BY_SIGNAL = (0, -signal.SIGTERM, -signal.SIGINT)


class _ExitIncomplete(Middleware):
    """A worker whose buffer stop did not finish exits 1 as soon as the app's shutdown
    is over (uvicorn would end it by the re-raised SIGTERM, hiding it from the parent)."""

    scope_type = "lifespan"

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def watching_send(message: Any) -> None:
            await send(message)
            svc = getattr(self.app.state, "svc", None)
            if message["type"] == "lifespan.shutdown.complete" and svc is not None:
                if svc.stop_incomplete:
                    logging.shutdown()
                    os._exit(1)

        await self.app(scope, receive, watching_send)
