"""Sign-in and refresh throughput of the control plane (issue 4's "Proof" bench).

    .venv/bin/python bench/bench_identity.py                       # ~1.5 min, 2 server processes
    .venv/bin/python bench/bench_identity.py --profile --count-statements --json /tmp/identity.json
    .venv/bin/python bench/bench_identity.py --url http://127.0.0.1:8080 --server-pid PID \\
        --database-url postgresql://postgres@127.0.0.1:5432/authio --bootstrap-token TOKEN

What it does, in order:

1. **Database.** ``--database-url`` names the PostgreSQL server (default ``$DATABASE_URL``, else
   the local one); the bench uses its own database ``authio_bench`` there (created when missing,
   ``--recreate-db`` drops it first) and runs ``authio migrate`` on it, so it never touches a
   test database. The key-encryption key of the bench servers is kept in
   ``bench/data/identity_kms.key`` (made once), because the signing keys sealed under it stay in
   ``authio_bench``.
2. **Servers.** ``--server-processes N`` (default 2, one per core) ``authio serve control-plane``
   processes, each on its own free port with ``OTEL_EXPORTER=none``, ``SERVICE_LOG_LEVEL=WARNING``,
   a high ``SERVICE_MAGIC_LINK_RATE_PER_IP`` and their own Redis prefix; they die with the bench.
   ``--url`` (comma-separated) uses running servers instead (``--server-pid`` for their CPU).
   ``POST /v1/bootstrap`` makes a fresh tenant and project for the run.
3. **Sign-in** (``POST /v1/auth/magic-link/verify?project_id=...`` ``{"token"}``): *bench setup*
   inserts ``--users`` magic-link tokens per concurrency level straight into
   ``magic_link_tokens`` (purpose ``signin``, channel ``email``, one hour to live, stored as
   ``common.auth.token_digest`` digests), because in the service the plaintext token
   exists only inside the sent message. Half of the e-mails belong to users inserted beforehand
   (an existing user signs in, the token names the user as ``issue_link`` does), half are new (the
   user is created on first sign-in); the two alternate. Each token is redeemed once.
4. **Refresh** (``POST /v1/sessions/refresh`` ``{"refresh_token"}``): sessions come from the
   sign-in phase; each worker owns one session (a fresh one per level) and chain-refreshes it with
   the refresh token the previous answer returned.
5. Per level: closed loop (each worker sends its next request when the previous answer is in), one
   keep-alive connection per worker spread round-robin over the servers, ``--warmup`` seconds
   unmeasured, then ``--duration`` seconds measured. Every answer must be 200 with
   ``access_token`` and ``refresh_token``; anything else is an error (a level with errors says
   so). Reported: requests/s, p50/p90/p99 latency, the rate in the first and the last second of
   the window, errors, and CPU in cores: the servers, the PostgreSQL backends serving
   ``authio_bench``, PostgreSQL's shared processes (WAL writer, checkpointer, autovacuum...), the
   load generator, the rest of the machine (``other``: other people's work, ``noisy`` when
   >= 0.25 cores) and the whole box's busy share. From PostgreSQL's own counters: commits,
   inserted and updated rows per request, WAL fsyncs per second, and what the bench database's
   backends were doing (sampled from ``pg_stat_activity`` every 100 ms: running, waiting for the
   client inside a transaction, idle, waiting on WAL or locks).
6. ``--profile``: one more run per workload at the highest concurrency while ``py-spy record``
   samples every server process for ``--profile-seconds``; the collapsed stacks are merged and
   the top functions by own time and by inclusive time printed (files kept in ``--profile-dir``;
   ``--profile-native`` adds C frames, at the cost of pausing the server for each sample).
   py-spy is not a project dependency: ``.venv/bin/pip install py-spy``.
7. ``--count-statements``: the SQL statements one sign-in and one refresh send, counted from
   PostgreSQL's log (``log_statement = all`` set on ``authio_bench`` only, for a short sequential
   run against one extra server, then reset). ``pg_stat_statements`` would be the better tool but
   needs ``shared_preload_libraries``, i.e. a restart of a server other people use.

Client, servers and PostgreSQL share the machine: the client is ``bench_http``'s raw HTTP/1.1
client on uvloop in forked processes, and its CPU is measured, not assumed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import multiprocessing as mp
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import orjson

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_audit import _die_with_parent, _free_port, stop_process  # noqa: E402
from bench_http import (  # noqa: E402
    CLIENT_BOUND_PCT,
    NOISY_OTHER_CORES,
    RawConnection,
    latency_summary,
    measure_cpu,
    pids_cpu_seconds,
    system_cpu,
    wait_for_quiet,
)

from common.auth import token_digest  # noqa: E402
from common.ids import new_id  # noqa: E402
from control_plane.magic_links.service import VERIFY_PATH  # noqa: E402

DEFAULT_PG: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379/0"
BENCH_DB: Final = "authio_bench"
REFRESH_PATH: Final = "/v1/sessions/refresh"
KMS_KEY_FILE: Final = HERE / "data" / "identity_kms.key"
TARGETS: Final = {"signin": 1000.0, "refresh": 2000.0}  # issue 4, per second on 2 cores
USER_AGENT: Final = "authio-bench-identity/1"
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
BENCH_DB_NAME: list[str] = [BENCH_DB]  # the database whose backends count as the bench's (--database-name)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- database set-up


def with_db(url: str, db: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + db))


async def ensure_database(admin_url: str, name: str, recreate: bool) -> None:
    """Create database ``name`` on ``admin_url``'s server when missing (drop it first when
    ``recreate``)."""
    conn = await asyncpg.connect(with_db(admin_url, "postgres"))
    try:
        if recreate:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
            log(f"created database {name}")
    finally:
        await conn.close()


def authio_command() -> list[str]:
    script = Path(sys.executable).parent / "authio"
    return [str(script)] if script.exists() else [sys.executable, "-m", "control_plane.cli.main"]


def migrate(db_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": db_url, "SERVICE_LOG_LEVEL": "WARNING",
           "OTEL_EXPORTER": "none"}
    subprocess.run([*authio_command(), "migrate"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def kms_key() -> str:
    """The bench servers' key-encryption key (base64 of 32 bytes), made once and kept."""
    if not KMS_KEY_FILE.exists():
        KMS_KEY_FILE.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(KMS_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    return KMS_KEY_FILE.read_text().strip()


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    proc: subprocess.Popen[bytes] | None
    url: str
    pid: int | None
    log_path: Path | None = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def server_env(db_url: str, redis_url: str, tag: str, bootstrap_token: str,
               pool_max: int | None) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": redis_url,
           "SERVICE_KMS_KEY": kms_key(), "SERVICE_BOOTSTRAP_TOKEN": bootstrap_token,
           "OTEL_EXPORTER": "none", "SERVICE_LOG_LEVEL": "WARNING",
           "SERVICE_MAGIC_LINK_RATE_PER_IP": "1000000/minute", "SERVICE_HOST": "127.0.0.1",
           "SERVICE_REDIS_PREFIX": f"{tag}:", "PYTHONPATH": str(ROOT)}
    env.pop("SERVICE_KMS_KEY_FILE", None)
    if pool_max:
        env["SERVICE_PG_POOL_MAX"] = str(pool_max)
    return env


def spawn_servers(n: int, env: dict[str, str], tag: str) -> list[Server]:
    """Start ``n`` ``authio serve control-plane`` processes, each on a free port (log in
    ``/tmp/<tag>-server<k>.log``)."""
    servers: list[Server] = []
    for k in range(n):
        port = _free_port()
        log_path = Path(f"/tmp/{tag}-server{k}.log")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([*authio_command(), "serve", "control-plane"], cwd=ROOT,
                                    env={**env, "PORT": str(port)}, stdout=out,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        servers.append(Server(proc, f"http://127.0.0.1:{port}", proc.pid, log_path))
    return servers


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]


def _size(path: Path) -> int:
    return path.stat().st_size


def start_servers(n: int, env: dict[str, str], tag: str) -> list[Server]:
    """Start ``n`` servers and wait until each answers ``/readyz``. Called from the main
    thread: PR_SET_PDEATHSIG fires when the thread that forked the child ends."""
    servers = spawn_servers(n, env, tag)
    try:
        asyncio.run(wait_ready(servers))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


async def wait_ready(servers: list[Server]) -> None:
    import aiohttp

    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        for s in servers:
            assert s.proc is not None and s.log_path is not None
            while True:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"server exited ({s.proc.returncode}); see {s.log_path}:\n"
                                       + _tail(s.log_path))
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(s.url + "/readyz") as r:
                        if r.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready within 60 s; see {s.log_path}")
                await asyncio.sleep(0.1)


async def bootstrap_project(url: str, token: str) -> str:
    import aiohttp

    body = {"tenant_name": "bench identity", "project_name": f"bench {time.strftime('%H:%M:%S')}",
            "environment": "bench"}
    async with aiohttp.ClientSession() as http, http.post(
        url + "/v1/bootstrap", json=body, headers={"X-Service-Bootstrap-Token": token},
    ) as r:
        doc = await r.json()
        if r.status != 201:
            raise RuntimeError(f"bootstrap failed: {r.status} {doc}")
        return str(doc["project"]["id"])


# --------------------------------------------------------------------------- bench setup: tokens


async def make_tokens(db_url: str, project_id: str, n: int, tag: str) -> list[str]:
    """Bench setup: ``n`` fresh sign-in tokens for ``n`` distinct e-mails, every other one
    belonging to a user inserted here (the others sign up on first sign-in). Returns the
    plaintext tokens, existing and new users alternating."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    users, tokens, plain = [], [], []
    for i in range(n):
        email = f"{tag}-{i}@bench.example.com"
        token = secrets.token_urlsafe(32)
        user_id = None
        if i % 2 == 0:
            user_id = new_id("user")
            users.append((user_id, project_id, email, True))
        tokens.append((token_digest(token), project_id, "signin", "email", email, user_id, expires))
        plain.append(token)
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.copy_records_to_table(
                "users", records=users, columns=("id", "project_id", "email", "email_verified"))
            await conn.copy_records_to_table(
                "magic_link_tokens", records=tokens,
                columns=("token_hash", "project_id", "purpose", "channel", "destination",
                         "user_id", "expires_at"))
        await conn.execute("ANALYZE users, magic_link_tokens")
    finally:
        await conn.close()
    return plain


# --------------------------------------------------------------------------- the client


@dataclass
class ProcOut:
    """One client process's results (latencies and completion times in seconds)."""

    latencies: bytes = b""  # array('d'), measured window only
    done_at: bytes = b""  # array('d'), completion time minus window start
    requests: int = 0
    errors: int = 0
    warmup_errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    window: float = 0.0
    exhausted_after: float | None = None  # seconds into the window when the tokens ran out
    refresh_tokens: list[str] = field(default_factory=list)  # kept from sign-ins
    dead_workers: int = 0  # refresh chains that ended on an error


def _head(path: str, host: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n").encode()


async def run_clients(cfg: dict[str, Any], kind: str, items: list[str], n_workers: int,
                      worker_base: int, barrier: Any) -> ProcOut:
    """``n_workers`` closed-loop workers on one keep-alive connection each. ``kind`` "signin":
    ``items`` are magic-link tokens, taken in turn, each once. "refresh": ``items[w]`` is worker
    ``w``'s first refresh token; each answer's refresh token is the next one sent."""
    loop = asyncio.get_running_loop()
    servers: list[tuple[str, int]] = cfg["servers"]
    heads: list[bytes] = []
    addrs: list[tuple[str, int]] = []
    for w in range(n_workers):
        host, port = servers[(worker_base + w) % len(servers)]
        path = (f"{VERIFY_PATH}?{urlencode({'project_id': cfg['project_id']})}"
                if kind == "signin" else REFRESH_PATH)
        heads.append(_head(path, f"{host}:{port}"))
        addrs.append((host, port))

    async def connect(w: int) -> RawConnection:
        _, proto = await loop.create_connection(RawConnection, *addrs[w])
        return proto

    conns = list(await asyncio.gather(*(connect(w) for w in range(n_workers))))
    await loop.run_in_executor(None, barrier.wait)

    warmup, duration = cfg["warmup"], cfg["duration"]
    t_measure = time.perf_counter() + warmup
    t_end = t_measure + duration
    lat, done = array("d"), array("d")
    out = ProcOut()
    kinds: Counter[str] = Counter()
    keep = cfg.get("keep_refresh", 0)
    field_name = "token" if kind == "signin" else "refresh_token"
    next_item = 0

    def error(t0: float, what: str) -> None:
        if t0 >= t_measure:
            out.errors += 1
            kinds[what] += 1
        else:
            out.warmup_errors += 1
            kinds[f"warmup_{what}"] += 1

    async def worker(w: int) -> None:
        nonlocal next_item
        perf = time.perf_counter
        head = heads[w]
        current = items[w] if kind == "refresh" else ""
        while True:
            t0 = perf()
            if t0 >= t_end:
                return
            if kind == "signin":
                if next_item >= len(items):
                    if out.exhausted_after is None:
                        out.exhausted_after = max(0.0, t0 - t_measure)
                    return
                current = items[next_item]
                next_item += 1
            body = orjson.dumps({field_name: current})
            payload = head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            conn = conns[w]
            try:
                if conn.closed:
                    conn = conns[w] = await connect(w)
                status, answer = await conn.request(payload)
            except Exception as exc:  # connection errors
                error(t0, type(exc).__name__)
                await asyncio.sleep(0.01)
                continue
            t1 = perf()
            if conn.must_close and conn.transport is not None:
                conn.transport.close()
            refresh = None
            if status == 200:
                doc = orjson.loads(answer)
                refresh = doc.get("refresh_token")
                if not (refresh and doc.get("access_token")):
                    refresh = None
            if refresh is None:
                code = ""
                with contextlib.suppress(Exception):
                    code = orjson.loads(answer)["error"]["code"]
                error(t0, f"http_{status}" + (f"_{code}" if code else ""))
                if kind == "refresh":  # the chain is broken: this session cannot go on
                    out.dead_workers += 1
                    return
                continue
            if t0 >= t_measure:
                lat.append(t1 - t0)
                done.append(t1 - t_measure)
                out.requests += 1
            if kind == "refresh":
                current = refresh
            elif len(out.refresh_tokens) < keep:
                out.refresh_tokens.append(refresh)

    tasks = [asyncio.ensure_future(worker(w)) for w in range(n_workers)]
    meter = asyncio.ensure_future(measure_cpu(out, t_measure, t_end))
    finished, pending = await asyncio.wait(tasks, timeout=warmup + duration + 30)
    for t in pending:
        t.cancel()
        out.errors += 1
        kinds["timeout_at_end"] += 1
    for t in finished:
        if t.exception() is not None:
            out.errors += 1
            kinds[f"worker_crash_{type(t.exception()).__name__}"] += 1
    await meter
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    out.latencies, out.done_at = lat.tobytes(), done.tobytes()
    out.error_kinds = dict(kinds)
    return out


def child_main(cfg: dict[str, Any], kind: str, items: list[str], n_workers: int,
               worker_base: int, barrier: Any, queue: Any) -> None:
    import uvloop

    try:
        res = uvloop.run(run_clients(cfg, kind, items, n_workers, worker_base, barrier))
    except BaseException as exc:  # report instead of hanging the parent
        res = ProcOut(errors=1, error_kinds={f"client_crash_{type(exc).__name__}": 1})
        barrier.abort()
    queue.put(res)


# --------------------------------------------------------------------------- PostgreSQL side


def postgres_processes(dbname: str) -> dict[int, tuple[str, float]]:
    """pid -> (class, CPU seconds) of every ``postgres`` process: ``bench`` (a backend of
    ``dbname``), ``shared`` (postmaster, WAL writer, checkpointer, background writer,
    autovacuum, ...) or ``other_db`` (backends of other databases)."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        parts = cmd.split()
        # a backend's title: "postgres: 15/main: <user> <database> <host(port)|[local]> <state>"
        if len(parts) >= 5 and parts[0] == "postgres:" and ("(" in parts[4]
                                                             or parts[4] == "[local]"):
            cls = "bench" if parts[3] == dbname else "other_db"
        else:
            cls = "shared"
        out[int(entry)] = (cls, cpu)
    return out


def pg_cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                 exclude: set[int]) -> dict[str, float]:
    out = {"bench": 0.0, "shared": 0.0, "other_db": 0.0}
    for pid, (cls, cpu) in after.items():
        if pid in exclude:
            continue
        out[cls] += cpu - (before[pid][1] if pid in before else 0.0)
    return out


_DB_STATS: Final = """
SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated, d.tup_deleted,
       d.tup_fetched, d.tup_returned, d.blks_read, d.blks_hit,
       w.wal_records, w.wal_bytes::bigint AS wal_bytes, w.wal_write, w.wal_sync
FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()
"""

_ACTIVITY: Final = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""


def activity_class(state: str | None, wait_type: str | None, wait: str | None) -> str:
    """What a sampled backend was doing, in the bench's words."""
    if state == "active":
        if wait_type is None or wait_type == "CPU":
            return "running"
        if wait_type == "IO" and wait and wait.startswith("WAL"):
            return "wal_io"
        if wait_type == "LWLock" and wait and wait.startswith("WAL"):
            return "wal_lock"
        if wait_type == "Lock":
            return "row_or_table_lock"
        if wait_type == "Client":
            return "sending_to_client"
        return f"{wait_type}:{wait}"
    if state == "idle in transaction":
        return "idle_in_txn (waiting for the server's next statement)"
    if state == "idle":
        return "idle (connection back in the pool)"
    return str(state)


@dataclass
class Window:
    seconds: float
    server_cpu: float
    pg: dict[str, float]
    machine_busy: float  # share of all CPUs
    machine_cores: float
    parent_cpu: float
    db: dict[str, int]
    activity: dict[str, float]  # class -> mean backends in that state


async def measure_window(db_url: str, duration: float, server_pids: list[int]) -> Window:
    """CPU of servers, PostgreSQL and the machine, PostgreSQL's counters and sampled backend
    activity over ``duration`` seconds from now."""
    conn = await asyncpg.connect(db_url)
    try:
        me = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        db0 = dict(await conn.fetchrow(_DB_STATS))
        pg0, s0, sys0 = postgres_processes(BENCH_DB_NAME[0]), pids_cpu_seconds(server_pids), system_cpu()
        c0, t0 = time.process_time(), time.perf_counter()
        samples: Counter[str] = Counter()
        n = 0
        while True:
            left = t0 + duration - time.perf_counter()
            if left <= 0:
                break
            for r in await conn.fetch(_ACTIVITY):
                samples[activity_class(r["state"], r["wait_event_type"], r["wait_event"])] += 1
            n += 1
            await asyncio.sleep(min(0.1, max(0.0, t0 + duration - time.perf_counter())))
        pg1, s1, sys1 = postgres_processes(BENCH_DB_NAME[0]), pids_cpu_seconds(server_pids), system_cpu()
        c1, t1 = time.process_time(), time.perf_counter()
        # Backends flush their counters about once a second while busy: the unflushed share
        # at the start and at the end of the window roughly cancel out.
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        db1 = dict(await conn.fetchrow(_DB_STATS))
    finally:
        await conn.close()
    window = t1 - t0
    ncpu = os.cpu_count() or 1
    busy = (sys1[0] - sys0[0]) / (sys1[1] - sys0[1]) if sys1[1] > sys0[1] else 0.0
    return Window(
        seconds=window, server_cpu=(s1 - s0) / window,
        pg={k: v / window for k, v in pg_cpu_delta(pg0, pg1, {me}).items()},
        machine_busy=busy, machine_cores=busy * ncpu, parent_cpu=(c1 - c0) / window,
        db={k: int(db1[k] - db0[k]) for k in db0},
        activity={k: v / max(1, n) for k, v in sorted(samples.items(), key=lambda kv: -kv[1])},
    )


# --------------------------------------------------------------------------- one level


def split_items(kind: str, items: list[str], procs: list[int]) -> list[list[str]]:
    """Sign-in tokens in contiguous slices proportional to each process's workers; refresh
    tokens one per worker."""
    out, pos, total = [], 0, sum(procs)
    for k, n in enumerate(procs):
        if kind == "refresh":
            take = n
        else:
            take = len(items) * n // total if k < len(procs) - 1 else len(items) - pos
        out.append(items[pos:pos + take])
        pos += take
    return out


def run_level(cfg: dict[str, Any], kind: str, items: list[str], concurrency: int,
              server_pids: list[int], during: Any = None) -> dict[str, Any]:
    """One closed-loop level; ``during(window_seconds)`` (optional) runs in the parent instead
    of the measurement, e.g. a profiler."""
    procs_n = max(1, min(cfg["processes"], concurrency))
    split = [concurrency // procs_n + (1 if k < concurrency % procs_n else 0)
             for k in range(procs_n)]
    if kind == "refresh" and len(items) < concurrency:
        raise SystemExit(f"only {len(items)} sessions for {concurrency} refresh workers")
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs_n + 1)
    queue = ctx.Queue()
    procs, base = [], 0
    for n, chunk in zip(split, split_items(kind, items, split), strict=True):
        p = ctx.Process(target=child_main, args=(cfg, kind, chunk, n, base, barrier, queue),
                        daemon=True)
        p.start()
        procs.append(p)
        base += n
    try:
        barrier.wait(timeout=60)
    except Exception as exc:
        raise SystemExit(f"client processes failed to start/connect: {exc!r}") from exc
    time.sleep(cfg["warmup"])
    extra: Any = None
    win: Window | None = None
    if during is not None:
        extra = during(cfg["duration"])
    else:
        win = asyncio.run(measure_window(cfg["db_url"], cfg["duration"], server_pids))
    results: list[ProcOut] = [queue.get(timeout=cfg["warmup"] + cfg["duration"] + 90)
                              for _ in procs]
    for p in procs:
        p.join(timeout=10)
    return summarize(cfg, kind, concurrency, results, win, extra)


def summarize(cfg: dict[str, Any], kind: str, concurrency: int, results: list[ProcOut],
              win: Window | None, extra: Any) -> dict[str, Any]:
    lat_arr, done_arr = array("d"), array("d")
    for r in results:
        lat_arr.frombytes(r.latencies)
        done_arr.frombytes(r.done_at)
    lat = sorted(lat_arr)
    duration = cfg["duration"]
    exhausted = [r.exhausted_after for r in results if r.exhausted_after is not None]
    effective = min(duration, max(exhausted)) if exhausted else duration
    requests = sum(r.requests for r in results)
    kinds: Counter[str] = Counter()
    for r in results:
        kinds.update(r.error_kinds)
    cpu_pcts = [100.0 * r.cpu_seconds / r.window for r in results if r.window > 0]
    client_cores = sum(r.cpu_seconds for r in results) / duration
    per_second = [0] * max(1, int(effective))
    for t in done_arr:
        if 0 <= t < len(per_second):
            per_second[int(t)] += 1
    first, last = per_second[0], per_second[-1]
    row: dict[str, Any] = {
        "workload": kind,
        "concurrency": concurrency,
        "duration_s": duration,
        "measured_s": effective,
        "tokens_ran_out": bool(exhausted),
        "requests": requests,
        "requests_per_s": requests / effective if effective > 0 else 0.0,
        "first_second_per_s": first,
        "last_second_per_s": last,
        "per_second": per_second,
        "latency_ms": latency_summary(lat),
        "errors": sum(r.errors for r in results),
        "warmup_errors": sum(r.warmup_errors for r in results),
        "dead_refresh_chains": sum(r.dead_workers for r in results),
        "error_kinds": dict(kinds),
        "client_cpu_cores": client_cores,
        "client_cpu_max_process_pct": max(cpu_pcts, default=0.0),
        "client_bound": any(p >= CLIENT_BOUND_PCT for p in cpu_pcts),
        "refresh_tokens": [t for r in results for t in r.refresh_tokens],
        "profile": extra,
    }
    if win is not None:
        per_req = max(1, requests)
        pg_ours = win.pg["bench"] + win.pg["shared"]
        other = max(0.0, win.machine_cores - client_cores - win.parent_cpu - win.server_cpu - pg_ours)
        row.update({
            "server_cpu_cores": win.server_cpu,
            "server_cpu_us_per_request": 1e6 * win.server_cpu * win.seconds / per_req,
            "pg_backend_cpu_cores": win.pg["bench"],
            "pg_shared_cpu_cores": win.pg["shared"],
            "pg_other_db_cpu_cores": win.pg["other_db"],
            "pg_cpu_us_per_request": 1e6 * pg_ours * win.seconds / per_req,
            "harness_cpu_cores": win.parent_cpu,
            "other_cpu_cores": other,
            "noisy": other >= NOISY_OTHER_CORES,
            "machine_busy_pct": 100.0 * win.machine_busy,
            "db": win.db,
            "db_per_request": {k: win.db[k] / per_req for k in
                               ("xact_commit", "tup_inserted", "tup_updated", "wal_records")},
            "wal_syncs_per_s": win.db["wal_sync"] / win.seconds,
            "pg_activity_mean_backends": win.activity,
        })
    return row


# --------------------------------------------------------------------------- profiling


def pyspy_path() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_servers(pids: list[int], seconds: float, out_dir: Path, tag: str,
                    native: bool) -> dict[str, Any]:
    """Run ``py-spy record --format raw`` on every pid at once; merge the collapsed stacks."""
    exe = pyspy_path()
    if exe is None:
        raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    for pid in pids:
        path = out_dir / f"{tag}-{pid}.txt"
        cmd = [exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200",
               "--format", "raw", "-o", str(path)]
        cmd += ["--native"] if native else ["--nonblocking"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        files.append(path)
    for p in procs:
        _, err = p.communicate(timeout=seconds + 60)
        if p.returncode != 0:
            log(f"py-spy failed: {err.decode()[-500:]}")
    return analyse_stacks(files)


_LINE_NO: Final = re.compile(r":\d+\)$")


def _frame_key(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (path/file.py)``, shortened to the package path."""
    frame = _LINE_NO.sub(")", frame.strip())
    for marker in ("site-packages/", "/python3.11/", str(ROOT) + "/"):
        pos = frame.find(marker)
        if pos >= 0:
            name, _, _ = frame.partition(" (")
            frame = f"{name} ({frame[pos + len(marker):]}"
            break
    return frame


def analyse_stacks(files: list[Path], top: int = 30) -> dict[str, Any]:
    """Own (leaf) and inclusive shares of the functions in py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [_frame_key(f) for f in stack.split(";") if f]
            if not frames:
                continue
            total += n
            own[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 2)) for k, v in c.most_common(top)] if total else []
    return {"samples": total, "files": [str(f) for f in files], "own_pct": share(own),
            "inclusive_pct": share(incl)}


# --------------------------------------------------------------------------- statements per operation


def count_statements(args: argparse.Namespace, db_url: str, env: dict[str, str],
                     project_id: str, tag: str) -> dict[str, Any]:
    """Statements one sign-in and one refresh send, from PostgreSQL's log: ``log_statement =
    all`` is set on the bench database only, one extra server is started (its connections pick
    the setting up), ``--statement-ops`` sign-ins and then as many refreshes run one at a time,
    and the setting is reset."""
    log_path = Path(args.pg_log)
    if not log_path.exists():
        return {"error": f"no PostgreSQL log at {log_path} (--pg-log)"}
    note = asyncio.run(_statement_logging(db_url, True))
    try:
        server = start_servers(1, env, f"{tag}-stmts")[0]
        try:
            spans, ok = asyncio.run(_sequential_ops(server.url, db_url, project_id, tag,
                                                    args.statement_ops, log_path))
        finally:
            server.stop()
    finally:
        asyncio.run(_statement_logging(db_url, False))
    out: dict[str, Any] = {"note": note, "operations": args.statement_ops, "ok_signins": ok}
    for name, (a, b) in spans.items():
        out[name] = parse_statement_log(log_path, a, b, BENCH_DB_NAME[0], args.statement_ops)
    return out


async def _statement_logging(db_url: str, on: bool) -> str:
    conn = await asyncpg.connect(db_url)
    try:
        db = BENCH_DB_NAME[0]
        if not on:
            await conn.execute(f'ALTER DATABASE "{db}" RESET log_statement')
            await conn.execute(f'ALTER DATABASE "{db}" RESET log_duration')
            return ""
        try:
            await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
            note = "pg_stat_statements is installed too; these counts come from the log"
        except asyncpg.PostgresError:
            note = "pg_stat_statements is not loaded (shared_preload_libraries): counted from the log"
        await conn.execute(f"ALTER DATABASE \"{db}\" SET log_statement = 'all'")
        await conn.execute(f"ALTER DATABASE \"{db}\" SET log_duration = on")
        return note
    finally:
        await conn.close()


async def _sequential_ops(url: str, db_url: str, project_id: str, tag: str, k: int,
                          log_path: Path) -> tuple[dict[str, tuple[int, int]], int]:
    import aiohttp

    tokens = await make_tokens(db_url, project_id, k, f"{tag}-stmts")
    spans: dict[str, tuple[int, int]] = {}
    async with aiohttp.ClientSession(headers={"User-Agent": USER_AGENT}) as http:
        async def phase(name: str, calls: list[tuple[str, dict[str, str]]]) -> list[Any]:
            await asyncio.sleep(1.2)  # the servers' once-a-second outbox poll lands apart
            start = _size(log_path)
            docs = []
            for path, body in calls:
                async with http.post(url + path, json=body) as r:
                    docs.append((r.status, await r.json()))
            await asyncio.sleep(0.2)
            spans[name] = (start, _size(log_path))
            return docs

        q = urlencode({"project_id": project_id})
        docs = await phase("signin", [(f"{VERIFY_PATH}?{q}", {"token": t}) for t in tokens])
        refresh = [d["refresh_token"] for status, d in docs if status == 200]
        await phase("refresh", [(REFRESH_PATH, {"refresh_token": t}) for t in refresh])
    return spans, len(refresh)


_LOG_LINE: Final = re.compile(r"\[(\d+)\] \S+@(\S+) LOG:  (statement|execute [^:]*|duration): (.*)$")


def parse_statement_log(path: Path, start: int, end: int, dbname: str, ops: int) -> dict[str, Any]:
    """Statements logged for ``dbname`` between byte offsets, grouped by text, with the time
    PostgreSQL spent on each (``log_duration``: parse and bind durations come before an
    ``execute`` line, the execute duration right after it; a simple query's right after)."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode(errors="replace")
    stmts: list[list[Any]] = []  # [sql, ms]
    pending: dict[str, float] = {}  # pid -> parse/bind time of the statement to come
    awaiting: dict[str, list[Any]] = {}  # pid -> statement whose own duration comes next
    last: list[Any] | None = None
    for line in text.splitlines():
        m = _LOG_LINE.search(line)
        if m is None:
            if last is not None and line.startswith("\t") and len(last[0]) < 400:
                last[0] += " " + line.strip()
            continue
        last = None
        pid, db, what, rest = m.groups()
        if db != dbname:
            continue
        if what == "duration":
            ms = float(rest.split()[0])
            if pid in awaiting:
                awaiting.pop(pid)[1] += ms
            else:
                pending[pid] = pending.get(pid, 0.0) + ms
            continue
        last = [rest, pending.pop(pid, 0.0)]
        stmts.append(last)
        awaiting[pid] = last
    count: Counter[str] = Counter()
    time_ms: Counter[str] = Counter()
    for sql, ms in stmts:
        key = _normalise(sql)
        count[key] += 1
        time_ms[key] += ms
    n = max(1, ops)
    return {"statements": len(stmts), "per_operation": round(len(stmts) / n, 2),
            "db_ms_per_operation": round(sum(time_ms.values()) / n, 3),
            "by_statement": [(sql, round(c / n, 2), round(time_ms[sql] / n, 3))
                             for sql, c in count.most_common()]}


_SAVEPOINT: Final = re.compile(r"__asyncpg_savepoint_[0-9a-f]+__")


def _normalise(sql: str) -> str:
    sql = _SAVEPOINT.sub("__asyncpg_savepoint_N__", " ".join(sql.split()))
    return sql if len(sql) <= 110 else sql[:107] + "..."


# --------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    return {"nproc": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def print_levels(rows: list[dict[str, Any]], out: Any) -> None:
    hdr = (f"{'workload':>8} {'conc':>4} {'req/s':>7} {'1st→last s':>11} {'p50 ms':>7} "
           f"{'p90 ms':>7} {'p99 ms':>7} {'err':>4} {'srv':>5} {'pg be':>5} {'pg sh':>5} "
           f"{'cli':>5} {'other':>5} {'box':>5} {'srv µs/r':>8} {'pg µs/r':>7} "
           f"{'commit/r':>8} {'fsync/s':>7}")
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    for r in rows:
        lat = r["latency_ms"]
        flags = []
        if r["client_bound"]:
            flags.append("client-bound")
        if r.get("noisy"):
            flags.append("noisy")
        if r["tokens_ran_out"]:
            flags.append(f"tokens ran out after {r['measured_s']:.1f}s")
        if r["errors"] or r["warmup_errors"]:
            flags.append("ERRORS")
        print(f"{r['workload']:>8} {r['concurrency']:>4} {r['requests_per_s']:>7.0f} "
              f"{r['first_second_per_s']:>5}→{r['last_second_per_s']:<5} "
              f"{lat['p50']:>7.2f} {lat['p90']:>7.2f} {lat['p99']:>7.2f} "
              f"{r['errors'] + r['warmup_errors']:>4} {r['server_cpu_cores']:>5.2f} "
              f"{r['pg_backend_cpu_cores']:>5.2f} {r['pg_shared_cpu_cores']:>5.2f} "
              f"{r['client_cpu_cores'] + r['harness_cpu_cores']:>5.2f} "
              f"{r['other_cpu_cores']:>5.2f} {r['machine_busy_pct']:>4.0f}% "
              f"{r['server_cpu_us_per_request']:>8.0f} {r['pg_cpu_us_per_request']:>7.0f} "
              f"{r['db_per_request']['xact_commit']:>8.2f} {r['wal_syncs_per_s']:>7.0f}"
              + (f"  [{', '.join(flags)}]" if flags else ""), file=out)
        if r["error_kinds"]:
            print(f"         errors: {r['error_kinds']}", file=out)
        act = ", ".join(f"{k} {v:.1f}" for k, v in r["pg_activity_mean_backends"].items())
        print(f"         pg backends (mean count): {act}", file=out)
        per = r["db_per_request"]
        print(f"         per request: {per['tup_inserted']:.1f} rows inserted, "
              f"{per['tup_updated']:.1f} updated, {per['wal_records']:.1f} WAL records", file=out)


def print_profile(kind: str, prof: dict[str, Any], row: dict[str, Any], out: Any) -> None:
    print(f"\nprofile: {kind} at c={row['concurrency']}, {row['requests_per_s']:.0f} req/s while "
          f"sampled, {prof['samples']} samples ({', '.join(prof['files'])})", file=out)
    print("  own time (leaf frames):", file=out)
    for name, pct in prof["own_pct"][:15]:
        print(f"    {pct:6.2f}%  {name}", file=out)
    print("  inclusive:", file=out)
    for name, pct in prof["inclusive_pct"][:30]:
        print(f"    {pct:6.2f}%  {name}", file=out)


def print_statements(st: dict[str, Any], out: Any) -> None:
    print(f"\nstatements per operation ({st.get('note', '')}; {st.get('operations')} each, "
          "sequential):", file=out)
    if "error" in st:
        print(f"  {st['error']}", file=out)
        return
    for name in ("signin", "refresh"):
        s = st[name]
        print(f"  {name}: {s['per_operation']} statements, {s['db_ms_per_operation']:.3f} ms in "
              "PostgreSQL (parse+bind+execute, log_duration) per request; count, ms:", file=out)
        for sql, n, ms in s["by_statement"]:
            print(f"    {n:5.2f} {ms:6.3f}  {sql}", file=out)


# --------------------------------------------------------------------------- main


def one_run(args: argparse.Namespace, cfg: dict[str, Any], kind: str, conc: int,
            profiled: bool, sessions: list[str], sessions_needed: int, project_id: str,
            db_url: str, tag: str, pids: list[int]) -> dict[str, Any]:
    """Set up and run one level: fresh tokens for a sign-in level (keeping refresh tokens
    for the refresh levels to come), ``conc`` unused sessions (taken from ``sessions``) for a
    refresh level; profiled runs py-spy the servers instead of measuring."""
    if kind == "signin":
        t = time.perf_counter()
        items = asyncio.run(make_tokens(db_url, project_id, args.users,
                                        f"{tag}-{secrets.token_hex(4)}"))
        log(f"bench setup: {len(items)} tokens in {time.perf_counter() - t:.1f} s")
        keep = max(0, sessions_needed - len(sessions))
        level_cfg = {**cfg, "keep_refresh": -(-keep // max(1, args.processes))}
    else:
        items = sessions[:conc]
        del sessions[:conc]
        level_cfg = cfg
    during = None
    if profiled:
        level_cfg = {**level_cfg, "duration": args.profile_seconds + 1.0}

        def during(_s: float) -> dict[str, Any]:
            return profile_servers(pids, args.profile_seconds, args.profile_dir,
                                   f"{tag}-{kind}", args.profile_native)
    log(f"{kind} c={conc}{' (profiling)' if profiled else ''} ...")
    row = run_level(level_cfg, kind, items, conc, pids, during)
    sessions.extend(row.pop("refresh_tokens"))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_PG,
                    help="PostgreSQL server; the bench uses its database --database-name")
    ap.add_argument("--database-name", default=BENCH_DB,
                    help="the bench's own database (with --url: the running service's)")
    ap.add_argument("--recreate-db", action="store_true", help="drop the bench database first")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or DEFAULT_REDIS)
    ap.add_argument("--server-processes", type=int, default=2,
                    help="authio serve control-plane processes to start (one port each)")
    ap.add_argument("--pool-max", type=int, default=None,
                    help="SERVICE_PG_POOL_MAX for the started servers (default: the service's)")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="extra environment for the started servers (repeatable), e.g. "
                         "SERVICE_PG_POOL_MAX=20")
    ap.add_argument("--url", default=None,
                    help="comma-separated URLs of running control planes instead")
    ap.add_argument("--server-pid", default=None, help="with --url: their PIDs, for CPU")
    ap.add_argument("--bootstrap-token", default=None,
                    help="with --url: SERVICE_BOOTSTRAP_TOKEN of the running service")
    ap.add_argument("--project-id", default=None, help="with --url: use this project")
    ap.add_argument("--concurrency", default="16,64", help="comma-separated levels")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per level")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per level")
    ap.add_argument("--users", type=int, default=25_000,
                    help="sign-in tokens made per sign-in level (half for existing users)")
    ap.add_argument("--workloads", default="signin,refresh")
    ap.add_argument("--processes", type=int, default=1, help="client processes")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each level wait up to S seconds for an idle machine")
    ap.add_argument("--noisy-retries", type=int, default=0, metavar="N",
                    help="rerun a level up to N times while other processes used >= "
                         f"{NOISY_OTHER_CORES} cores; keep the quietest run")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the servers during one extra run per workload")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--profile-native", action="store_true",
                    help="include C frames (py-spy --native; pauses the server per sample)")
    ap.add_argument("--profile-dir", type=Path, default=Path("/tmp/bench_identity_profile"))
    ap.add_argument("--count-statements", action="store_true",
                    help="count SQL statements per sign-in and refresh from PostgreSQL's log")
    ap.add_argument("--statement-ops", type=int, default=100)
    ap.add_argument("--pg-log", default="/var/log/postgresql/postgresql-15-main.log")
    ap.add_argument("--json", default=None, metavar="PATH", help="write results ('-' = stdout)")
    args = ap.parse_args(argv)

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not set(workloads) <= {"signin", "refresh"}:
        ap.error("--workloads takes signin and/or refresh")
    BENCH_DB_NAME[0] = args.database_name
    db_url = with_db(args.database_url, args.database_name)
    tag = f"bench_identity_{secrets.token_hex(3)}"
    bootstrap_token = args.bootstrap_token or secrets.token_urlsafe(32)
    env = server_env(db_url, args.redis_url, tag, bootstrap_token, args.pool_max)
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--server-env takes NAME=VALUE, not {item!r}")
        env[name] = value
    servers: list[Server] = []
    info = machine_info()
    log(f"machine: {info['nproc']} CPUs, {info['cpu_model']}, {info['memory_gib']} GiB")
    try:
        if args.url:
            pids = [int(p) for p in args.server_pid.split(",")] if args.server_pid else []
            servers = [Server(None, u.rstrip("/"), None) for u in args.url.split(",")]
        else:
            asyncio.run(ensure_database(args.database_url, args.database_name, args.recreate_db))
            migrate(db_url)
            servers = start_servers(args.server_processes, env, tag)
            pids = [s.pid for s in servers if s.pid]
            log(f"{len(servers)} servers: " + ", ".join(f"{s.url} (pid {s.pid})" for s in servers))
        project_id = args.project_id or asyncio.run(bootstrap_project(servers[0].url,
                                                                      bootstrap_token))
        log(f"project {project_id}")
        cfg: dict[str, Any] = {
            "servers": [(urlsplit(s.url).hostname or "127.0.0.1", urlsplit(s.url).port or 80)
                        for s in servers],
            "project_id": project_id, "warmup": args.warmup, "duration": args.duration,
            "processes": args.processes, "db_url": db_url,
            "keep_refresh": 0,
        }
        sessions_needed = (sum(levels) * (args.noisy_retries + 1)
                           + (max(levels) if args.profile else 0))
        rows: list[dict[str, Any]] = []
        profiles: dict[str, Any] = {}
        sessions: list[str] = []
        if "refresh" in workloads and "signin" not in workloads:
            workloads = ["signin", *workloads]  # the sessions come from sign-ins
        for kind in workloads:
            runs = [(c, False) for c in levels] + ([(max(levels), True)] if args.profile else [])
            for conc, profiled in runs:
                best: dict[str, Any] | None = None
                for attempt in range(1 if profiled else args.noisy_retries + 1):
                    if args.wait_quiet > 0 and not profiled:
                        wait_for_quiet(args.wait_quiet)
                    row = one_run(args, cfg, kind, conc, profiled, sessions, sessions_needed,
                                  project_id, db_url, tag, pids)
                    if profiled:
                        profiles[kind] = row
                        log(f"  profiled run: {row['requests_per_s']:.0f} req/s, "
                            f"{row['profile']['samples']} samples")
                        break
                    row["attempt"] = attempt + 1
                    lat = row["latency_ms"]
                    log(f"  {row['requests_per_s']:.0f} req/s p50 {lat['p50']:.2f} ms p99 "
                        f"{lat['p99']:.2f} ms errors {row['errors'] + row['warmup_errors']} "
                        f"srv {row['server_cpu_cores']:.2f} pg {row['pg_backend_cpu_cores']:.2f}+"
                        f"{row['pg_shared_cpu_cores']:.2f} other {row['other_cpu_cores']:.2f}")
                    if best is None or row["other_cpu_cores"] < best["other_cpu_cores"]:
                        best = row
                    if not row["noisy"]:
                        break
                if best is not None:
                    rows.append(best)
        statements = None
        if args.count_statements and not args.url:
            log("counting statements per operation ...")
            statements = count_statements(args, db_url, env, project_id, tag)
    finally:
        for s in servers:
            s.stop()

    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"\nauthio bench_identity  servers={len(servers)}  levels={levels}  "
          f"duration={args.duration}s warmup={args.warmup}s  users/level={args.users}", file=out)
    print(f"machine: nproc={info['nproc']}  {info['cpu_model']}  {info['memory_gib']} GiB  "
          f"Python {info['python']}; client, servers and PostgreSQL share it", file=out)
    print("CPU in cores: srv = servers, pg be = PostgreSQL backends of the bench database, pg sh ="
          " PostgreSQL's shared processes (WAL writer, checkpointer, autovacuum), cli = load "
          "generator, other = rest of the box; µs/r = CPU per request", file=out)
    print_levels(rows, out)
    for kind, row in profiles.items():
        print_profile(kind, row["profile"], row, out)
    if statements is not None:
        print_statements(statements, out)
    verdicts = []
    for kind in ("signin", "refresh"):
        mine = [r for r in rows if r["workload"] == kind]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["requests_per_s"])
        ok = best["requests_per_s"] >= TARGETS[kind] and not best["errors"]
        verdicts.append(f"{kind}: best {best['requests_per_s']:.0f}/s at c={best['concurrency']} "
                        f"(target {TARGETS[kind]:.0f}/s: {'met' if ok else 'MISSED'})")
    print("\n" + "; ".join(verdicts), file=out)
    if args.json:
        doc = {"machine": info, "config": {k: v for k, v in vars(args).items()},
               "project_id": project_id, "levels": rows,
               "profiles": {k: {kk: vv for kk, vv in v.items()} for k, v in profiles.items()},
               "statements": statements}
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str)
        if args.json == "-":
            sys.stdout.buffer.write(data + b"\n")
        else:
            Path(args.json).write_bytes(data + b"\n")
    if any(r["requests"] == 0 for r in rows):
        return 2
    return 1 if any(r["errors"] or r["warmup_errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
