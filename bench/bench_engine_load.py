"""How long an engine takes from start to ready on a big store, and what it costs in memory.

    python bench/bench_engine_load.py --dataset bench/data/large [--database-url URL]

Creates a scratch database on the server of ``--database-url`` (default ``$DATABASE_URL`` or the
local PostgreSQL), migrates it, bulk-copies the dataset's tuples into one store (COPY: this times
the engine, not the write API; ``bench/load.py`` times the API), then starts a
``StoreRegistry`` (LISTEN, snapshot through COPY, graph build, catch-up) and times it until ready.
Reports seconds to ready (the best of ``--rounds`` starts), the engine process's CPU seconds
meanwhile (steadier on a shared machine; PostgreSQL's own work is not in it), tuples/s, and
resident memory before and after the last start (bytes per tuple).
The scratch database is dropped at the end, unless ``--keep-db NAME`` (seeded once, reused by
later runs: for A/B with ``--engine-root``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import secrets
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson


def _engine_root(argv: list[str]) -> str:
    """``--engine-root DIR`` (read before the imports below): whose engine to time, so an old
    checkout and a new one can be compared A/B in the same run."""
    for i, a in enumerate(argv):
        if a == "--engine-root" and i + 1 < len(argv):
            return str(Path(argv[i + 1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _engine_root(sys.argv))

from control_plane.migrate import upgrade  # noqa: E402
from engine.registry import StoreRegistry  # noqa: E402


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _with_db(url: str, db: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + db))


async def _seed(url: str, tuples_file: Path) -> tuple[str, int]:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO tenants (id, name) VALUES ('ten_bench', 'bench');"
            "INSERT INTO projects (id, tenant_id, name, environment) "
            "VALUES ('proj_bench', 'ten_bench', 'bench', 'bench');"
            "INSERT INTO stores (id, project_id, name, revision) "
            "VALUES ('store_bench', 'proj_bench', 'bench', 1)"
        )
        rows = []
        with tuples_file.open("rb") as f:
            for line in f:
                t = orjson.loads(line)
                rows.append(("store_bench", t["object"], t["relation"], t["user"], 1))
        await conn.copy_records_to_table(
            "tuples", records=rows, columns=["store_id", "object", "relation", "subject", "revision"]
        )
        return "store_bench", len(rows)
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, default=Path("bench/data/large"))
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--engine-root", type=Path, default=None,
                        help="checkout whose engine is timed (default: this one)")
    parser.add_argument("--db-prefix", default="authio_bench",
                        help="scratch database name prefix (a random suffix is added)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="start the registry this many times on the same data (best kept)")
    parser.add_argument("--keep-db", default=None, metavar="NAME",
                        help="use this database (created and seeded when absent) and keep it, so "
                             "A/B runs skip the seeding; drop it yourself at the end")
    args = parser.parse_args()

    name = args.keep_db or f"{args.db_prefix}_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(_with_db(args.database_url, "postgres"))
    exists = args.keep_db and await admin.fetchval(
        "SELECT 1 FROM pg_database WHERE datname = $1", name)
    if not exists:
        await admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(args.database_url, name)
    try:
        seed_s = 0.0
        if exists:
            conn = await asyncpg.connect(url)
            store_id = "store_bench"
            count = await conn.fetchval("SELECT count(*) FROM tuples WHERE store_id = $1", store_id)
            await conn.close()
        else:
            await asyncio.to_thread(upgrade, url)
            t0 = time.perf_counter()
            store_id, count = await _seed(url, args.dataset / "tuples.jsonl")
            seed_s = time.perf_counter() - t0

        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        assert pool is not None
        best_s = best_cpu = float("inf")
        rss0 = rss1 = 0
        for _ in range(max(1, args.rounds)):
            gc.collect()
            rss0 = _rss_bytes()
            registry = StoreRegistry(pool=pool, dsn=url, poll_seconds=60.0)
            t0, c0 = time.perf_counter(), time.process_time()
            registry.start()
            assert await registry.wait_ready(600.0)
            ready_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            rss1 = _rss_bytes()
            store = registry.peek(store_id)
            assert store is not None and len(store.graph) == count
            await registry.close()
            del registry, store
            gc.unfreeze()
            best_s, best_cpu = min(best_s, ready_s), min(best_cpu, cpu_s)
        await pool.close()
        result = {
            "dataset": str(args.dataset), "tuples": count, "seed_seconds": round(seed_s, 2),
            "start_to_ready_seconds": round(best_s, 2),
            "engine_cpu_seconds": round(best_cpu, 2),
            "tuples_per_second": round(count / best_s),
            "rss_growth_bytes_per_tuple": round((rss1 - rss0) / count, 1),
            "rss_after_mib": round(rss1 / 2**20, 1),
        }
    finally:
        if not args.keep_db:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    asyncio.run(main())
