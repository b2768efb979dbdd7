"""Data-subject deletion of a user with a long history, with audit writes going on (issue 21).

    python bench/bench_dsr.py [--user-events 100000] [--other-events 1000000] [--decisions 1000]
                              [--writers 4] [--json PATH]

Target: the deletion of a user with 100,000 audit events fulfilled in under 5 s, and no
concurrent audit write held up longer than 100 ms.

1. A scratch database ``authio_bench_dsr`` (recreated, migrated) and one ``authio serve
   control-plane`` (``bench_identity``'s helpers); a project bootstrapped; the user created by
   ``POST /v1/users``.
2. Its history written straight into the log: ``--user-events`` events naming it (``user_id``,
   metadata ``user_email``, the address in the description), ``--other-events`` of other users
   around them (the log a deletion has to find them in), ``--decisions`` risk decisions; then
   ``ANALYZE`` (what the control plane's statistics pass does).
3. ``--writers`` clients write audit events through the API (``POST /v1/users``, one
   ``user.created`` each) for 3 s before the deletion, during it, and 3 s after; each
   request's latency is kept with the phase it started in.
4. ``POST /v1/compliance/dsr`` then ``.../fulfill``, timed, while ``pg_stat_activity`` is
   sampled every 5 ms for audit inserts waiting on a lock (what "blocked" means; their latency
   is reported apart, and on a shared two-core box it also measures CPU contention); then SQL
   checks that nothing in the log or the risk decisions names the user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_identity import (  # noqa: E402  (the bench's own helpers, beside this file)
    ensure_database,
    log,
    migrate,
    server_env,
    start_servers,
    with_db,
)
from bench_outbound import api, pct  # noqa: E402

from common.ids import new_id  # noqa: E402

DB = "authio_bench_dsr"
TOKEN = "bench-dsr-" + secrets.token_hex(16)
TARGET_SECONDS = 5.0
TARGET_BLOCK_MS = 100.0
COLUMNS = ("id", "created_at", "action", "actor_type", "actor_id", "user_id", "project_id",
           "target_type", "target_id", "ip", "user_agent", "description", "metadata")


async def bootstrap(url: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/bootstrap", headers={"X-Service-Bootstrap-Token": TOKEN},
            json={"tenant_name": "bench dsr", "project_name": "dsr", "environment": "bench"}) as r:
        doc = await r.json()
        return doc["project"]["id"], doc["api_key"]["secret"]


async def seed(db_url: str, project_id: str, user_id: str, address: str, args: argparse.Namespace) -> float:
    """The user's history and the log around it; seconds taken."""
    started = time.monotonic()
    conn = await asyncpg.connect(db_url)
    now = datetime.now(UTC)
    span = timedelta(days=80).total_seconds()
    try:
        def rows(n: int, mine: bool, seed: int) -> list[tuple[Any, ...]]:
            out = []
            for i in range(n):
                at = now - timedelta(seconds=span * ((i * 7919 + seed) % n) / n + 1)
                who, mail = (user_id, address) if mine else (f"user_{new_id('evt')[4:]}",
                                                             f"someone{i}@example.org")
                out.append((new_id("evt"), at, "auth.signin_attempt", "user", who, who, project_id,
                            "session", new_id("sess"), "203.0.113.7", "Mozilla/5.0",
                            f"Sign-in attempt for {mail}",
                            orjson.dumps({"user_email": mail, "ip": "203.0.113.7",
                                          "description": f"Sign-in attempt for {mail}",
                                          "score": 10}).decode()))
            return out
        for start in range(0, args.other_events, 100_000):
            await conn.copy_records_to_table("audit_events", columns=COLUMNS,
                                             records=rows(min(100_000, args.other_events - start), False, start))
        for start in range(0, args.user_events, 50_000):
            await conn.copy_records_to_table("audit_events", columns=COLUMNS,
                                             records=rows(min(50_000, args.user_events - start), True, start))
        await conn.execute(
            """INSERT INTO risk_decisions (id, project_id, user_id, method, score, decision, signals,
                                           reasons, inputs)
               SELECT 'rd_' || substr(md5(g::text || $3), 1, 26), $1, $2, 'magic_link', 10, 'allow',
                      '[]'::jsonb, '{}', '{"ip": "203.0.113.7", "user_agent": "Mozilla/5.0"}'::jsonb
               FROM generate_series(1, $4) g""", project_id, user_id, secrets.token_hex(4), args.decisions)
        await conn.execute("ANALYZE audit_events")
    finally:
        await conn.close()
    return time.monotonic() - started


async def writers(url: str, key: str, n: int, phase: list[str], stop: asyncio.Event,
                  latencies: dict[str, list[float]]) -> None:
    async def one(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            started, at = time.monotonic(), phase[0]
            await api(http, url, key, "POST", "/v1/users",
                      {"email": f"w-{secrets.token_hex(6)}@example.net"})
            latencies.setdefault(at, []).append((time.monotonic() - started) * 1000)
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one(http) for _ in range(n)))


async def lock_waits(db_url: str, stop: asyncio.Event) -> dict[str, Any]:
    """How long audit writes waited on a lock while ``stop`` is unset: ``pg_stat_activity``
    sampled every 5 ms; a wait is seen from its first to its last sample (so a wait shorter
    than 5 ms may be missed, and each is under-counted by up to 5 ms)."""
    conn = await asyncpg.connect(db_url)
    seen: dict[tuple[int, datetime], list[float]] = {}
    try:
        while not stop.is_set():
            now = time.monotonic()
            for r in await conn.fetch(
                    """SELECT pid, query_start, wait_event FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'
                         AND query ILIKE '%INSERT INTO audit_events%'"""):
                seen.setdefault((r["pid"], r["query_start"]), [now, now])[1] = now
            await asyncio.sleep(0.005)
    finally:
        await conn.close()
    waits = [(last - first) * 1000 for first, last in seen.values()]
    return {"waits_seen": len(waits), "longest_ms": round(max(waits), 1) if waits else 0.0}


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(pct(values, 50), 1), "p99_ms": round(pct(values, 99), 1),
            "max_ms": round(max(values), 1)} if values else {"n": 0}


async def run(args: argparse.Namespace, url: str, db_url: str) -> dict[str, Any]:
    project_id, key = await bootstrap(url)
    address = f"subject-{secrets.token_hex(4)}@example.com"
    async with aiohttp.ClientSession() as http:
        user_id = (await api(http, url, key, "POST", "/v1/users", {"email": address}))["id"]
    log(f"seeding {args.user_events:,} events of the user among {args.other_events:,} others")
    seeded = await seed(db_url, project_id, user_id, address, args)
    log(f"seeded in {seeded:.1f} s")
    phase, stop, latencies = ["before"], asyncio.Event(), {}
    load = asyncio.create_task(writers(url, key, args.writers, phase, stop, latencies))
    await asyncio.sleep(3)
    async with aiohttp.ClientSession() as http:
        made = await api(http, url, key, "POST", "/v1/compliance/dsr",
                         {"request_type": "deletion", "user_email": address})
        phase[0] = "during"
        watching = asyncio.Event()
        watch = asyncio.create_task(lock_waits(db_url, watching))
        started = time.monotonic()
        done = await api(http, url, key, "POST", f"/v1/compliance/dsr/{made['dsr_id']}/fulfill", {})
        took = time.monotonic() - started
        phase[0] = "after"
        watching.set()
        locks = await watch
    await asyncio.sleep(3)
    stop.set()
    await load
    conn = await asyncpg.connect(db_url)
    try:
        left = await conn.fetchval(
            """SELECT count(*) FROM audit_events WHERE project_id = $1 AND (user_id = $2 OR actor_id = $2
               OR metadata::text ILIKE $3 OR description ILIKE $3)""", project_id, user_id, f"%{address}%")
        decisions = await conn.fetchval("SELECT count(*) FROM risk_decisions WHERE user_id = $1", user_id)
    finally:
        await conn.close()
    writes = {k: summary(v) for k, v in latencies.items()}
    return {
        "user_events": args.user_events, "other_events": args.other_events,
        "decisions": args.decisions, "writers": args.writers,
        "deletion_seconds": round(took, 2), "meets_time": took < TARGET_SECONDS,
        "answer": {k: done[k] for k in ("deleted", "anonymized", "user_found")},
        "status": done["dsr"]["status"], "events_still_naming_the_user": left,
        "decisions_still_naming_the_user": decisions,
        "audit_writes": writes,
        "audit_write_lock_waits": locks,
        "meets_block": locks["longest_ms"] < TARGET_BLOCK_MS,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--user-events", type=int, default=100_000)
    ap.add_argument("--other-events", type=int, default=1_000_000)
    ap.add_argument("--decisions", type=int, default=1_000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    asyncio.run(ensure_database(args.database_url, DB, recreate=True))
    db_url = with_db(args.database_url, DB)
    migrate(db_url)
    env = server_env(db_url, args.redis_url, "bench-dsr", TOKEN, None)
    [server] = start_servers(1, env, "bench-dsr")
    try:
        out = asyncio.run(run(args, server.url, db_url))
    finally:
        server.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
