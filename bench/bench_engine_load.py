"""How long an engine takes from start to ready on a big store, and what it costs in memory.

    python bench/bench_engine_load.py --dataset bench/data/large [--database-url URL]

Creates a scratch database on the server of ``--database-url`` (default ``$DATABASE_URL`` or the
local PostgreSQL), migrates it, bulk-copies the dataset's tuples into one store (COPY: this times
the engine, not the write API; ``bench/load.py`` times the API), then starts a
``StoreRegistry`` (LISTEN, snapshot through COPY, graph build, catch-up) and times it until ready.
Reports seconds to ready, tuples/s, and resident memory before and after (bytes per tuple).
The scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control_plane.migrate import upgrade
from engine.registry import StoreRegistry


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
    args = parser.parse_args()

    name = f"authio_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(_with_db(args.database_url, "postgres"))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(args.database_url, name)
    try:
        await asyncio.to_thread(upgrade, url)
        t0 = time.perf_counter()
        store_id, count = await _seed(url, args.dataset / "tuples.jsonl")
        seed_s = time.perf_counter() - t0

        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        assert pool is not None
        rss0 = _rss_bytes()
        registry = StoreRegistry(pool=pool, dsn=url, poll_seconds=60.0)
        t0 = time.perf_counter()
        registry.start()
        assert await registry.wait_ready(600.0)
        ready_s = time.perf_counter() - t0
        rss1 = _rss_bytes()
        store = registry.peek(store_id)
        assert store is not None and len(store.graph) == count
        await registry.close()
        await pool.close()
        result = {
            "dataset": str(args.dataset), "tuples": count, "seed_seconds": round(seed_s, 2),
            "start_to_ready_seconds": round(ready_s, 2),
            "tuples_per_second": round(count / ready_s),
            "rss_growth_bytes_per_tuple": round((rss1 - rss0) / count, 1),
            "rss_after_mib": round(rss1 / 2**20, 1),
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    asyncio.run(main())
