"""OAuth callbacks per second against a local OpenID Connect provider (issue 11).

    .venv/bin/python bench/bench_oauth.py                    # ~1 min, 2 server processes
    .venv/bin/python bench/bench_oauth.py --authorizations 4000 --concurrency 1,16,64 --json /tmp/oauth.json

What it does, in order:

1. **Database and servers** as ``bench_identity.py`` sets them up (its helpers, imported): the
   database ``authio_bench_oauth`` on ``--database-url`` (migrated), ``--server-processes`` ``authio
   serve control-plane`` processes on free ports, a fresh project by ``POST /v1/bootstrap``.
   Every server has ``SERVICE_BASE_URL=http://localhost:9``: the callback URL registered at the
   provider is the same whichever server answers, and the bench sends each callback to a real
   server itself (any server can: the state is in PostgreSQL).
2. **Provider**: the tests' ``oidc-provider`` (``tests/oauth/peers.py``: the npm package, one
   node process), configured as the generic provider ``bench`` with ``PUT
   /v1/oauth/providers/bench``. The service reaches it directly (no test proxy in between).
3. **Bench setup, not measured**: ``--authorizations`` completed authorizations per level, made
   as browsers make them (16 at a time, each sign-in with a cookie jar of its own): ``GET
   /v1/auth/oauth/bench/start``, the provider's ``/auth``, the login (the tests' non-interactive
   interaction) and the redirect to the callback, which is *not* followed: its URL (``code`` and
   ``state``) and the ``oauth_browser`` cookie are kept. Codes live 600 s at this provider.
   Level ``new`` uses a new provider account for each (the callback creates the user and links
   the identity); level ``returning`` signs the same accounts in again (the identity finds the
   user).
4. **Measured**: the callbacks, closed loop, ``--concurrency`` workers (one keep-alive aiohttp
   connection each, spread round-robin over the servers), each sending ``GET
   /v1/auth/oauth/bench/callback?code=&state=`` with the cookie and ``Accept: application/json``
   until the prepared callbacks run out. One callback is: the state taken (one ``DELETE``), the
   provider's configuration read and its secret opened, the code exchanged at the provider's
   token endpoint (HTTP to node: PKCE verifier, client_secret_basic), the ID token validated
   (PyJWT, RS256, the JWKS cached after the first), then the sign-in transaction (identity, user,
   session, refresh token, audit event) and the access token signed. Every answer must be 200
   with an ``access_token``. Reported: callbacks/s, p50/p99 latency, errors, and CPU in cores
   over the window: the servers, the node provider, this process (the client), PostgreSQL (the
   bench database's backends and the shared processes), ``other`` (the rest of the machine:
   other people's work) and the machine's busy total. Each level waits (up to 60 s) for the
   machine to be quiet first (``quiet_before``).

The client is aiohttp in this process and the provider a single node process: both share the
machine with the servers and PostgreSQL, and their CPU is measured, not assumed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urljoin, urlsplit

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402
from bench_http import (  # noqa: E402
    CLK_TCK,
    latency_summary,
    pids_cpu_seconds,
    system_cpu,
    wait_for_quiet,
)
from bench_identity import (  # noqa: E402
    DEFAULT_PG,
    DEFAULT_REDIS,
    ensure_database,
    log,
    migrate,
    pg_cpu_delta,
    postgres_processes,
    server_env,
    start_servers,
    with_db,
)

from tests.oauth.peers import CLIENT_ID, CLIENT_SECRET, OidcPeer, oidc_provider  # noqa: E402

BENCH_DB: Final = "authio_bench_oauth"
"""A database of its own: another branch's bench may have migrated ``authio_bench`` to a
schema of its own."""
PUBLIC_BASE: Final = "http://localhost:9"
PROVIDER: Final = "bench"
CALLBACK_PREFIX: Final = f"{PUBLIC_BASE}/v1/auth/oauth/{PROVIDER}/callback"
APP_REDIRECT: Final = "https://app.example.com/signed-in"
PREP_CONCURRENCY: Final = 16


async def bootstrap(url: str, token: str) -> tuple[str, str]:
    """(project id, full-access API key) of a new project."""
    body = {"tenant_name": "bench oauth", "project_name": f"bench oauth {time.strftime('%H:%M:%S')}",
            "environment": "bench"}
    async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/bootstrap", json=body, headers={"X-Service-Bootstrap-Token": token}) as r:
        doc = await r.json()
        if r.status != 201:
            raise RuntimeError(f"bootstrap failed: {r.status} {doc}")
        return str(doc["project"]["id"]), str(doc["api_key"]["secret"])


async def configure(url: str, key: str, issuer: str) -> None:
    body = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
            "redirect_uris": [APP_REDIRECT], "issuer": issuer}
    async with aiohttp.ClientSession() as http, http.put(
            f"{url}/v1/oauth/providers/{PROVIDER}", json=body,
            headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status not in (200, 201):
            raise RuntimeError(f"configuring the provider failed: {r.status} {await r.text()}")


async def authorize_one(http: aiohttp.ClientSession, server: str, project_id: str,
                        account: str) -> tuple[str, str]:
    """One completed authorization: (the callback's path and query, the oauth_browser cookie)."""
    query = urlencode({"project_id": project_id, "redirect_uri": APP_REDIRECT})
    async with http.get(f"{server}/v1/auth/oauth/{PROVIDER}/start?{query}",
                        allow_redirects=False) as r:
        if r.status != 302:
            raise RuntimeError(f"start answered {r.status}: {await r.text()}")
        url, binding = r.headers["Location"], r.cookies["oauth_browser"].value
    for _ in range(10):
        if url.startswith(CALLBACK_PREFIX):
            parts = urlsplit(url)
            return f"{parts.path}?{parts.query}", binding
        if "/interaction/" in url:
            url += "?" + urlencode({"account": account})
        async with http.get(url, allow_redirects=False) as r:
            if r.status not in (302, 303):
                raise RuntimeError(f"the provider answered {r.status}: {await r.text()}")
            url = urljoin(url, r.headers["Location"])
    raise RuntimeError("the provider never redirected to the callback")


async def prepare(peer: OidcPeer, server: str, project_id: str,
                  accounts: list[str]) -> list[tuple[str, str]]:
    """A completed authorization per account, in order (bench setup)."""
    out: list[tuple[str, str] | None] = [None] * len(accounts)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        connector = aiohttp.TCPConnector()
        while next_index < len(accounts):
            i = next_index
            next_index += 1
            # A browser of its own for each: the provider's session cookie would otherwise sign
            # the next account in as the previous one, and end the previous one's session,
            # which voids its unredeemed code (invalid_grant).
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                             connector=connector, connector_owner=False) as http:
                out[i] = await authorize_one(http, server, project_id, accounts[i])
        await connector.close()

    await asyncio.gather(*(worker() for _ in range(PREP_CONCURRENCY)))
    return [item for item in out if item is not None]


async def measure(servers: list[str], items: list[tuple[str, str]], concurrency: int,
                  pids: list[int], node_pid: int) -> dict[str, Any]:
    """Send every prepared callback, ``concurrency`` at a time; the level's figures."""
    latencies: list[float] = []
    errors: list[str] = []
    next_index = 0

    async def worker(k: int) -> None:
        nonlocal next_index
        server = servers[k % len(servers)]
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as http:
            while next_index < len(items):
                path, binding = items[next_index]
                next_index += 1
                began = time.perf_counter()
                async with http.get(server + path, allow_redirects=False, headers={
                        "Accept": "application/json", "Cookie": f"oauth_browser={binding}"}) as r:
                    body = await r.read()
                latencies.append(time.perf_counter() - began)
                if r.status != 200 or b'"access_token"' not in body:
                    errors.append(f"{r.status} {body[:200]!r}")

    quiet = await asyncio.to_thread(wait_for_quiet, 60.0)
    pg_before = postgres_processes(BENCH_DB)
    cpu_servers, cpu_node = pids_cpu_seconds(pids), pids_cpu_seconds([node_pid])
    cpu_client, (busy, _) = time.process_time(), system_cpu()  # the node child apart
    began = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    elapsed = time.perf_counter() - began
    cpu_servers = pids_cpu_seconds(pids) - cpu_servers
    cpu_node = pids_cpu_seconds([node_pid]) - cpu_node
    cpu_client = time.process_time() - cpu_client
    busy = (system_cpu()[0] - busy) / CLK_TCK
    pg = pg_cpu_delta(pg_before, postgres_processes(BENCH_DB), exclude=set())
    latencies.sort()
    summary = latency_summary(latencies)
    return {"concurrency": concurrency, "callbacks": len(items), "errors": len(errors),
            "first_errors": errors[:3], "seconds": round(elapsed, 2),
            "per_second": round(len(items) / elapsed, 1),
            "p50_ms": round(summary["p50"], 2), "p99_ms": round(summary["p99"], 2),
            "server_cores": round(cpu_servers / elapsed, 2),
            "node_cores": round(cpu_node / elapsed, 2),
            "client_cores": round(cpu_client / elapsed, 2),
            "postgres_cores": round((pg["bench"] + pg["shared"]) / elapsed, 2),
            "machine_busy_cores": round(busy / elapsed, 2),
            "other_cores": round((busy - cpu_servers - cpu_node - cpu_client - pg["bench"]
                                  - pg["shared"]) / elapsed, 2),
            "quiet_before": quiet}


async def run(args: argparse.Namespace, servers: list[str], pids: list[int],
              bootstrap_token: str) -> list[dict[str, Any]]:
    project_id, key = await bootstrap(servers[0], bootstrap_token)
    rows: list[dict[str, Any]] = []
    async with oidc_provider([CALLBACK_PREFIX], direct=True) as peer:
        await configure(servers[0], key, peer.issuer)
        for concurrency in args.concurrency:
            accounts = [await peer.account(email=f"oauth-{secrets.token_hex(6)}@bench.example.com")
                        for _ in range(args.authorizations)]
            for kind in ("new", "returning"):
                log(f"c={concurrency} {kind}: preparing {len(accounts)} authorizations")
                items = await prepare(peer, servers[0], project_id, accounts)
                log(f"c={concurrency} {kind}: measuring")
                row = {"kind": kind, **await measure(servers, items, concurrency, pids, peer.pid)}
                log(json.dumps(row))
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--database-url", default=DEFAULT_PG)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--server-processes", type=int, default=2)
    parser.add_argument("--authorizations", type=int, default=2000,
                        help="completed authorizations per level (default 2000)")
    parser.add_argument("--concurrency", default="1,16,64",
                        type=lambda v: [int(x) for x in v.split(",")])
    parser.add_argument("--recreate-db", action="store_true")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    db_url = with_db(args.database_url, BENCH_DB)
    asyncio.run(ensure_database(args.database_url, BENCH_DB, args.recreate_db))
    migrate(db_url)
    tag = f"bench-oauth-{secrets.token_hex(3)}"
    bootstrap_token = secrets.token_urlsafe(32)
    env = server_env(db_url, args.redis_url, tag, bootstrap_token, None)
    env["SERVICE_BASE_URL"] = PUBLIC_BASE
    servers = start_servers(args.server_processes, env, tag)
    try:
        rows = asyncio.run(run(args, [s.url for s in servers],
                               [s.pid for s in servers if s.pid is not None], bootstrap_token))
    finally:
        for s in servers:
            s.stop()
    print(f"{'kind':<10} {'conc':>4} {'callbacks':>9} {'per s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'errors':>6} {'servers':>7} {'node':>5} {'client':>6} {'pg':>5} {'other':>5} {'busy':>5}")
    for r in rows:
        print(f"{r['kind']:<10} {r['concurrency']:>4} {r['callbacks']:>9} {r['per_second']:>7} "
              f"{r['p50_ms']:>7} {r['p99_ms']:>7} {r['errors']:>6} {r['server_cores']:>7} "
              f"{r['node_cores']:>5} {r['client_cores']:>6} {r['postgres_cores']:>5} "
              f"{r['other_cores']:>5} {r['machine_busy_cores']:>5}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
