"""``authio migrate`` run twice at once on one empty database, as a retried Kubernetes Job or two
operators would: both succeed and the schema is whole (the advisory lock of
``control_plane/migrations/env.py``; without it, the second fails on a table or type the first
has just created)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.fixtures.database import created_database

ROOT = Path(__file__).resolve().parents[2]
AUTHIO = str(Path(sys.executable).with_name("authio"))


async def _heads(url: str) -> tuple[list[str], int]:
    conn = await asyncpg.connect(url)
    try:
        heads = [r["version_num"] for r in await conn.fetch("SELECT version_num FROM alembic_version")]
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
        return heads, int(tables)
    finally:
        await conn.close()


def test_two_migrators_at_once_both_succeed(database_url: str) -> None:
    with created_database(database_url, "migrate") as url:
        env = {**os.environ, "DATABASE_URL": url}
        runs = [subprocess.Popen([AUTHIO, "migrate"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for _ in range(3)]
        outputs = [(r.returncode, r.communicate(timeout=300)[0]) for r in runs]
        outputs = [(r.returncode, out) for r, (_, out) in zip(runs, outputs, strict=True)]
        assert [code for code, _ in outputs] == [0, 0, 0], outputs
        heads, tables = asyncio.run(_heads(url))
        versions = sorted(p.name.split("_", 1)[0] for p in
                          (ROOT / "control_plane" / "migrations" / "versions").glob("[0-9]*.py"))
        assert len(heads) == 1 and heads[0].startswith(versions[-1]), heads
        assert tables > 20
