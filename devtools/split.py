"""``make run-split``: the production topology on one machine (issue 24).

Production runs the engine and the control plane as separate deployments behind one ingress
(DESIGN.md "Two services, one product"; ``deploy/``). ``python -m devtools split`` runs the same
on this machine, as child processes of its own:

* ``authio serve engine --workers N`` on ``--engine-port`` (default ``PORT`` + 1) and
  ``authio serve control-plane --generate-bootstrap-token`` on ``--control-plane-port``
  (default ``PORT`` + 2), both on 127.0.0.1;
* nginx on ``--host``:``--port`` (``SERVICE_HOST``, default 127.0.0.1, and ``PORT``, default
  8080: what ``make run`` listens on), with the routing of ``deploy/authio-routes.conf``, the
  file ``deploy/nginx.conf`` includes: the configuration written to ``<run-dir>/nginx/nginx.conf``
  defines the two upstreams with the addresses above and includes that file by its path, so
  the routing is written once (:func:`nginx_config`).

Before them, as ``make run`` does: PostgreSQL and Redis found or started
(:func:`devtools.services.ensure_services`: ``DATABASE_URL`` / ``REDIS_URL``, else the local
default ports, else private instances under ``--run-dir``), then ``authio migrate``. Both
services get the same ``SERVICE_BASE_URL``, the public address (``http://localhost:<PORT>``
unless set): access tokens carry it as ``iss`` and the engine refuses a token whose ``iss`` is
not its own. ``SERVICE_TRUSTED_PROXIES`` defaults to 127.0.0.1 (nginx), so the audit log records
the client's address from ``X-Forwarded-For``. TLS settings (``SERVICE_TLS_*``) are not passed
on: nginx proxies to the services over plain HTTP on loopback.

nginx is Debian's ``nginx``, installed with apt-get when missing (:func:`find_nginx`, as
``devtools`` installs PostgreSQL and Redis). It runs in the foreground (``daemon off``) with its
own prefix under ``<run-dir>/nginx/`` (configuration, pid file, access log, temporary
directories); its error log is this process's standard error. Nothing is written to
``/etc/nginx`` and the machine's nginx service is neither used nor touched.

Stopping: SIGINT (Ctrl-C) or SIGTERM stops all of it. nginx first (SIGQUIT: it finishes the
requests in flight), then the engine and the control plane (SIGTERM: each finishes its requests
in flight and closes its pools; the engine's supervisor stops its workers), each killed after
:data:`STOP_GRACE_SECONDS`; a second signal kills what is left at once. The children run in
process groups of their own, so a terminal's Ctrl-C reaches this process alone and each child is
told once, and each is sent SIGTERM by the kernel should this process die without stopping them
(``PR_SET_PDEATHSIG``). If a child exits by itself, the others are stopped and the exit status
is 1. Private PostgreSQL and Redis keep running, as after ``make run`` (``make stop``).

Command line (logs on standard error)::

    python -m devtools split [--port P] [--host H] [--engine-port E] [--control-plane-port C]
                             [--workers N] [--run-dir .run] [--hint]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from devtools.apt import apt_install
from devtools.errors import DevServicesError
from devtools.services import ensure_services, private_instances_hint

__all__ = ["ROUTES", "find_nginx", "main", "nginx_config"]

ROOT = Path(__file__).resolve().parents[1]
ROUTES = ROOT / "deploy" / "authio-routes.conf"
"""The ingress routing, included by ``deploy/nginx.conf`` and by :func:`nginx_config`."""
NGINX_DIR = "nginx"
"""nginx's prefix inside the run directory."""
STOP_GRACE_SECONDS = 30.0
"""How long each child has to stop after its signal before it is killed (the services finish
requests in flight for up to 15 s; the engine's supervisor waits for its workers)."""
READY_HEARTBEAT_SECONDS = 15.0
"""Longest silence while waiting for the services to be ready (an engine loads every store)."""
POLL_SECONDS = 0.1

_PR_SET_PDEATHSIG = 1
_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# nginx


def find_nginx(log: Log) -> str:
    """The path of the ``nginx`` binary (``PATH``, then ``/usr/sbin``), installing Debian's
    ``nginx`` with apt-get when missing. Raises :class:`DevServicesError` when it cannot be
    installed (not root, no apt-get: the message says what to install) or is still missing."""

    def found() -> str | None:
        return shutil.which("nginx", path=os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"]))

    binary = found()
    if binary is not None:
        return binary
    log("devtools: installing nginx with apt-get (once per machine)")
    apt_install(["nginx"], log=log, unable=(
        "nginx is missing and cannot be installed ({why}): install the package {wanted} "
        "(Debian: sudo apt-get install --no-install-recommends {wanted})"))
    binary = found()
    if binary is None:
        raise DevServicesError("installed nginx but found no nginx binary")
    return binary


def nginx_config(prefix: Path, *, listen: str, engine: str, control_plane: str,
                 routes: Path = ROUTES) -> str:
    """A whole nginx configuration (``nginx -c``) for the split: the upstreams
    ``authio_engine`` and ``authio_control_plane`` at ``engine`` and ``control_plane``
    (``host:port``), a server listening on ``listen`` (``host:port``) that includes ``routes``
    (``deploy/authio-routes.conf``) by its absolute path, and every file nginx writes under
    ``prefix``: pid file, access log, temporary directories. Run it with ``-g 'daemon off;'``.

    No temporary file is ever written (request bodies up to 4 MiB are buffered in memory and
    answers are not spooled to disk), so nginx's workers, which run as ``nobody`` when the
    master is root, need no access to ``prefix``."""
    temp = "\n".join(f"    {name}_temp_path {prefix / 'tmp' / name};" for name in _TEMP_PATHS)
    return f"""\
# Written by `python -m devtools split` (make run-split) at each start: edit
# {routes} (the routing, shared with deploy/nginx.conf) instead.
worker_processes auto;
pid {prefix / 'nginx.pid'};
error_log stderr warn;

events {{
    worker_connections 1024;
}}

http {{
    access_log {prefix / 'access.log'};
{temp}
    client_body_buffer_size 4m;
    proxy_max_temp_file_size 0;

    upstream authio_engine        {{ server {engine};        keepalive 64; }}
    upstream authio_control_plane {{ server {control_plane}; keepalive 32; }}

    server {{
        listen {listen};
        include {routes};
    }}
}}
"""


# --------------------------------------------------------------------------------------------
# Children


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when this process dies (Linux
    ``PR_SET_PDEATHSIG``), and exits at once if it already has."""

    def setup() -> None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return setup


@dataclass
class Child:
    """A started child: its name in log lines, its process (the leader of its own group), the
    signal that stops it gracefully, and when it was told to stop."""

    name: str
    process: subprocess.Popen[bytes]
    stop_signal: signal.Signals
    told_at: float | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def tell(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL to its whole process group (nginx's workers with their master)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


@dataclass
class Split:
    """The running topology; :meth:`run` is the whole command."""

    log: Log
    children: list[Child] = field(default_factory=list)
    signals: int = 0

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            self.log(f"devtools split: {signal.Signals(signum).name}: stopping nginx, the engine "
                     "and the control plane")
        else:
            self.log("devtools split: second signal: killing what is left")
            for child in self.children:
                child.kill()

    def start(self, name: str, argv: Sequence[str], env: dict[str, str],
              stop_signal: signal.Signals = signal.SIGTERM) -> Child:
        process = subprocess.Popen(list(argv), env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                   process_group=0, preexec_fn=_die_with_parent(os.getpid()))
        child = Child(name, process, stop_signal)
        self.children.append(child)
        return child

    def exited(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def wait_ready(self, what: dict[str, str]) -> bool:
        """Poll each ``{name: url}`` until it answers 200; False when a signal came or a child
        exited first. Says every :data:`READY_HEARTBEAT_SECONDS` what it still waits for."""
        pending = dict(what)
        began = said = time.monotonic()
        while pending:
            if self.signals or self.exited() is not None:
                return False
            for name, url in list(pending.items()):
                if _answers_200(url):
                    del pending[name]
            now = time.monotonic()
            if pending and now - said >= READY_HEARTBEAT_SECONDS:
                said = now
                self.log(f"devtools split: waiting for {', '.join(pending)} to be ready "
                         f"({now - began:.0f} s)")
            if pending:
                time.sleep(POLL_SECONDS)
        return True

    def stop(self) -> None:
        """nginx first, then the services; each killed after :data:`STOP_GRACE_SECONDS`."""
        nginx = [c for c in self.children if c.name == "nginx"]
        services = [c for c in self.children if c.name != "nginx"]
        for group in (nginx, services):
            for child in group:
                if child.alive():
                    child.tell(child.stop_signal)
                    child.told_at = time.monotonic()
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while any(c.alive() for c in group) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            for child in group:
                if child.alive():
                    self.log(f"devtools split: {child.name} did not stop within "
                             f"{STOP_GRACE_SECONDS:g} s: killed")
                    child.kill()
                child.process.wait()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _authio() -> str:
    """The ``authio`` command of this interpreter's environment (the virtualenv's)."""
    beside = Path(sys.executable).with_name("authio")
    if beside.is_file():
        return str(beside)
    found = shutil.which("authio")
    if found is None:
        raise DevServicesError("no `authio` command beside this Python or on PATH: run "
                               "`make run-split`, or .venv/bin/python -m devtools split")
    return found


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# --------------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools split",
        description="The production topology on one machine: the engine's workers and the "
                    "control plane as separate processes behind nginx (make run-split).")
    port = int(os.environ.get("PORT") or 8080)
    parser.add_argument("--port", type=int, default=port,
                        help="where nginx listens (default: PORT, else 8080)")
    parser.add_argument("--host", default=os.environ.get("SERVICE_HOST") or "127.0.0.1",
                        help="the address nginx listens on (default: SERVICE_HOST, else "
                             "127.0.0.1)")
    parser.add_argument("--engine-port", type=int,
                        help="the engine's port on 127.0.0.1 (default: --port + 1)")
    parser.add_argument("--control-plane-port", type=int,
                        help="the control plane's port on 127.0.0.1 (default: --port + 2)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="engine processes (default: SERVICE_ENGINE_WORKERS, else one per "
                             "core)")
    parser.add_argument("--run-dir", type=Path, default=Path(".run"),
                        help="private PostgreSQL, Redis and nginx's files (default: .run)")
    parser.add_argument("--hint", action="store_true",
                        help="say where the private PostgreSQL and Redis in use live")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    engine_port = args.engine_port or args.port + 1
    control_port = args.control_plane_port or args.port + 2
    if args.workers is not None and args.workers < 1:
        _stderr(f"devtools split: error: --workers must be 1 or more, not {args.workers}")
        return 2
    split = Split(_stderr)
    try:
        return _run(args, split, engine_port, control_port)
    except DevServicesError as exc:
        _stderr(f"devtools split: error: {exc}")
        split.stop()
        return 1
    except KeyboardInterrupt:  # before the handlers are in place (ensure, migrate)
        split.stop()
        return 130


def _run(args: argparse.Namespace, split: Split, engine_port: int, control_port: int) -> int:
    log = split.log
    run_dir = args.run_dir.absolute()
    urls = ensure_services(run_dir=run_dir, database_url=os.environ.get("DATABASE_URL"),
                           redis_url=os.environ.get("REDIS_URL"), log=log)
    if args.hint and (hint := private_instances_hint(run_dir)) is not None:
        log(hint)
    nginx = find_nginx(log)
    taken = [f"{host}:{port}" for host, port in ((args.host, args.port),
                                                ("127.0.0.1", engine_port),
                                                ("127.0.0.1", control_port))
             if not _port_free(host, port)]
    if len(taken) != len(set(taken)) or len({args.port, engine_port, control_port}) < 3:
        raise DevServicesError("the public, engine and control-plane ports must differ")
    if taken:
        raise DevServicesError(f"port(s) in use: {', '.join(taken)} (choose others with "
                               "PORT=..., --engine-port, --control-plane-port)")
    authio = _authio()
    public = f"http://{_url_host(args.host)}:{args.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_TLS_")}
    env.update(DATABASE_URL=urls.database_url, REDIS_URL=urls.redis_url,
               SERVICE_HOST="127.0.0.1")
    env.setdefault("SERVICE_BASE_URL", f"http://localhost:{args.port}")
    env.setdefault("SERVICE_TRUSTED_PROXIES", "127.0.0.1")
    env.setdefault("OTEL_EXPORTER", "none")

    log("devtools split: authio migrate")
    migrated = subprocess.run([authio, "migrate"], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                              check=False)
    if migrated.returncode != 0:
        raise DevServicesError(f"authio migrate failed (exit status {migrated.returncode})")

    handlers = {s: signal.signal(s, split.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        workers = ["--workers", str(args.workers)] if args.workers is not None else []
        split.start("engine", [authio, "serve", "engine", *workers],
                    {**env, "SERVICE_ENGINE_PORT": str(engine_port)})
        split.start("control plane", [authio, "serve", "control-plane",
                                      "--generate-bootstrap-token"],
                    {**env, "PORT": str(control_port)})
        status = 0
        if split.wait_ready({"the engine": f"http://127.0.0.1:{engine_port}/readyz",
                             "the control plane": f"http://127.0.0.1:{control_port}/readyz"}):
            prefix = run_dir / NGINX_DIR
            for name in _TEMP_PATHS:
                (prefix / "tmp" / name).mkdir(parents=True, exist_ok=True)
            conf = prefix / "nginx.conf"
            conf.write_text(nginx_config(
                prefix, listen=f"{_url_host(args.host)}:{args.port}",
                engine=f"127.0.0.1:{engine_port}", control_plane=f"127.0.0.1:{control_port}"))
            split.start("nginx", [nginx, "-p", str(prefix), "-c", str(conf), "-e", "stderr",
                                  "-g", "daemon off;"], env, stop_signal=signal.SIGQUIT)
            here = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
            if split.wait_ready({"nginx": f"http://{_url_host(here)}:{args.port}/readyz"}):
                log(f"devtools split: authio on {public} (nginx, {ROUTES.relative_to(ROOT)}): "
                    f"the engine on 127.0.0.1:{engine_port}, the control plane on "
                    f"127.0.0.1:{control_port}; SERVICE_BASE_URL={env['SERVICE_BASE_URL']}. "
                    "Ctrl-C stops all of it")
        while not split.signals:
            gone = split.exited()
            if gone is not None:
                log(f"devtools split: {gone.name} exited with status {gone.process.returncode}; "
                    "stopping the rest")
                status = 1
                break
            time.sleep(POLL_SECONDS)
        split.stop()
        log("devtools split: stopped")
        return status
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
