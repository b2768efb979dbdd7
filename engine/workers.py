"""``authio serve engine --workers N``: N engine processes on one port, and their supervisor.

One engine process answers checks on one core: the check path is Python on one event loop. To
use every core of a machine, ``authio serve engine`` runs N worker processes (default: one per
core this process may run on, ``SERVICE_ENGINE_WORKERS`` or ``--workers``). Each is a whole
engine (``engine.app.create_engine_app``): its own store registry holding every store in memory
and following the change log, its own PostgreSQL pool and listener, its own Redis client and
revocation mirror. They share nothing but the port and a readiness board. So N workers take N
times the memory and the connections of one engine (``SERVICE_PG_POOL_MAX`` + 1 each).

The port: every worker binds it with ``SO_REUSEPORT`` (aiohttp's ``reuse_port=True``), and the
kernel spreads new connections over the listening sockets by a hash of the connection's
addresses. A connection stays with the worker that accepted it; there is no hand-off between
processes on the request path.

The supervisor (the parent process, :func:`supervise`) starts the workers with
``multiprocessing``'s ``spawn`` (fresh interpreters: no state copied from a parent that has
loaded nothing anyway), and

* restarts a worker that exits while the service runs: at once when it had been ready, else after
  a backoff that doubles from :data:`BACKOFF_FIRST_SECONDS` to :data:`BACKOFF_MAX_SECONDS`, so a
  worker that cannot start (a port taken, a bad setting) does not spin. A replacement binds the
  port only once its stores are loaded: until then the kernel sends it no connection, and the
  other workers answer every check;
* on SIGTERM or SIGINT sends SIGTERM to every worker once (each stops gracefully: it stops
  accepting, finishes its requests in flight for up to :data:`SHUTDOWN_SECONDS`, runs its cleanup),
  waits for them (SIGKILL after :data:`STOP_GRACE_SECONDS`) and exits 0. Workers run in their own
  process group, so a terminal's Ctrl-C reaches the supervisor alone and each worker is told
  once; a worker ignores a second signal while it stops;
* is watched by the workers: each holds the read end of a pipe whose write end only the
  supervisor has, so when the supervisor is gone (even killed with SIGKILL) the pipe reads end
  of file and every worker stops gracefully instead of serving on unsupervised.

Readiness (``GET /readyz``): ready only when every worker is. A connection reaches one worker,
so each worker answers for all: the :class:`ReadinessBoard` is one byte per worker in shared
memory (``multiprocessing.RawArray``), which each worker sets to its own state
(:data:`NOT_READY`, :data:`READY`, :data:`STALE`) every :data:`PUBLISH_SECONDS` and which the
supervisor resets to :data:`NOT_READY` the moment a worker exits. A worker's ``/readyz`` adds the
others' states to its own probes: 503 ``not_ready`` while any worker is loading, restarting or
gone, ``stale`` when any cannot follow the change log. The first workers bind the port at once,
as a single engine does, so ``/healthz`` answers and ``/readyz`` says 503 while they load.

``--workers 1`` (or one core) is the single engine of :func:`control_plane.cli.serve.serve`: no
supervisor, no board, the same process as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_ready_fds
from multiprocessing.process import BaseProcess
from typing import Any, Final

from aiohttp import web

from common.appkeys import READINESS, Readiness
from common.http import EnvelopeRunner
from common.runtime import GC_THRESHOLDS
from common.settings import Settings

__all__ = ["ReadinessBoard", "default_workers", "supervise", "worker_count"]

log = logging.getLogger("authio.engine.workers")

NOT_READY: Final = 0
READY: Final = 1
STALE: Final = 2
_CODES: Final[dict[Readiness, int]] = {"not_ready": NOT_READY, "ready": READY, "stale": STALE}

PUBLISH_SECONDS: Final = 0.1
"""How often a worker writes its readiness to the board (a byte; the cost is a wake-up)."""
SHUTDOWN_SECONDS: Final = 15.0
"""A worker's graceful stop: requests in flight finish within this (as ``authio serve``)."""
STOP_GRACE_SECONDS: Final = 30.0
"""How long the supervisor waits for its workers after SIGTERM before it kills them: the
shutdown above plus the cleanup contexts (the PostgreSQL pool's close is bounded at 10 s)."""
BACKOFF_FIRST_SECONDS: Final = 0.5
BACKOFF_MAX_SECONDS: Final = 30.0
"""A worker that exits before it was ever ready is started again after a delay doubling from
the first to the max value; one that had been ready is started again at once."""


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, so ``taskset`` and cpusets count;
    ``os.cpu_count()`` where affinity is unknown), at least 1. A container's CPU quota (CFS) is
    not seen: set ``SERVICE_ENGINE_WORKERS`` there."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def worker_count(settings: Settings, given: int | None) -> int:
    """``given`` (``--workers``), else ``SERVICE_ENGINE_WORKERS``, else :func:`default_workers`.
    Raises ValueError for a count below 1."""
    count = given if given is not None else settings.engine_workers
    if count is None:
        return default_workers()
    if count < 1:
        raise ValueError(f"--workers must be 1 or more, not {count}")
    return count


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


# -- a worker ----------------------------------------------------------------------------------


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


def _worker_app(settings: Settings, board: ReadinessBoard) -> web.Application:
    """The engine app of one worker, its ``/readyz`` answering for every worker, its own state
    (the engine's probes) published on ``board``."""
    from engine.app import create_engine_app

    app = create_engine_app(settings)
    own = app[READINESS].copy()  # the engine's probes, before the board's
    app[READINESS].append(board.others)
    app.cleanup_ctx.append(_board_ctx(board, own))
    return app


async def _until_loaded(app: web.Application) -> None:
    """Until the engine can serve, as its readiness probe has it: every store loaded and caught
    up, the signing keys read."""
    from engine.appkeys import KEYS, STORES

    while not await app[STORES].wait_ready(60.0):
        pass
    await app[KEYS].loaded.wait()


async def _serve_worker(app: web.Application, *, host: str, port: int, bind_at_once: bool,
                        lifeline: Connection, index: int) -> None:
    """Run ``app`` on ``host:port`` with ``SO_REUSEPORT`` until SIGTERM, SIGINT or the end of
    ``lifeline`` (the supervisor is gone), then stop gracefully. With ``bind_at_once`` false the
    port is bound only once the engine can serve (:func:`_until_loaded`)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # a second signal sets it again: no effect

    def orphaned() -> None:
        loop.remove_reader(lifeline.fileno())
        log.warning("engine worker %d: its supervisor is gone; stopping", index)
        stop.set()

    loop.add_reader(lifeline.fileno(), orphaned)  # readable only at end of file: nobody writes
    runner = EnvelopeRunner(app, handle_signals=False, access_log=None,
                            shutdown_timeout=SHUTDOWN_SECONDS, keepalive_timeout=75.0)
    await runner.setup()
    try:
        if not bind_at_once:
            loaded = asyncio.create_task(_until_loaded(app), name="engine-worker-loaded")
            stopped = asyncio.create_task(stop.wait(), name="engine-worker-stop")
            await asyncio.wait({loaded, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (loaded, stopped):
                task.cancel()
        if not stop.is_set():
            await web.TCPSite(runner, host, port, reuse_port=True).start()
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

    from common.logging import configure_logging
    from common.settings import load_settings
    from common.telemetry import setup_metrics, setup_tracing, shutdown_metrics, shutdown_tracing

    os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor, which tells each worker once
    settings = load_settings()
    configure_logging(settings.log_level)
    provider = setup_tracing(settings, service_name_default="authio-engine")
    meters = setup_metrics(settings, service_name_default="authio-engine")
    try:
        app = _worker_app(settings, ReadinessBoard(cells, index))
        gc.set_threshold(*GC_THRESHOLDS)
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_serve_worker(
                app, host=settings.host, port=settings.engine_port,
                bind_at_once=bind_at_once, lifeline=lifeline, index=index))
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


# -- the supervisor ----------------------------------------------------------------------------


@dataclass
class _Slot:
    """Worker ``index``: its process (None while waiting to be started again), when it started,
    whether it was ever seen ready, the next restart delay and when a restart is due."""

    index: int
    process: BaseProcess | None = None
    started: float = 0.0
    was_ready: bool = False
    backoff: float = 0.0
    due: float | None = None


class Supervisor:
    """Starts ``count`` workers, restarts those that exit, stops them all on a signal (see the
    module docstring). ``run()`` blocks until stopped and returns the exit code (0).

    ``worker`` is the process target (``worker_main``; tests never replace it)."""

    def __init__(self, count: int, *, worker: Callable[..., None] = worker_main) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._cells = self._ctx.RawArray("b", count)
        self._slots = [_Slot(i) for i in range(count)]
        self._worker = worker
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # The workers' lifeline: they hold the read end; the write end stays here, unwritten,
        # and closes with this process however it ends.
        self._lifeline, self._lifeline_w = self._ctx.Pipe(duplex=False)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _start(self, slot: _Slot, *, bind_at_once: bool) -> None:
        self._cells[slot.index] = NOT_READY
        process = self._ctx.Process(
            target=self._worker, args=(slot.index, self._cells, bind_at_once, self._lifeline),
            name=f"authio-engine-worker-{slot.index}", daemon=False)
        process.start()
        slot.process, slot.started, slot.was_ready, slot.due = process, time.monotonic(), False, None
        log.info("engine worker %d started (pid %s)", slot.index, process.pid)

    def _reap(self, slot: _Slot) -> None:
        """Worker ``slot`` has exited: mark it not ready and schedule its restart."""
        assert slot.process is not None
        slot.process.join()
        code = slot.process.exitcode
        self._cells[slot.index] = NOT_READY
        slot.process = None
        if slot.was_ready:
            slot.backoff = 0.0
        else:
            slot.backoff = min(max(slot.backoff * 2, BACKOFF_FIRST_SECONDS), BACKOFF_MAX_SECONDS)
        slot.due = time.monotonic() + slot.backoff
        log.warning("engine worker %d exited (code %s)%s; starting it again in %.1f s",
                    slot.index, code, "" if slot.was_ready else " before it was ever ready",
                    slot.backoff)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in self._slots:
                self._start(slot, bind_at_once=True)
            while not self._stopping:
                self._step()
            return self._stop_all()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _step(self) -> None:
        now = time.monotonic()
        timeouts = [0.5] + [max(s.due - now, 0.0) for s in self._slots if s.due is not None]
        sentinels = {s.process.sentinel: s for s in self._slots if s.process is not None}
        ready = wait_for_ready_fds([*sentinels, self._wake_r], timeout=min(timeouts))
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 64)
        for slot in self._slots:
            if slot.process is not None and self._cells[slot.index] != NOT_READY:
                slot.was_ready = True
        for fd in ready:
            if isinstance(fd, int) and fd in sentinels:
                self._reap(sentinels[fd])
        if self._stopping:
            return
        now = time.monotonic()
        for slot in self._slots:
            if slot.process is None and slot.due is not None and slot.due <= now:
                self._start(slot, bind_at_once=False)

    def _stop_all(self) -> int:
        running = [s.process for s in self._slots if s.process is not None]
        log.info("engine supervisor stopping %d workers", len(running))
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in running:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.exitcode is None:
                log.warning("engine worker pid %s still running after %.0f s; killing it",
                            process.pid, STOP_GRACE_SECONDS)
                process.kill()
                process.join()
        return 0


def supervise(settings: Settings, count: int) -> int:
    """Serve the engine on ``settings.engine_port`` with ``count`` (>= 2) worker processes until
    SIGTERM or SIGINT; returns the exit code. Each worker reads its settings from the same
    environment (they are the ones given here)."""
    print(f"authio engine: {count} workers on http://{settings.host}:{settings.engine_port} "
          f"(supervisor pid {os.getpid()})", flush=True)
    return Supervisor(count).run()
