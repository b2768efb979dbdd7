"""Passkey login throughput of the control plane (issue 11): logins per second with the software
authenticator of the tests and the bench (devtools/webauthn.py) as the browser.

    .venv/bin/python bench/bench_passkeys.py                  # ~1 min, 2 server processes
    .venv/bin/python bench/bench_passkeys.py --concurrency 16,64 --duration 15 --json /tmp/pk.json

One login is what a browser does: ``POST /v1/auth/passkey/login/options`` ``{}`` (usernameless),
the authenticator signs the challenge (ES256), then ``POST /v1/auth/passkey/login/verify`` with
the assertion, which must answer 200 with ``access_token`` and ``refresh_token``. Latency is the
whole login (both requests plus signing); logins/s counts completed logins.

Set-up reuses ``bench_identity``: the database ``authio_bench`` (migrated), ``--server-processes``
``authio serve control-plane`` processes with ``OTEL_EXPORTER=none``, and a fresh project by
``POST /v1/bootstrap``. *Bench setup* then writes the project's relying party (``localhost``)
and, per worker, a user with one passkey straight into the database (registration is not what
is measured; its ceremony is the tests'). Each worker owns its credential, whose counter counts,
so the server's clone check runs on every login. Closed loop: a worker starts its next login
when the previous one is done, on one keep-alive connection per worker spread round-robin over
the servers; ``--warmup`` seconds unmeasured, then ``--duration`` seconds measured. The client
runs in ``--client-processes`` forked processes on uvloop (``bench_http.RawConnection``); its
CPU and the servers' are reported in cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import secrets
import sys
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import orjson

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_http import (  # noqa: E402
    RawConnection,
    latency_summary,
    measure_cpu,
    pids_cpu_seconds,
    system_cpu,
    wait_for_quiet,
)
from bench_identity import (  # noqa: E402
    DEFAULT_PG,
    DEFAULT_REDIS,
    bootstrap_project,
    ensure_database,
    log,
    migrate,
    postgres_processes,
    server_env,
    start_servers,
    with_db,
)
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from common.ids import new_id  # noqa: E402
from devtools.webauthn import AAGUID, Credential, SoftAuthenticator, cose_key  # noqa: E402

BENCH_DB: Final = "authio_bench"
RP_ID: Final = "localhost"
ORIGIN: Final = "https://localhost"
OPTIONS_PATH: Final = "/v1/auth/passkey/login/options"
VERIFY_PATH: Final = "/v1/auth/passkey/login/verify"
TARGET: Final = 500.0  # issue 11: passkey logins per second on this 2-core machine
USER_AGENT: Final = "authio-bench-passkeys/1"


# --------------------------------------------------------------------------- bench setup


async def make_passkeys(db_url: str, project_id: str, n: int, tag: str) -> list[Credential]:
    """Bench setup: the project's relying party, and ``n`` users with one passkey each (an ES256
    key held by the returned credential)."""
    users, passkeys, credentials = [], [], []
    for i in range(n):
        user_id = new_id("user")
        key = ec.generate_private_key(ec.SECP256R1())
        credential = Credential(secrets.token_bytes(32), RP_ID, user_id.encode(), key)
        users.append((user_id, project_id, f"{tag}-{i}@bench.example.com", True))
        passkeys.append((new_id("pk"), project_id, user_id, credential.credential_id,
                         cose_key(key.public_key()), 0, ["internal"], str(_uuid(AAGUID)), False,
                         False, "bench"))
        credentials.append(credential)
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.execute(
                """INSERT INTO webauthn_settings (project_id, rp_id, rp_name, origins, user_verification)
                   VALUES ($1, $2, 'bench', $3, 'preferred') ON CONFLICT (project_id) DO NOTHING""",
                project_id, RP_ID, [ORIGIN])
            await conn.copy_records_to_table(
                "users", records=users, columns=("id", "project_id", "email", "email_verified"))
            await conn.executemany(
                """INSERT INTO passkeys (id, project_id, user_id, credential_id, public_key,
                       sign_count, transports, aaguid, backup_eligible, backup_state, name)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8::uuid, $9, $10, $11)""", passkeys)
        await conn.execute("ANALYZE users, passkeys")
    finally:
        await conn.close()
    return credentials


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# --------------------------------------------------------------------------- the client


@dataclass
class ProcOut:
    latencies: bytes = b""  # array('d') of whole-login seconds, measured window only
    logins: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    window: float = 0.0


def _request(path: str, host: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def run_clients(cfg: dict[str, Any], credentials: list[Credential], worker_base: int,
                      barrier: Any) -> ProcOut:
    loop = asyncio.get_running_loop()
    servers: list[tuple[str, int]] = cfg["servers"]
    query = f"?project_id={cfg['project_id']}"
    authenticator = SoftAuthenticator(ORIGIN)
    addrs = [servers[(worker_base + w) % len(servers)] for w in range(len(credentials))]
    conns: list[RawConnection] = []
    for host, port in addrs:
        _, proto = await loop.create_connection(RawConnection, host, port)
        conns.append(proto)
    await loop.run_in_executor(None, barrier.wait)
    t_measure = time.perf_counter() + cfg["warmup"]
    t_end = t_measure + cfg["duration"]
    lat = array("d")
    out = ProcOut()
    kinds: Counter[str] = Counter()

    async def worker(w: int) -> None:
        host = f"{addrs[w][0]}:{addrs[w][1]}"
        options_request = _request(OPTIONS_PATH + query, host, b"{}")
        while (t0 := time.perf_counter()) < t_end:
            status, body = await conns[w].request(options_request)
            if status == 200:
                assertion = authenticator.get(orjson.loads(body), credential=credentials[w])
                status, body = await conns[w].request(
                    _request(VERIFY_PATH + query, host, orjson.dumps(assertion)))
            ok = status == 200 and b'"access_token"' in body and b'"refresh_token"' in body
            if t0 >= t_measure:
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    kinds[f"http_{status}"] += 1

    await asyncio.gather(measure_cpu(out, t_measure, t_end),
                         *(worker(w) for w in range(len(credentials))))
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    out.latencies, out.logins = lat.tobytes(), len(lat)
    out.error_kinds, out.errors = dict(kinds), sum(kinds.values())
    return out


def child_main(cfg: dict[str, Any], credentials: list[Credential], worker_base: int,
               barrier: Any, queue: Any) -> None:
    import uvloop

    try:
        res = uvloop.run(run_clients(cfg, credentials, worker_base, barrier))
    except BaseException as exc:  # report instead of hanging the parent
        res = ProcOut(errors=1, error_kinds={f"client_crash_{type(exc).__name__}: {exc}": 1})
        barrier.abort()
    queue.put(res)


def run_level(cfg: dict[str, Any], credentials: list[Credential], processes: int,
              server_pids: list[int]) -> dict[str, Any]:
    """One concurrency level (``len(credentials)`` workers) in ``processes`` client processes."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes + 1)
    queue = ctx.Queue()
    per = [credentials[k::processes] for k in range(processes)]
    children = [ctx.Process(target=child_main, args=(cfg, part, k, barrier, queue))
                for k, part in enumerate(per)]
    for c in children:
        c.start()
    barrier.wait()
    time.sleep(cfg["warmup"])
    cpu0, pg0, box0, t0 = (pids_cpu_seconds(server_pids), _pg_cpu(), system_cpu(),
                           time.monotonic())
    time.sleep(cfg["duration"])
    cpu1, pg1, box1, t1 = (pids_cpu_seconds(server_pids), _pg_cpu(), system_cpu(),
                           time.monotonic())
    results = [queue.get() for _ in children]
    for c in children:
        c.join()
    lat = sorted(x for r in results for x in array("d", r.latencies))
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.error_kinds)
    logins = sum(r.logins for r in results)
    wall = max(t1 - t0, 1e-9)
    servers, client = (cpu1 - cpu0) / wall, sum(r.cpu_seconds / max(r.window, 1e-9) for r in results)
    postgres = sum(pg1[k] - pg0[k] for k in pg1 if k in pg0) / wall
    ncpu = os.cpu_count() or 1
    busy = (box1[0] - box0[0]) / max(box1[1] - box0[1], 1e-9) * ncpu
    return {
        "concurrency": len(credentials), "logins": logins,
        "logins_per_s": logins / cfg["duration"], "latency_ms": latency_summary(lat),
        "errors": dict(errors), "server_cores": servers, "postgres_cores": postgres,
        "client_cores": client, "box_busy_cores": busy,
        "other_cores": max(0.0, busy - servers - postgres - client),
        "cpu_us_per_login": (servers + postgres) / max(logins / cfg["duration"], 1e-9) * 1e6,
    }


def _pg_cpu() -> dict[int, float]:
    """CPU seconds of the bench database's backends and PostgreSQL's shared processes."""
    return {pid: cpu for pid, (kind, cpu) in postgres_processes(BENCH_DB).items()
            if kind in ("bench", "shared")}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_PG))
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS))
    ap.add_argument("--server-processes", type=int, default=2)
    ap.add_argument("--client-processes", type=int, default=1)
    ap.add_argument("--pool-max", type=int, default=None)
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each level, wait up to this many seconds for an idle box")
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()

    levels = [int(c) for c in args.concurrency.split(",")]
    db_url = with_db(args.database_url, BENCH_DB)
    asyncio.run(ensure_database(args.database_url, BENCH_DB, recreate=False))
    migrate(db_url)
    tag = f"benchpk{secrets.token_hex(3)}"
    token = secrets.token_urlsafe(32)
    servers = start_servers(args.server_processes,
                            server_env(db_url, args.redis_url, tag, token, args.pool_max), tag)
    try:
        project_id = asyncio.run(bootstrap_project(servers[0].url, token))
        addrs = [(u.split("//")[1].split(":")[0], int(u.rsplit(":", 1)[1]))
                 for u in (s.url for s in servers)]
        cfg = {"servers": addrs, "project_id": project_id, "warmup": args.warmup,
               "duration": args.duration}
        pids = [s.pid for s in servers if s.pid is not None]
        results = []
        for n in levels:
            credentials = asyncio.run(make_passkeys(db_url, project_id, n, f"{tag}-c{n}"))
            if args.wait_quiet and not wait_for_quiet(args.wait_quiet):
                log(f"the box did not go quiet within {args.wait_quiet:.0f} s; measuring anyway")
            res = run_level(cfg, credentials, min(args.client_processes, n), pids)
            results.append(res)
            lat = res["latency_ms"]
            log(f"c={n}: {res['logins_per_s']:.0f} logins/s (target {TARGET:.0f}), "
                f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, errors {res['errors'] or 0}; "
                f"cores: servers {res['server_cores']:.2f}, PostgreSQL {res['postgres_cores']:.2f}, "
                f"client {res['client_cores']:.2f}, other {res['other_cores']:.2f} "
                f"(box {res['box_busy_cores']:.2f}); {res['cpu_us_per_login']:.0f} µs CPU/login")
    finally:
        for s in servers:
            s.stop()
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "server_processes": args.server_processes, "duration_s": args.duration,
              "results": results}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
