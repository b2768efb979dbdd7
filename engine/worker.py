"""One engine worker of ``authio serve engine --workers N`` (``engine.workers`` is their
supervisor, and says how they work together).

A worker is the engine app of ``engine.app`` served on the shared port with ``SO_REUSEPORT``.
Its ``/readyz`` answers for every worker (:class:`ReadinessBoard`); it binds the port at once
when it is one of the first workers, and only once its stores are loaded when it replaces one
that exited; it stops gracefully on SIGTERM or SIGINT (once: a second signal changes nothing)
and when its supervisor is gone (its lifeline pipe ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, Final

from aiohttp import web

from common.appkeys import READINESS, Readiness
from common.http import EnvelopeRunner
from common.logging import configure_logging
from common.runtime import GC_THRESHOLDS
from common.settings import Settings, load_settings
from common.tls import HSTS, HSTS_HEADER, ServerTls, server_tls
from engine.app import create_engine_app
from engine.appkeys import KEYS, STORES

__all__ = ["NOT_READY", "READY", "STALE", "ReadinessBoard", "worker_main"]

log = logging.getLogger("authio.engine.workers")

NOT_READY: Final = 0
READY: Final = 1
STALE: Final = 2
"""A worker's byte on the readiness board (the supervisor writes NOT_READY when one exits)."""

PUBLISH_SECONDS: Final = 0.1
"""How often a worker writes its readiness to the board (a byte; the cost is a wake-up)."""
SHUTDOWN_SECONDS: Final = 15.0
"""A worker's graceful stop: requests in flight finish within this (as ``authio serve``)."""
_CODES: Final[dict[Readiness, int]] = {"not_ready": NOT_READY, "ready": READY, "stale": STALE}


class ReadinessBoard:
    """Every worker's readiness, one byte each in memory shared by the supervisor and the
    workers: ``cells[i]`` is :data:`NOT_READY`, :data:`READY` or :data:`STALE`. Worker ``index``
    writes its own cell; :meth:`others` reads everyone else's. Single bytes need no lock."""

    def __init__(self, cells: Any, index: int) -> None:
        self._cells = cells
        self.index = index

    def publish(self, state: Readiness) -> None:
        """Write this worker's state."""
        self._cells[self.index] = _CODES[state]

    def others(self) -> Readiness:
        """The worst state of the other workers: ``not_ready`` if any is not ready (loading,
        restarting, gone), else ``stale`` if any is stale, else ``ready``. A readiness probe
        (``common.appkeys.READINESS``)."""
        worst: Readiness = "ready"
        for i, code in enumerate(self._cells):
            if i == self.index:
                continue
            if code == NOT_READY:
                return "not_ready"
            if code == STALE:
                worst = "stale"
        return worst


def _worst(probes: Sequence[Callable[[], Readiness]]) -> Readiness:
    states = [probe() for probe in probes]
    if "not_ready" in states:
        return "not_ready"
    return "stale" if "stale" in states else "ready"


def _board_ctx(board: ReadinessBoard, own: Sequence[Callable[[], Readiness]]
               ) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context publishing this worker's own readiness (``own``: the engine's probes,
    not the board's) every :data:`PUBLISH_SECONDS`, and :data:`NOT_READY` once it stops."""

    async def publishing(app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                board.publish(_worst(own))
                await asyncio.sleep(PUBLISH_SECONDS)

        task = asyncio.create_task(loop(), name="engine-worker-readiness")
        try:
            yield
        finally:
            board.publish("not_ready")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return publishing


def _worker_app(settings: Settings, board: ReadinessBoard,
                listening: asyncio.Event) -> web.Application:
    """The engine app of one worker, its ``/readyz`` answering for every worker, its own state
    (the engine's probes, and ``listening``: not ready before its port is bound, so that the
    supervisor never counts a worker that loaded but could not bind as one that served)
    published on ``board``."""
    app = create_engine_app(settings)
    own = [*app[READINESS],  # the engine's probes, before the board's
           lambda: "ready" if listening.is_set() else "not_ready"]
    app[READINESS].append(board.others)
    app.cleanup_ctx.append(_board_ctx(board, own))
    return app


async def _until_loaded(app: web.Application) -> None:
    """Until the engine can serve, as its readiness probe has it: every store loaded and caught
    up, the signing keys read."""
    while not await app[STORES].wait_ready(60.0):
        pass
    await app[KEYS].loaded.wait()


async def _serve_worker(app: web.Application, *, host: str, port: int, bind_at_once: bool,
                        lifeline: Connection, index: int, listening: asyncio.Event,
                        tls: ServerTls | None = None) -> None:
    """Run ``app`` on ``host:port`` with ``SO_REUSEPORT`` until SIGTERM, SIGINT or the end of
    ``lifeline`` (the supervisor is gone), then stop gracefully. With ``bind_at_once`` false the
    port is bound only once the engine can serve (:func:`_until_loaded`); ``listening`` is set
    once it is bound (the worker is ready from then on). With ``tls`` the port
    speaks HTTPS with HSTS and SIGHUP reloads the certificate (``common.tls``): the supervisor
    starts a worker with SIGHUP blocked and forwards its own, so one sent before the handler is
    in place waits, pending, until it is."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # a second signal sets it again: no effect
    if tls is not None:
        loop.add_signal_handler(signal.SIGHUP, tls.reload)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})

    def orphaned() -> None:
        loop.remove_reader(lifeline.fileno())
        log.warning("engine worker %d: its supervisor is gone; stopping", index)
        stop.set()

    loop.add_reader(lifeline.fileno(), orphaned)  # readable only at end of file: nobody writes
    runner = EnvelopeRunner(app, handle_signals=False, access_log=None,
                            shutdown_timeout=SHUTDOWN_SECONDS, keepalive_timeout=75.0,
                            response_headers={HSTS_HEADER: HSTS} if tls is not None else None)
    await runner.setup()
    try:
        if not bind_at_once:
            loaded = asyncio.create_task(_until_loaded(app), name="engine-worker-loaded")
            stopped = asyncio.create_task(stop.wait(), name="engine-worker-stop")
            await asyncio.wait({loaded, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (loaded, stopped):
                task.cancel()
        if not stop.is_set():
            await web.TCPSite(runner, host, port, reuse_port=True,
                              ssl_context=tls.context if tls is not None else None).start()
            listening.set()
            log.info("engine worker %d (pid %d) listening on %s:%d", index, os.getpid(), host,
                     port)
            await stop.wait()
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(lifeline.fileno())
        await runner.cleanup()


def worker_main(index: int, cells: Any, bind_at_once: bool, lifeline: Connection) -> None:
    """A worker process (``multiprocessing`` target): read the settings from the environment it
    inherited, set up logging and telemetry as ``authio serve`` does, and serve the engine on
    ``SERVICE_ENGINE_PORT`` until told to stop. ``cells`` is the supervisor's board,
    ``lifeline`` the read end of its pipe (end of file: the supervisor is gone)."""
    import uvloop

    from common.telemetry import setup_metrics, setup_tracing, shutdown_metrics, shutdown_tracing

    os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor, which tells each worker once
    settings = load_settings()
    configure_logging(settings.log_level)
    provider = setup_tracing(settings, service_name_default="authio-engine")
    meters = setup_metrics(settings, service_name_default="authio-engine")
    try:
        tls = server_tls(settings.tls_cert_file, settings.tls_key_file,
                         settings.tls_key_password_file)
        listening = asyncio.Event()
        app = _worker_app(settings, ReadinessBoard(cells, index), listening)
        gc.set_threshold(*GC_THRESHOLDS)
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve_worker(
                app, host=settings.host, port=settings.engine_port,
                bind_at_once=bind_at_once, lifeline=lifeline, index=index,
                listening=listening, tls=tls))
        finally:
            rest = asyncio.all_tasks(loop)
            for task in rest:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    finally:
        if provider is not None:
            shutdown_tracing(provider)
        if meters is not None:
            shutdown_metrics(meters)


