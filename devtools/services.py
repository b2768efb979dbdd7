"""Start what we need: PostgreSQL and Redis for ``make run`` and ``make test``.

The rule (DESIGN.md): ``DATABASE_URL`` and ``REDIS_URL`` point at real servers. When unset, the
run and test commands use PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 if they
answer, and otherwise start private ones from the machine's ``postgres`` and ``redis-server``
binaries under ``.run/`` (installing the Debian packages ``postgresql`` and ``redis-server`` when
missing), so a fresh machine needs no manual step.

For each service, :func:`ensure_services` picks the first that applies:

1. A configured URL (``database_url`` / ``redis_url``) is probed for up to ``connect_timeout``
   seconds and returned unchanged; if it does not answer, :class:`DevServicesError` is raised.
   Nothing is created on a configured server.
2. The default local port (``pg_port`` / ``redis_port`` on 127.0.0.1), if it answers *and*
   accepts us: PostgreSQL as user ``postgres`` without a password (database ``authio`` is created
   when missing), Redis without a password. A server that answers but refuses us (a fresh Debian
   cluster asks for a password over TCP) is skipped with a log line, not treated as an error.
3. A private instance under ``run_dir`` on ``private_pg_port`` / ``private_redis_port``:

   * ``run_dir/pg``: a PostgreSQL cluster (``initdb --auth=trust -U postgres --encoding=UTF8``,
     once), listening on 127.0.0.1 only, no Unix socket, log in ``run_dir/pg.log``; database
     ``authio`` is created when missing.
   * ``run_dir/redis``: a daemonized ``redis-server`` bound to 127.0.0.1 with persistence off,
     pid file ``redis.pid``, log ``redis.log`` and the port it listens on in ``port``.

   An instance that already runs is reused (no second initdb, no restart). Missing binaries are
   installed with ``apt-get`` when running as root; otherwise the error says what to install.
   ``force_private=True`` skips steps 1 and 2 (this is how the test proves the fresh-machine path).

Where the private cluster lives, and as whom it runs. PostgreSQL refuses to run as root, and
devtools never changes the permissions of a directory it did not create (the project may sit in
a home directory closed to other users, such as ``/root``):

* Not root: the server runs as the calling user, with its data in ``run_dir/pg`` and its log in
  ``run_dir/pg.log``.
* Root: the server runs as an unprivileged user: the owner of an existing cluster, else the
  ``postgres`` system user, else a system user ``authio`` created with ``useradd``. That user
  may not be able to reach ``run_dir``, so the cluster gets a home of its own that it can reach:
  ``/var/lib/authio-dev/<key>/`` (:data:`STATE_DIR`; ``<key>``: 16 hex digits of the SHA-256 of
  ``run_dir``), owned by that user with mode ``0700``, holding ``pg/`` (the data directory),
  ``pg.log`` and ``run-dir`` (the path of the run directory it belongs to). ``run_dir/pg`` and
  ``run_dir/pg.log`` are symbolic links to them; all commands address the cluster by its real
  path. A run directory in the temporary directory (a throwaway clone, a test's) gets its home
  in ``/tmp/authio-dev`` (:data:`TEMP_STATE_DIR`) instead, so that its cluster is as temporary
  as it is. Either state directory is created root-owned ``0755``, and refused if it is not a
  directory that only root may write to.

  A cluster made inside ``run_dir`` by an earlier version stays there when its owner can reach
  it as things stand, and is moved to its home otherwise. A home whose run directory no longer
  links to it (the run directory was deleted) is deleted when no server runs from it, by any
  later call that needs a private cluster as root; a new run directory at the path of a deleted
  one never reuses the old cluster (the local KMS key that went with it is gone).
  :func:`remove_private` deletes a run directory's cluster, home included.

Redis runs as the calling user, in ``run_dir/redis``.

Private instances keep running after the call so later runs reuse them; :func:`stop_private`
stops them. Concurrent calls on the same ``run_dir`` are serialized with a lock file
(``run_dir/.lock``).

Command line (logs go to stderr, only shell code goes to stdout)::

    python -m devtools ensure [--force-private] [--hint] [--run-dir .run]   # prints exports
    python -m devtools exec [--force-private] [--hint] [--run-dir .run] -- CMD [ARG...]
    python -m devtools stop [--run-dir .run]      # make stop
    python -m devtools remove [--run-dir .run]    # stop, and delete their data (make clean-run)
    python -m devtools hint [--run-dir .run]      # where the running private instances live

``ensure`` prints ``export DATABASE_URL=...`` and ``export REDIS_URL=...``; ``exec`` sets both in
the environment and replaces itself with ``CMD``. Both read ``DATABASE_URL`` / ``REDIS_URL`` from
the environment (an empty value counts as unset), and say in one line which PostgreSQL and which
Redis are in use (a configured URL, the local default port or a private instance); with
``--hint`` a second line says where the private instances in use live and how to stop them,
which ``hint`` says on its own (``make test`` runs it after the tests). ``stop``, ``remove`` and
``hint`` import nothing outside the standard library, so any Python 3.11 runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from devtools.apt import apt_install
from devtools.errors import DevServicesError

__all__ = [
    "DATABASE_NAME",
    "DevServicesError",
    "ServiceUrls",
    "ensure_services",
    "main",
    "private_instances_hint",
    "remove_private",
    "restart_private_pg",
    "stop_private",
]

DATABASE_NAME = "authio"
"""Database created on the default local server and on the private cluster."""

PG_SUPERUSER = "postgres"
FALLBACK_SYSTEM_USER = "authio"
"""System user created (as root) to run the private cluster when ``postgres`` does not exist."""

LOCALHOST = "127.0.0.1"
PG_DIR, PG_INIT_DIR, PG_LOG = "pg", "pg.init", "pg.log"
REDIS_DIR, REDIS_PIDFILE, REDIS_LOGFILE, REDIS_PORTFILE = "redis", "redis.pid", "redis.log", "port"
LOCK_FILE = ".lock"
STATE_DIR = Path("/var/lib/authio-dev")
"""As root: where private clusters live that their service user could not reach in the run
directory (one home per run directory, owned by that user; see the module docstring)."""
TEMP_STATE_DIR = Path("/tmp/authio-dev")
""":data:`STATE_DIR` for run directories in the temporary directory: their clusters are as
temporary as they are, and go wherever the run directories' own leftovers go."""
STATE_MARKER = "run-dir"
PG_MARKER = "# --- authio devtools: private development cluster ---"

_T = TypeVar("_T")
Log = Callable[[str], None]


@dataclass(frozen=True)
class ServiceUrls:
    """What :func:`ensure_services` settled on.

    ``database_url`` is a ``postgresql://`` URL, ``redis_url`` a ``redis://`` URL; ``started``
    names the private services this very call started (``"postgres"``, ``"redis"``), so it is
    empty when everything was configured, already answering, or reused.
    """

    database_url: str
    redis_url: str
    started: tuple[str, ...] = ()


@dataclass(frozen=True)
class _User:
    """The account the private PostgreSQL runs as (``None`` in place of it: the caller)."""

    name: str
    uid: int
    gid: int
    groups: frozenset[int]


# --------------------------------------------------------------------------------------------
# Public API


def ensure_services(
    *,
    run_dir: Path,
    database_url: str | None,
    redis_url: str | None,
    pg_port: int = 5432,
    redis_port: int = 6379,
    force_private: bool = False,
    private_pg_port: int = 55432,
    private_redis_port: int = 56379,
    log: Log = print,
    connect_timeout: float = 10.0,
) -> ServiceUrls:
    """Make sure a PostgreSQL and a Redis answer; return their URLs (see the module docstring).

    ``run_dir`` is created when missing (only if a private instance is needed). ``log`` receives
    a line for each thing done or refused (a private server started, a local one skipped, a
    package installed), then one line saying which PostgreSQL and which Redis are in use.
    ``connect_timeout`` bounds the probe of a configured URL.

    Raises :class:`DevServicesError` when a configured URL does not answer, when a private
    instance cannot be installed or started (the message includes the tail of its log), or when
    a private port is taken by a process that is not ours.
    """
    run_dir = Path(run_dir).absolute()
    database_url = database_url or None
    redis_url = redis_url or None
    started: list[str] = []

    # Decide what can be had without starting anything.
    db: str | None = None
    rd: str | None = None
    db_what = rd_what = ""
    if force_private:
        log("devtools: --force-private: using private instances only")
    else:
        if database_url is not None:
            error = _pg_check(database_url, wait=connect_timeout)
            if error is not None:
                raise DevServicesError(
                    f"DATABASE_URL={_redact(database_url)} does not answer within {connect_timeout:g} s: {error}"
                )
            db, db_what = database_url, f"PostgreSQL from DATABASE_URL ({_redact(database_url)})"
        else:
            db = _try_local_pg(pg_port, log)
            db_what = f"the local PostgreSQL on the default port ({db})"
        if redis_url is not None:
            error = _redis_check(redis_url, wait=connect_timeout)
            if error is not None:
                raise DevServicesError(
                    f"REDIS_URL={_redact(redis_url)} does not answer within {connect_timeout:g} s: {error}"
                )
            rd, rd_what = redis_url, f"Redis from REDIS_URL ({_redact(redis_url)})"
        else:
            rd = _try_local_redis(redis_port, log)
            rd_what = f"the local Redis on the default port ({rd})"

    if db is None or rd is None:
        _make_dir(run_dir)
        with _locked(run_dir):
            _install_missing(need_pg=db is None, need_redis=rd is None, run_dir=run_dir, log=log)
            if db is None:
                port, did_start = _ensure_private_pg(run_dir, private_pg_port, log)
                db = _pg_url(port, DATABASE_NAME)
                db_what = f"the private PostgreSQL of {run_dir} ({db}, {'started' if did_start else 'already running'})"
                if did_start:
                    started.append("postgres")
            if rd is None:
                port, did_start = _ensure_private_redis(run_dir, private_redis_port, log)
                rd = _redis_url(port)
                rd_what = f"the private Redis of {run_dir} ({rd}, {'started' if did_start else 'already running'})"
                if did_start:
                    started.append("redis")
    log(f"devtools: using {db_what} and {rd_what}")
    return ServiceUrls(database_url=db, redis_url=rd, started=tuple(started))


def private_instances_hint(run_dir: Path) -> str | None:
    """One line saying which private instances of ``run_dir`` are running, where their data
    lives and how to stop them; ``None`` when none is running."""
    run_dir = Path(run_dir).absolute()
    running: list[str] = []
    data_dir = (run_dir / PG_DIR).resolve()
    postmaster = _postmaster_pid_file(data_dir)
    if postmaster is not None and _pid_alive(postmaster[0]):
        where = "" if data_dir.is_relative_to(run_dir) else f" (data in {data_dir})"
        running.append(f"PostgreSQL on {LOCALHOST}:{postmaster[1]}{where}")
    redis_running = _private_redis_running(run_dir / REDIS_DIR)
    if redis_running is not None:
        running.append(f"Redis on {LOCALHOST}:{redis_running[1]}")
    if not running:
        return None
    return (
        f"devtools: private instances keep running in {run_dir}: {', '.join(running)}. "
        "`make stop` stops them; `make clean-run` deletes them with their data and the local KMS key"
    )


def stop_private(run_dir: Path, *, log: Log = print) -> None:
    """Stop the private PostgreSQL and Redis started under ``run_dir``, if they run.

    PostgreSQL: ``pg_ctl stop -m fast`` (or SIGINT to the postmaster when no ``pg_ctl`` is
    found); Redis: ``SHUTDOWN NOSAVE`` (SIGTERM if it does not exit within 10 s). The data is
    kept; the next :func:`ensure_services` starts them again without a new initdb. Does nothing
    for services that are not running. Raises :class:`DevServicesError` if a service does not
    stop.
    """
    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        return
    with _locked(run_dir):
        _stop_private_pg(run_dir, log)
        _stop_private_redis(run_dir, log)


def restart_private_pg(run_dir: Path, *, mode: str = "fast", log: Log = print) -> None:
    """Restart the private PostgreSQL of ``run_dir`` at once (``pg_ctl restart -m mode``), for
    tests of what a restart does to clients: ``fast`` (in-flight transactions are rolled back,
    sessions are ended with an error) or ``immediate`` (every process is killed, as in a crash;
    the server recovers from its WAL when it starts). Returns once it accepts connections again,
    on the same port. Raises :class:`DevServicesError` when it is not running or does not come
    back."""
    if mode not in ("smart", "fast", "immediate"):
        raise ValueError(f"unknown shutdown mode {mode!r}")
    run_dir = Path(run_dir).absolute()
    data_dir = (run_dir / PG_DIR).resolve()
    running = _postmaster_pid_file(data_dir)
    bindir = _find_pg_bindir(data_dir)
    if running is None or not _pid_alive(running[0]) or bindir is None:
        raise DevServicesError(f"no private PostgreSQL runs in {run_dir}")
    user = _pg_service_user(data_dir, log)
    log_file = (run_dir / PG_LOG).resolve()
    with _locked(run_dir):
        try:
            _run([str(bindir / "pg_ctl"), "restart", "-D", str(data_dir), "-m", mode, "-w",
                  "-t", "60", "-l", str(log_file)], user=user, cwd=data_dir.parent, timeout=90)
        except DevServicesError as exc:
            raise DevServicesError(f"{exc}\n{_tail(log_file)}") from exc
    log(f"devtools: postgres: restarted private instance on {LOCALHOST}:{running[1]} (-m {mode})")


def remove_private(run_dir: Path, *, log: Log = print) -> None:
    """Stop the private PostgreSQL and Redis of ``run_dir`` and delete their data: the cluster
    (also its home in a state directory, as root), its log and the Redis directory. Other files
    in ``run_dir`` stay. Does nothing when ``run_dir`` does not exist."""
    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        return
    with _locked(run_dir):
        _stop_private_pg(run_dir, log)
        _stop_private_redis(run_dir, log)
        link = run_dir / PG_DIR
        home = _state_home(link)
        if home is not None and home.exists():
            with _locked_state(home.parent):
                shutil.rmtree(home)
            log(f"devtools: postgres: deleted {home}")
        for name in (PG_DIR, PG_LOG, PG_INIT_DIR, REDIS_DIR):
            path = run_dir / name
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
    log(f"devtools: deleted the private PostgreSQL and Redis data of {run_dir}")


# --------------------------------------------------------------------------------------------
# Probing


def _tcp_open(port: int, host: str = LOCALHOST, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _run_async(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if text:
        return f"{type(exc).__name__}: {text[0]}"
    return f"{type(exc).__name__}: no reply" if isinstance(exc, TimeoutError) else repr(exc)


def _retryable(exc: BaseException, starting_up: type[BaseException]) -> bool:
    """Whether ``exc`` means "not there yet": a refused connection (anywhere in its chain) or a
    server that is still starting (``starting_up``). Timeouts and protocol errors are final."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is short; the bound guards against cycles
        if seen is None:
            break
        if isinstance(seen, (ConnectionRefusedError, starting_up)):
            return True
        if "connection refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _pg_attempt(dsn: str, step_limit: float, create_db: str | None) -> None:
    """One connection: ``SELECT 1``, then create ``create_db`` if given and missing; each step
    is bounded by ``step_limit`` seconds."""
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=step_limit)
    try:
        await conn.fetchval("SELECT 1", timeout=step_limit)
        if create_db is not None:
            found = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", create_db, timeout=step_limit)
            if found is None:
                with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                    await conn.execute(f'CREATE DATABASE "{create_db}"', timeout=step_limit)
    finally:
        await conn.close(timeout=step_limit)


def _pg_check(dsn: str, *, wait: float, create_db: str | None = None) -> str | None:
    """Connect to ``dsn`` and ``SELECT 1`` (creating ``create_db`` if given and missing).

    Retries refused connections and a server that is starting up for ``wait`` seconds; gives up
    at once on anything else (bad password, unknown database, malformed URL). Returns ``None``
    on success, else a one-line reason.
    """
    import asyncpg

    deadline = time.monotonic() + wait
    while True:
        remaining = deadline - time.monotonic()
        try:
            _run_async(_pg_attempt(dsn, max(1.0, min(remaining, 5.0)), create_db))
            return None
        except Exception as exc:
            if not _retryable(exc, asyncpg.CannotConnectNowError):
                return _describe(exc)
            error = _describe(exc)
        if time.monotonic() + 0.25 >= deadline:
            return error
        time.sleep(0.25)


def _redis_check(url: str, *, wait: float) -> str | None:
    """``PING`` the Redis at ``url``, retrying refused connections and loading for ``wait`` s.

    Returns ``None`` on success, else a one-line reason (authentication errors are final).
    """
    import redis

    deadline = time.monotonic() + wait
    while True:
        remaining = deadline - time.monotonic()
        per_try = max(1.0, min(remaining, 5.0))
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=per_try, socket_timeout=per_try)
        except Exception as exc:
            return _describe(exc)
        try:
            client.ping()
            return None
        except Exception as exc:
            if isinstance(exc, redis.exceptions.AuthenticationError) or not _retryable(
                exc, redis.exceptions.BusyLoadingError
            ):
                return _describe(exc)
            error = _describe(exc)
        finally:
            client.close()
        if time.monotonic() + 0.25 >= deadline:
            return error
        time.sleep(0.25)


def _pg_url(port: int, database: str) -> str:
    return f"postgresql://{PG_SUPERUSER}@{LOCALHOST}:{port}/{database}"


def _redis_url(port: int) -> str:
    return f"redis://{LOCALHOST}:{port}/0"


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
    except ValueError:
        return "<unparsable URL>"


def _try_local_pg(port: int, log: Log) -> str | None:
    """The default local PostgreSQL URL if it answers and lets ``postgres`` in, else ``None``."""
    if not _tcp_open(port):
        log(f"devtools: postgres: nothing answers on {LOCALHOST}:{port}")
        return None
    error = _pg_check(_pg_url(port, "postgres"), wait=3.0, create_db=DATABASE_NAME)
    if error is not None:
        log(
            f"devtools: postgres: {LOCALHOST}:{port} answers but is not usable "
            f"(user {PG_SUPERUSER}, no password): {error}"
        )
        return None
    return _pg_url(port, DATABASE_NAME)


def _try_local_redis(port: int, log: Log) -> str | None:
    """The default local Redis URL if it answers ``PING`` without a password, else ``None``."""
    if not _tcp_open(port):
        log(f"devtools: redis: nothing answers on {LOCALHOST}:{port}")
        return None
    url = _redis_url(port)
    error = _redis_check(url, wait=3.0)
    if error is not None:
        log(f"devtools: redis: {LOCALHOST}:{port} answers but is not usable: {error}")
        return None
    return url


# --------------------------------------------------------------------------------------------
# Processes, users, files


def _tool_env() -> dict[str, str]:
    """The environment for PostgreSQL tools: ours minus ``PG*`` variables, in the C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    return env


def _run(
    cmd: Sequence[str],
    *,
    user: _User | None = None,
    cwd: Path | None = None,
    timeout: float = 120.0,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``cmd`` (as ``user`` when given), returning ``(exit status, stdout+stderr)``.

    Output goes to a temporary file rather than a pipe, so a daemon that inherits it cannot
    make us wait. Raises :class:`DevServicesError` on a non-zero exit when ``check``.
    """
    extra: dict[str, Any] = {}
    if user is not None:
        extra = {"user": user.uid, "group": user.gid, "extra_groups": sorted(user.groups)}
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.run(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env if env is not None else _tool_env(),
                timeout=timeout,
                check=False,
                **extra,
            )
        except subprocess.TimeoutExpired as exc:
            raise DevServicesError(f"{shlex.join(cmd)} did not finish within {timeout:g} s") from exc
        except OSError as exc:
            raise DevServicesError(f"cannot run {shlex.join(cmd)}: {exc}") from exc
        out.seek(0)
        text = out.read().decode(errors="replace")
    if check and proc.returncode != 0:
        raise DevServicesError(f"{shlex.join(cmd)} failed with exit status {proc.returncode}:\n{text.rstrip()}")
    return proc.returncode, text


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n" + "\n".join(text.rstrip().splitlines()[-lines:])


def _make_dir(path: Path, mode: int = 0o755) -> None:
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir/.lock`` (serializes concurrent ``make`` runs)."""
    with open(run_dir / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _user_from_pw(entry: pwd.struct_passwd) -> _User:
    import grp

    groups = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    return _User(entry.pw_name, entry.pw_uid, entry.pw_gid, frozenset(groups))


def _pg_service_user(data_dir: Path, log: Log) -> _User | None:
    """The unprivileged account to run PostgreSQL as, or ``None`` when not running as root.

    Prefers the owner of an existing data directory, then ``postgres``, then ``authio``
    (created with ``useradd --system`` if missing).
    """
    if os.geteuid() != 0:
        return None
    if data_dir.exists():
        owner = data_dir.stat().st_uid
        if owner != 0:
            with contextlib.suppress(KeyError):
                return _user_from_pw(pwd.getpwuid(owner))
    for name in (PG_SUPERUSER, FALLBACK_SYSTEM_USER):
        with contextlib.suppress(KeyError):
            return _user_from_pw(pwd.getpwnam(name))
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    log(f"devtools: creating system user {FALLBACK_SYSTEM_USER!r} to run PostgreSQL (not root)")
    _run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            FALLBACK_SYSTEM_USER,
        ],
        env=dict(os.environ),
    )
    return _user_from_pw(pwd.getpwnam(FALLBACK_SYSTEM_USER))


def _give_to(path: Path, user: _User | None) -> None:
    """Make ``user`` own ``path`` (recursively for directories that still belong to root)."""
    if user is None:
        return
    if path.stat().st_uid != user.uid:
        os.chown(path, user.uid, user.gid)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), user.uid, user.gid, follow_symlinks=False)


def _reachable(path: Path, user: _User) -> bool:
    """Whether ``user`` may search (``x``) every directory from ``/`` down to ``path``, as the
    modes and owners stand (only the one permission class that applies to ``user`` counts)."""
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in user.groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _state_dir_for(run_dir: Path) -> Path:
    """:data:`TEMP_STATE_DIR` for a run directory in the temporary directory, else
    :data:`STATE_DIR`."""
    real = run_dir.resolve()
    temporary = {Path("/tmp").resolve(), Path(tempfile.gettempdir()).resolve()}
    return TEMP_STATE_DIR if any(real.is_relative_to(t) for t in temporary) else STATE_DIR


@contextlib.contextmanager
def _locked_state(state_dir: Path) -> Iterator[None]:
    """Hold the lock of ``state_dir`` (creating it, root-owned ``0755``, when missing)."""
    try:
        try:
            state_dir.mkdir()
            state_dir.chmod(0o755)  # ours: whatever the umask, the service user must pass
        except FileExistsError:
            pass
        st = state_dir.lstat()
    except OSError as exc:
        raise DevServicesError(f"cannot create {state_dir} for the private PostgreSQL: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise DevServicesError(
            f"{state_dir} must be a directory owned by root and writable by root only; it is not, so "
            "devtools will not keep PostgreSQL clusters there: remove it or fix its owner and mode"
        )
    with _locked(state_dir):
        yield


def _state_home(link: Path) -> Path | None:
    """The cluster home in a state directory that ``run_dir/pg`` links to, if it is such a link."""
    if not link.is_symlink():
        return None
    target = Path(os.readlink(link))
    home = target.parent
    if (
        target.name != PG_DIR
        or home.parent not in (STATE_DIR, TEMP_STATE_DIR)
        or not re.fullmatch(r"[0-9a-f]{16}", home.name)
    ):
        return None
    return home


@dataclass(frozen=True)
class _PgPlace:
    """Where a private cluster lives: ``home`` holds the data directory and the server log."""

    home: Path

    @property
    def data_dir(self) -> Path:
        return self.home / PG_DIR

    @property
    def log_file(self) -> Path:
        return self.home / PG_LOG


def _pg_place(run_dir: Path, user: _User | None, log: Log) -> _PgPlace:
    """Where the private cluster of ``run_dir`` lives, making its home if needed (see the module
    docstring): ``run_dir`` itself when ``user`` is the caller (``None``) or can reach it as
    things stand, else a home of its own in a state directory, linked from ``run_dir``."""
    link = run_dir / PG_DIR
    if user is None:
        return _PgPlace(run_dir)
    state_dir = _state_dir_for(run_dir)
    with _locked_state(state_dir):
        _collect_orphans(state_dir, log)
    home = _state_home(link)
    if home is not None and home.is_dir():
        marker = home / STATE_MARKER
        with contextlib.suppress(OSError):
            if marker.read_text().strip() == str(run_dir):
                return _PgPlace(home)
        with _locked_state(home.parent):  # the project moved: its home follows it
            marker.write_text(f"{run_dir}\n")
        return _PgPlace(home)
    if link.is_symlink():  # dangling (its home was deleted) or not ours: start afresh
        link.unlink()
    if link.exists() and _reachable(link, user):
        return _PgPlace(run_dir)  # a cluster made in run_dir, reachable as it is
    with _locked_state(state_dir):
        home = state_dir / hashlib.sha256(str(run_dir).encode()).hexdigest()[:16]
        if home.exists():  # left by an earlier run dir of this path, deleted since: never reused
            _stop_pg_cluster(home / PG_DIR, log)
            shutil.rmtree(home)
        home.mkdir(mode=0o700)
        os.chown(home, user.uid, user.gid)
        if not _reachable(home, user):
            shutil.rmtree(home)
            raise DevServicesError(
                f"user {user.name!r} cannot reach {home} (a directory above it is closed to it), and devtools "
                "changes no permissions there: set DATABASE_URL to a running PostgreSQL instead"
            )
        (home / STATE_MARKER).write_text(f"{run_dir}\n")
        if link.exists():  # an older cluster inside run_dir that user cannot reach: move it out
            log(f"devtools: postgres: moving {link} to {home / PG_DIR}, where user {user.name!r} can reach it")
            shutil.move(link, home / PG_DIR)
            if (run_dir / PG_LOG).exists() and not (run_dir / PG_LOG).is_symlink():
                shutil.move(run_dir / PG_LOG, home / PG_LOG)
        link.symlink_to(home / PG_DIR)
    (run_dir / PG_LOG).unlink(missing_ok=True)
    (run_dir / PG_LOG).symlink_to(home / PG_LOG)
    return _PgPlace(home)


def _collect_orphans(state_dir: Path, log: Log) -> None:
    """Delete the cluster homes in ``state_dir`` that their run directory no longer links to
    (it was deleted, or moved and not used since) and whose server is not running. The caller
    holds :func:`_locked_state`."""
    for home in state_dir.iterdir():
        if not re.fullmatch(r"[0-9a-f]{16}", home.name) or home.is_symlink() or not home.is_dir():
            continue
        try:
            owner = Path((home / STATE_MARKER).read_text().strip())
        except OSError:
            continue
        if _state_home(owner / PG_DIR) == home:
            continue
        running = _postmaster_pid_file(home / PG_DIR)
        if running is not None and _pid_alive(running[0]):
            continue
        shutil.rmtree(home, ignore_errors=True)
        log(f"devtools: postgres: deleted {home}, the private cluster of {owner}, which is gone")


# --------------------------------------------------------------------------------------------
# Binaries and installation


def _pg_candidate_bindirs() -> list[Path]:
    """Directories holding ``postgres``, ``initdb`` and ``pg_ctl``: ``$PATH`` first, then
    ``/usr/lib/postgresql/*/bin`` from the highest major version down."""
    found: list[Path] = []
    on_path = shutil.which("postgres")
    if on_path is not None:
        found.append(Path(on_path).resolve().parent)
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if re.fullmatch(r"\d+(\.\d+)?", p.name)]
        for version in sorted(versions, key=lambda p: [int(x) for x in p.name.split(".")], reverse=True):
            found.append(version / "bin")
    result: list[Path] = []
    for bindir in found:
        tools = ("postgres", "initdb", "pg_ctl")
        complete = all(os.access(bindir / tool, os.X_OK) for tool in tools)
        if complete and bindir not in result:
            result.append(bindir)
    return result


def _pg_major(bindir: Path) -> str | None:
    _, out = _run([str(bindir / "postgres"), "--version"], check=False, timeout=30)
    match = re.search(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?", out)
    if match is None:
        return None
    major = int(match.group(1))
    return str(major) if major >= 10 else f"{major}.{match.group(2)}"


def _find_pg_bindir(data_dir: Path | None) -> Path | None:
    """The PostgreSQL binaries to use: those matching ``data_dir/PG_VERSION`` when it exists."""
    candidates = _pg_candidate_bindirs()
    want = None
    if data_dir is not None and (data_dir / "PG_VERSION").is_file():
        want = (data_dir / "PG_VERSION").read_text().strip()
    if want is None:
        return candidates[0] if candidates else None
    for bindir in candidates:
        if _pg_major(bindir) == want:
            return bindir
    return None


def _install_missing(*, need_pg: bool, need_redis: bool, run_dir: Path, log: Log) -> None:
    """Install the Debian packages for the servers about to be started when their binaries are
    missing (one ``apt-get`` run). Raises :class:`DevServicesError` when that is not possible."""
    packages: list[str] = []
    if need_pg and _find_pg_bindir(run_dir / PG_DIR) is None:
        if (run_dir / PG_DIR / "PG_VERSION").is_file() and _pg_candidate_bindirs():
            version = (run_dir / PG_DIR / "PG_VERSION").read_text().strip()
            raise DevServicesError(
                f"{run_dir / PG_DIR} was created by PostgreSQL {version}, whose binaries are "
                f"not installed; install postgresql-{version} or delete {run_dir / PG_DIR}"
            )
        packages.append("postgresql")
    if need_redis and shutil.which("redis-server") is None:
        packages.append("redis-server")
    if not packages:
        return
    log(f"devtools: installing {' '.join(packages)} with apt-get (once per machine)")
    apt_install(packages, log=log, unable=(
        "server binaries missing and cannot install them ({why}): install the packages "
        "{wanted} (Debian: sudo apt-get install --no-install-recommends {wanted}), or set DATABASE_URL / REDIS_URL "
        "to running servers"
    ))
    if need_pg and "postgresql" in packages and not _pg_candidate_bindirs():
        raise DevServicesError("installed postgresql but found no postgres/initdb/pg_ctl binaries")
    if need_redis and "redis-server" in packages and shutil.which("redis-server") is None:
        raise DevServicesError("installed redis-server but found no redis-server binary")


# --------------------------------------------------------------------------------------------
# Private PostgreSQL


def _postmaster_pid_file(data_dir: Path) -> tuple[int, int] | None:
    """``(pid, port)`` from ``postmaster.pid``, or ``None`` if absent or unreadable."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        return int(lines[0]), int(lines[3])
    except (OSError, IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _init_pg_cluster(place: _PgPlace, bindir: Path, user: _User | None, log: Log) -> None:
    """``initdb`` into ``pg.init`` beside the data directory, configure it, then rename it.

    The rename makes the initialisation all-or-nothing: an interrupted initdb leaves only
    ``pg.init``, which the next call discards.
    """
    staging = place.home / PG_INIT_DIR
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(mode=0o700)
    _give_to(staging, user)
    log(f"devtools: postgres: initdb {place.data_dir} ({bindir})")
    _run(
        [
            str(bindir / "initdb"),
            "-D",
            str(staging),
            "--auth=trust",
            "-U",
            PG_SUPERUSER,
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ],
        user=user,
        cwd=place.home,
    )
    with open(staging / "postgresql.conf", "a") as conf:
        conf.write(
            f"\n{PG_MARKER}\n"
            f"listen_addresses = '{LOCALHOST}'\n"
            "unix_socket_directories = ''\t# TCP only: no socket path length limits\n"
            "synchronous_commit = off\t# a crash may lose the last commits, never corrupts\n"
        )
    staging.rename(place.data_dir)


def _ensure_private_pg(run_dir: Path, port: int, log: Log) -> tuple[int, bool]:
    """Initialise (once) and start (unless running) the private cluster; make sure database
    ``authio`` exists. Returns ``(port it listens on, whether this call started it)``."""
    bindir = _find_pg_bindir(run_dir / PG_DIR)
    if bindir is None:  # _install_missing ran just before; this is a genuine failure
        raise DevServicesError("no PostgreSQL server binaries (postgres, initdb, pg_ctl) found")
    user = _pg_service_user(run_dir / PG_DIR, log)
    place = _pg_place(run_dir, user, log)
    data_dir, log_file = place.data_dir, place.log_file
    if not (data_dir / "PG_VERSION").is_file():
        if data_dir.exists():
            raise DevServicesError(f"{data_dir} exists but is not a PostgreSQL data directory; delete it")
        _init_pg_cluster(place, bindir, user, log)
    _give_to(data_dir, user)

    pg_ctl = str(bindir / "pg_ctl")
    status, _ = _run([pg_ctl, "status", "-D", str(data_dir)], user=user, cwd=place.home, check=False, timeout=30)
    running = _postmaster_pid_file(data_dir)
    if status == 0 and running is not None:
        actual_port = running[1]
        if actual_port != port:
            log(f"devtools: postgres: private instance already runs on port {actual_port} (not {port}); reusing it")
        error = _pg_check(_pg_url(actual_port, "postgres"), wait=10.0, create_db=DATABASE_NAME)
        if error is None:
            return actual_port, False
        raise DevServicesError(
            f"the private PostgreSQL in {data_dir} runs but does not answer on port "
            f"{actual_port} ({error}); stop it with `python -m devtools stop`"
        )

    if _tcp_open(port):
        raise DevServicesError(
            f"cannot start the private PostgreSQL: port {port} is in use by another process; "
            "pick another private_pg_port (--private-pg-port)"
        )
    if not log_file.exists():
        log_file.touch(mode=0o644)
    _give_to(log_file, user)
    began = time.monotonic()
    try:
        _run(
            [
                pg_ctl,
                "start",
                "-D",
                str(data_dir),
                "-w",
                "-t",
                "60",
                "-l",
                str(log_file),
                "-o",
                f"-p {port}",
            ],
            user=user,
            cwd=place.home,
            timeout=90,
        )
    except DevServicesError as exc:
        raise DevServicesError(f"{exc}\n{_tail(log_file)}") from exc
    error = _pg_check(_pg_url(port, "postgres"), wait=15.0, create_db=DATABASE_NAME)
    if error is not None:
        raise DevServicesError(
            f"the private PostgreSQL started but does not answer on port {port}: {error}\n{_tail(log_file)}"
        )
    owner = f" as user {user.name!r}" if user is not None else ""
    log(
        f"devtools: postgres: started private instance on {LOCALHOST}:{port}{owner} in "
        f"{time.monotonic() - began:.1f} s (data {data_dir}, log {log_file})"
    )
    return port, True


def _stop_pg_cluster(data_dir: Path, log: Log) -> None:
    """Stop the server running from ``data_dir`` (a real path), if any, as the owner of
    ``data_dir`` when we are root."""
    running = _postmaster_pid_file(data_dir)
    if running is None or not _pid_alive(running[0]):
        return
    pid, port = running
    bindir = _find_pg_bindir(data_dir)
    if bindir is not None:
        user = _pg_service_user(data_dir, log)
        _run(
            [str(bindir / "pg_ctl"), "stop", "-D", str(data_dir), "-m", "fast", "-w", "-t", "60"],
            user=user,
            cwd=data_dir.parent,
            timeout=90,
        )
    else:  # binaries gone: SIGINT is what "pg_ctl stop -m fast" sends
        os.kill(pid, signal.SIGINT)
        _wait_until(lambda: not _pid_alive(pid), 60.0, f"PostgreSQL (pid {pid}) to stop")
    log(f"devtools: postgres: stopped private instance on {LOCALHOST}:{port}")


def _stop_private_pg(run_dir: Path, log: Log) -> None:
    _stop_pg_cluster((run_dir / PG_DIR).resolve(), log)


# --------------------------------------------------------------------------------------------
# Private Redis


def _wait_until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            raise DevServicesError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _private_redis_running(redis_dir: Path) -> tuple[int, int] | None:
    """``(pid, port)`` of the private Redis if its pid file names a live ``redis-server``."""
    try:
        pid = int((redis_dir / REDIS_PIDFILE).read_text().strip())
        port = int((redis_dir / REDIS_PORTFILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    with contextlib.suppress(OSError):
        if b"redis" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None  # the pid was reused by something else
    return pid, port


def _ensure_private_redis(run_dir: Path, port: int, log: Log) -> tuple[int, bool]:
    """Start (unless running) the private Redis. Returns ``(port, whether this call started
    it)``."""
    redis_dir = run_dir / REDIS_DIR
    _make_dir(redis_dir)
    running = _private_redis_running(redis_dir)
    if running is not None:
        actual_port = running[1]
        error = _redis_check(_redis_url(actual_port), wait=5.0)
        if error is None:
            if actual_port != port:
                log(f"devtools: redis: private instance already runs on port {actual_port} (not {port}); reusing it")
            return actual_port, False
        raise DevServicesError(
            f"the private Redis (pid {running[0]}) runs but does not answer on port "
            f"{actual_port} ({error}); stop it with `python -m devtools stop`"
        )
    if _tcp_open(port):
        raise DevServicesError(
            f"cannot start the private Redis: port {port} is in use by another process; "
            "pick another private_redis_port (--private-redis-port)"
        )
    server = shutil.which("redis-server")
    if server is None:
        raise DevServicesError("no redis-server binary found")
    pidfile, logfile = redis_dir / REDIS_PIDFILE, redis_dir / REDIS_LOGFILE
    pidfile.unlink(missing_ok=True)
    (redis_dir / REDIS_PORTFILE).write_text(f"{port}\n")
    began = time.monotonic()
    _run(
        [
            server,
            "--port",
            str(port),
            "--bind",
            LOCALHOST,
            "--daemonize",
            "yes",
            "--dir",
            str(redis_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(logfile),
        ],
        cwd=redis_dir,
        env=dict(os.environ),
        timeout=30,
    )
    error = _redis_check(_redis_url(port), wait=10.0)
    if error is not None:
        raise DevServicesError(f"the private Redis did not come up on port {port}: {error}\n{_tail(logfile)}")
    log(
        f"devtools: redis: started private instance on {LOCALHOST}:{port} in "
        f"{time.monotonic() - began:.1f} s (dir {redis_dir})"
    )
    return port, True


def _stop_private_redis(run_dir: Path, log: Log) -> None:
    redis_dir = run_dir / REDIS_DIR
    running = _private_redis_running(redis_dir)
    if running is None:
        return
    pid, port = running
    with contextlib.suppress(OSError), socket.create_connection((LOCALHOST, port), 5) as conn:
        conn.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        conn.settimeout(5)
        with contextlib.suppress(OSError):
            conn.recv(1024)  # the server closes the connection as it exits
    try:
        _wait_until(lambda: not _pid_alive(pid), 10.0, f"Redis (pid {pid}) to stop")
    except DevServicesError:
        os.kill(pid, signal.SIGTERM)
        _wait_until(lambda: not _pid_alive(pid), 10.0, f"Redis (pid {pid}) to stop after SIGTERM")
    (redis_dir / REDIS_PIDFILE).unlink(missing_ok=True)
    log(f"devtools: redis: stopped private instance on {LOCALHOST}:{port}")


# --------------------------------------------------------------------------------------------
# Command line


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools",
        description="Provide PostgreSQL and Redis for `make run` / `make test`.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--run-dir",
        type=Path,
        default=Path(".run"),
        help="where private instances live (default: .run)",
    )
    ensure_opts = argparse.ArgumentParser(add_help=False)
    ensure_opts.add_argument(
        "--force-private",
        action="store_true",
        help="ignore DATABASE_URL/REDIS_URL and local servers",
    )
    ensure_opts.add_argument("--pg-port", type=int, default=5432)
    ensure_opts.add_argument("--redis-port", type=int, default=6379)
    ensure_opts.add_argument("--private-pg-port", type=int, default=55432)
    ensure_opts.add_argument("--private-redis-port", type=int, default=56379)
    ensure_opts.add_argument(
        "--hint",
        action="store_true",
        help="then say where the private instances in use live and how to stop them",
    )
    sub.add_parser(
        "ensure",
        parents=[common, ensure_opts],
        help="print `export DATABASE_URL=... REDIS_URL=...` shell lines",
    )
    run = sub.add_parser(
        "exec",
        parents=[common, ensure_opts],
        help="run a command with DATABASE_URL and REDIS_URL set",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    sub.add_parser("stop", parents=[common], help="stop the private instances (their data is kept)")
    sub.add_parser("remove", parents=[common], help="stop the private instances and delete their data")
    sub.add_parser(
        "hint",
        parents=[common],
        help="say where the running private instances live and how to stop them (nothing if none runs)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "hint":
            hint = private_instances_hint(args.run_dir)
            if hint is not None:
                _stderr(hint)
            return 0
        if args.command == "stop":
            if private_instances_hint(args.run_dir) is None:
                _stderr(f"devtools: no private PostgreSQL or Redis runs in {args.run_dir.absolute()}")
            stop_private(args.run_dir, log=_stderr)
            return 0
        if args.command == "remove":
            remove_private(args.run_dir, log=_stderr)
            return 0
        urls = ensure_services(
            run_dir=args.run_dir,
            database_url=os.environ.get("DATABASE_URL"),
            redis_url=os.environ.get("REDIS_URL"),
            pg_port=args.pg_port,
            redis_port=args.redis_port,
            force_private=args.force_private,
            private_pg_port=args.private_pg_port,
            private_redis_port=args.private_redis_port,
            log=_stderr,
        )
    except DevServicesError as exc:
        _stderr(f"devtools: error: {exc}")
        return 1
    if args.hint:
        hint = private_instances_hint(args.run_dir)
        if hint is not None:
            _stderr(hint)
    if args.command == "ensure":
        print(f"export DATABASE_URL={shlex.quote(urls.database_url)}")
        print(f"export REDIS_URL={shlex.quote(urls.redis_url)}", flush=True)
        return 0
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        _stderr("devtools: error: exec needs a command: exec -- CMD [ARG...]")
        return 2
    env = dict(os.environ, DATABASE_URL=urls.database_url, REDIS_URL=urls.redis_url)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        _stderr(f"devtools: error: cannot run {command[0]}: {exc}")
        return 127

