"""PostgreSQL pool setup (asyncpg; plain SQL, no ORM on hot paths)."""

from __future__ import annotations

import asyncpg
import orjson


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads,
        schema="pg_catalog",
    )


async def create_pool(dsn: str, *, max_size: int, min_size: int = 1) -> asyncpg.Pool:
    """A pool whose connections decode ``jsonb`` with orjson.

    Raises OSError or asyncpg errors when PostgreSQL cannot be reached.
    """
    pool = await asyncpg.create_pool(
        dsn, min_size=min(min_size, max_size), max_size=max_size, init=_init_connection,
        command_timeout=60,
    )
    assert pool is not None
    return pool
