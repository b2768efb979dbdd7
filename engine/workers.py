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

This module is the supervisor (the parent process, :func:`supervise`), which builds no app;
``engine.worker`` is a worker. The supervisor starts the workers with
``multiprocessing``'s ``spawn`` (fresh interpreters: no state copied from a parent that has
loaded nothing anyway), and

* restarts a worker that exits while the service runs: at once when it had been ready, else after
  a backoff that doubles from :data:`BACKOFF_FIRST_SECONDS` to :data:`BACKOFF_MAX_SECONDS`, so a
  worker that cannot start (a port taken, a bad setting) does not spin. A replacement binds the
  port only once its stores are loaded: until then the kernel sends it no connection, and the
  other workers answer every check;
* on SIGTERM or SIGINT sends SIGTERM to every worker once (each stops gracefully: it stops
  accepting, finishes its requests in flight for up to 15 s, runs its cleanup),
  waits for them (SIGKILL after :data:`STOP_GRACE_SECONDS`) and exits 0. Workers run in their own
  process group, so a terminal's Ctrl-C reaches the supervisor alone and each worker is told
  once; a worker ignores a second signal while it stops;
* with TLS (``SERVICE_TLS_CERT_FILE``), forwards SIGHUP to every worker, each of which
  reloads its certificate (``common.tls``); without TLS, SIGHUP keeps its default action;
* is watched by the workers: each holds the read end of a pipe whose write end only the
  supervisor has, so when the supervisor is gone (even killed with SIGKILL) the pipe reads end
  of file and every worker stops gracefully instead of serving on unsupervised.

Readiness (``GET /readyz``): ready only when every worker is. A connection reaches one worker,
so each worker answers for all: the readiness board is one byte per worker in shared
memory (``multiprocessing.RawArray``), which each worker sets to its own state
(``engine.worker``'s ``NOT_READY``, ``READY``, ``STALE``) every 100 ms and which the
supervisor resets to ``NOT_READY`` the moment a worker exits. A worker's ``/readyz`` adds the
others' states to its own probes: 503 ``not_ready`` while any worker is loading, restarting or
gone, ``stale`` when any cannot follow the change log. The first workers bind the port at once,
as a single engine does, so ``/healthz`` answers and ``/readyz`` says 503 while they load.

``--workers 1`` (or one core) is the single engine of :func:`control_plane.cli.serve.serve`: no
supervisor, no board, the same process as before.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_ready_fds
from multiprocessing.process import BaseProcess
from typing import Any, Final

from common.settings import Settings
from engine.worker import NOT_READY, worker_main

__all__ = ["default_workers", "supervise", "worker_count"]

log = logging.getLogger("authio.engine.workers")

STOP_GRACE_SECONDS: Final = 30.0
"""How long the supervisor waits for its workers after SIGTERM before it kills them: their
graceful stop (``engine.worker.SHUTDOWN_SECONDS``) plus the cleanup contexts (the PostgreSQL
pool's close is bounded at 10 s)."""
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

    ``worker`` is the process target (``engine.worker.worker_main``; tests never replace it)."""

    def __init__(self, count: int, *, worker: Callable[..., None] = worker_main,
                 forward_sighup: bool = False) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._cells = self._ctx.RawArray("b", count)
        self._slots = [_Slot(i) for i in range(count)]
        self._worker = worker
        self._stopping = False
        self._forward_sighup = forward_sighup
        self._sighup = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # The workers' lifeline: they hold the read end; the write end stays here, unwritten,
        # and closes with this process however it ends.
        self._lifeline, self._lifeline_w = self._ctx.Pipe(duplex=False)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _on_sighup(self, signum: int, frame: Any) -> None:
        self._sighup = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _start(self, slot: _Slot, *, bind_at_once: bool) -> None:
        self._cells[slot.index] = NOT_READY
        process = self._ctx.Process(
            target=self._worker, args=(slot.index, self._cells, bind_at_once, self._lifeline),
            name=f"authio-engine-worker-{slot.index}", daemon=False)
        if self._forward_sighup:
            # The child inherits the blocked mask through fork and exec: a SIGHUP forwarded
            # before its handler is installed stays pending instead of killing it (SIGHUP's
            # default action); the worker unblocks it once it handles it (engine.worker).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            try:
                process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        else:
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
        if self._forward_sighup:
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_sighup)
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
        if self._sighup:
            self._sighup = False
            self._tell_workers(signal.SIGHUP)
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

    def _tell_workers(self, signum: int) -> None:
        """Send ``signum`` to every running worker (SIGHUP: reload the TLS certificate)."""
        running = [s.process for s in self._slots if s.process is not None]
        log.info("engine supervisor forwarding signal %d to %d workers", signum, len(running))
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)  # type: ignore[arg-type]

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
    scheme = "https" if settings.tls_enabled else "http"
    print(f"authio engine: {count} workers on {scheme}://{settings.host}:{settings.engine_port} "
          f"(supervisor pid {os.getpid()})", flush=True)
    return Supervisor(count, forward_sighup=settings.tls_enabled).run()
