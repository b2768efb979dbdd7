"""Helpers of the compliance tests: a webhook receiver that records what it is sent, and the
walk over every text column of the schema that finds what still names a user."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from tests.fixtures.service import loopback_app

TEXT_TYPES = ("text", "character varying", "jsonb", "json", "ARRAY", "bytea")


@contextlib.asynccontextmanager
async def receiver(status: int) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A webhook receiver on loopback that answers ``status`` to everything; yields its URL
    and the bodies it was sent."""
    bodies: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    async with loopback_app(app) as port:
        yield f"http://127.0.0.1:{port}/hooks", bodies


async def naming(db: asyncpg.Pool, needles: list[str]) -> list[str]:
    """``table.column`` of every row, in every table of the schema, whose text holds one of
    ``needles`` (case-insensitively; a ``bytea`` column: whose bytes hold one, as UTF-8)."""
    columns = await db.fetch(
        """SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
           JOIN pg_class k ON k.relname = c.table_name AND k.relkind IN ('r', 'p')
           JOIN pg_namespace n ON n.oid = k.relnamespace AND n.nspname = c.table_schema
           WHERE c.table_schema = current_schema() AND c.data_type = ANY($1::text[])""",
        list(TEXT_TYPES))
    assert len({c["table_name"] for c in columns}) > 30  # the walk covers the schema
    found = []
    for c in columns:
        table, column = c["table_name"], c["column_name"]
        if c["data_type"] == "bytea":  # as bytes: sealed values show nothing, plain ones do
            hits = await db.fetchval(
                f'SELECT count(*) FROM "{table}" t WHERE EXISTS (SELECT 1 FROM unnest($1::text[]) n'
                f' WHERE position(convert_to(n, \'UTF8\') IN t."{column}") > 0)', needles)
        else:
            hits = await db.fetchval(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE ANY($1::text[])',
                [f"%{n}%" for n in needles])
        if hits:
            found.append(f"{table}.{column}")
    return found
