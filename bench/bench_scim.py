"""A directory of N users pushed through SCIM ``Users`` POST and PATCH (issue 23).

    python bench/bench_scim.py [--users 10000] [--concurrency 32] [--servers 1] [--json PATH]

Target: >= 300 users/s for 10,000 users, each provisioned (``POST /scim/v2/Users``, a user with
its enrollment message, the membership, the directory's attributes and the events) and then
changed by a PATCH the way Microsoft Entra ID sends one (its e-mail address and family name by
path, ``Replace``), on two cores shared by the server(s), PostgreSQL and this client.

1. A scratch database ``authio_bench_scim`` (recreated, migrated) and ``--servers``
   ``authio serve control-plane`` processes (``bench_identity``'s helpers); a project
   bootstrapped, an organization, and its SCIM token.
2. ``--concurrency`` workers (one aiohttp session, requests spread over the servers) take
   users off a queue: POST the user, then PATCH it. Timed from the first request to the last
   answer; every answer must be 201 then 200.
3. Checked by SQL: the organization has N members with N directory rows, the project N users,
   and the audit log 2N ``scim.user.synced`` events. The figure is N / elapsed seconds (a user
   counts once both of its requests were answered), with the latency percentiles of each kind
   and the CPU the server(s) and PostgreSQL used (cores over the run), the whole machine's and
   the rest (``other_cores``: other people's work on a shared machine), and the 1-minute load
   average before and after.

Prints a JSON summary (``--json`` writes it too); the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_http import system_cpu, wait_for_quiet  # noqa: E402
from bench_identity import (  # noqa: E402  (the bench's own helpers, beside this file)
    ensure_database,
    log,
    migrate,
    pg_cpu_delta,
    postgres_processes,
    server_env,
    start_servers,
    with_db,
)

DB = "authio_bench_scim"
TOKEN = "bench-scim-" + secrets.token_hex(16)
TARGET_USERS_PER_SECOND = 300.0
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def user_body(i: int, run: str) -> dict[str, Any]:
    """User ``i`` as Microsoft Entra ID provisions one (its tutorial's "Create User")."""
    address = f"bench-{run}-{i}@example.com"
    return {"schemas": [USER, ENTERPRISE], "externalId": f"{run}-{i:06d}",
            "userName": address, "active": True,
            "emails": [{"primary": True, "type": "work", "value": address}],
            "meta": {"resourceType": "User"},
            "name": {"formatted": f"Given{i} Family{i}", "familyName": f"Family{i}",
                     "givenName": f"Given{i}"},
            "roles": [], ENTERPRISE: {"department": f"Dept {i % 20}"}}


def patch_body(i: int, run: str) -> dict[str, Any]:
    """Entra's "Update User [Multi-valued properties]": a new address and family name."""
    return {"schemas": [PATCH], "Operations": [
        {"op": "Replace", "path": 'emails[type eq "work"].value',
         "value": f"bench-{run}-{i}-moved@example.com"},
        {"op": "Replace", "path": "name.familyName", "value": f"Moved{i}"}]}


async def setup(url: str) -> tuple[str, str, str]:
    """A project, an organization and its SCIM token: (project id, org id, token)."""
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/bootstrap", headers={"X-Service-Bootstrap-Token": TOKEN},
                             json={"tenant_name": "bench scim", "project_name": "bench scim",
                                   "environment": "bench"}) as r:
            doc = await r.json()
            assert r.status == 201, doc
        project, key = doc["project"]["id"], doc["api_key"]["secret"]
        auth = {"Authorization": f"Bearer {key}"}
        async with http.post(url + "/v1/organizations", headers=auth,
                             json={"name": "Directory", "slug": "directory"}) as r:
            org = (await r.json())["id"]
        async with http.post(url + f"/v1/organizations/{org}/scim-token", headers=auth,
                             json={}) as r:
            token = (await r.json())["token"]
    return project, org, token


async def push(urls: list[str], token: str, users: int, concurrency: int,
               run: str) -> dict[str, Any]:
    """Every user POSTed then PATCHed by ``concurrency`` workers; timings."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(users):
        queue.put_nowait(i)
    latencies: dict[str, list[float]] = {"post": [], "patch": []}
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/scim+json"}
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def worker(k: int) -> None:
            base = urls[k % len(urls)] + "/scim/v2"
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                async with http.post(base + "/Users", data=json.dumps(user_body(i, run))) as r:
                    body = await r.read()
                    if r.status != 201:
                        failures.append(f"POST {i}: {r.status} {body[:300]!r}")
                        continue
                    uid = json.loads(body)["id"]
                t1 = time.perf_counter()
                async with http.patch(f"{base}/Users/{uid}",
                                      data=json.dumps(patch_body(i, run))) as r:
                    body = await r.read()
                    if r.status != 200:
                        failures.append(f"PATCH {i}: {r.status} {body[:300]!r}")
                t2 = time.perf_counter()
                latencies["post"].append(t1 - t0)
                latencies["patch"].append(t2 - t1)

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"elapsed": elapsed, "latencies": latencies, "failures": failures}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    q = statistics.quantiles(values, n=100)
    return {"p50_ms": round(q[49] * 1000, 1), "p95_ms": round(q[94] * 1000, 1),
            "p99_ms": round(q[98] * 1000, 1), "max_ms": round(max(values) * 1000, 1)}


async def verify(db_url: str, project: str, org: str) -> dict[str, int]:
    conn = await asyncpg.connect(db_url)
    try:
        return {
            "members": await conn.fetchval(
                "SELECT count(*) FROM memberships WHERE organization_id = $1", org),
            "directory_rows": await conn.fetchval(
                "SELECT count(*) FROM scim_users WHERE organization_id = $1", org),
            "moved_addresses": await conn.fetchval(
                "SELECT count(*) FROM users WHERE project_id = $1 AND email LIKE '%-moved@%'",
                project),
            "synced_events": await conn.fetchval(
                """SELECT count(*) FROM audit_events
                   WHERE project_id = $1 AND action = 'scim.user.synced'""", project),
        }
    finally:
        await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--quiet-wait", type=float, default=300.0,
                    help="before the run, wait up to this many seconds for the machine to be "
                         "idle (other people's tests); 0: do not wait")
    ap.add_argument("--keep-database", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    asyncio.run(ensure_database(args.database_url, DB, recreate=True))
    db_url = with_db(args.database_url, DB)
    migrate(db_url)
    env = server_env(db_url, args.redis_url, "bench-scim", TOKEN, None)
    servers = start_servers(args.servers, env, "bench-scim")
    try:
        project, org, token = asyncio.run(setup(servers[0].url))
        if args.quiet_wait:
            wait_for_quiet(args.quiet_wait)
        procs = [psutil.Process(s.pid) for s in servers if s.pid is not None]
        cpu_before = [p.cpu_times() for p in procs]
        me = psutil.Process()
        client_before, machine_before = me.cpu_times(), system_cpu()
        load_before = os.getloadavg()
        pg_before = postgres_processes(DB)
        wall = time.perf_counter()
        log(f"pushing {args.users} users through {len(servers)} server(s), "
            f"{args.concurrency} at a time")
        result = asyncio.run(push([s.url for s in servers], token, args.users, args.concurrency,
                                  secrets.token_hex(3)))
        wall = time.perf_counter() - wall
        server_cpu = sum((a.user + a.system) - (b.user + b.system)
                         for a, b in zip((p.cpu_times() for p in procs), cpu_before, strict=True))
        pg_cpu = {kind: round(seconds / wall, 2) for kind, seconds in
                  pg_cpu_delta(pg_before, postgres_processes(DB), set()).items()}
        client_after, machine_after = me.cpu_times(), system_cpu()
        load_after = os.getloadavg()
        client_cpu = (client_after.user + client_after.system
                      - client_before.user - client_before.system)
        busy = (psutil.cpu_count() or 1) * (machine_after[0] - machine_before[0]) / max(
            machine_after[1] - machine_before[1], 1e-9)
        checked = asyncio.run(verify(db_url, project, org))
    finally:
        for s in servers:
            s.stop()
        if not args.keep_database:
            asyncio.run(drop(args.database_url))
    rate = args.users / result["elapsed"]
    out = {
        "users": args.users, "concurrency": args.concurrency, "servers": args.servers,
        "elapsed_s": round(result["elapsed"], 2), "users_per_s": round(rate, 1),
        "requests_per_s": round(2 * args.users / result["elapsed"], 1),
        "target_users_per_s": TARGET_USERS_PER_SECOND,
        "met": rate >= TARGET_USERS_PER_SECOND and not result["failures"],
        "post": percentiles(result["latencies"]["post"]),
        "patch": percentiles(result["latencies"]["patch"]),
        "server_cores": round(server_cpu / wall, 2), "postgres_cores": pg_cpu,
        "client_cores": round(client_cpu / wall, 2), "machine_busy_cores": round(busy, 2),
        "other_cores": round(busy - server_cpu / wall - pg_cpu["bench"] - pg_cpu["shared"]
                             - client_cpu / wall, 2),
        "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "failures": len(result["failures"]), "first_failures": result["failures"][:5],
        "checked": checked,
        "checks_pass": checked == {"members": args.users, "directory_rows": args.users,
                                   "moved_addresses": args.users,
                                   "synced_events": 2 * args.users},
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


async def drop(admin_url: str) -> None:
    conn = await asyncpg.connect(with_db(admin_url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
