"""Tuples of a store: atomic write/delete with the change log, and the filtered listing.

POST /v1/stores/{store_id}/write takes ``writes`` and ``deletes`` (``{object, relation, user}``,
1 to 1,000 in all), validates every tuple (a bad one rejects the whole call, naming its index),
and applies them in one transaction: writing an existing tuple or deleting an absent one is a
no-op. Each effective call takes the store's next revision under the store row lock, records its
changes in ``tuple_changes`` at that revision, and notifies engines (``pg_notify``, delivered at
commit). A call that changes nothing keeps the current revision.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import asyncpg
from aiohttp import web
from pydantic import AfterValidator, Field, model_validator

from common import changes
from common.appkeys import PG_POOL
from common.errors import InvalidRequest, StoreNotFound
from common.http import json_response
from common.schemas import RequestModel, parse_body
from common.tuples import TupleFormatError, validate_object, validate_relation, validate_user
from control_plane.appkeys import CURSOR_SECRET
from control_plane.pagination import Listing, page_body, parse_page
from control_plane.principal import authenticate
from control_plane.stores import READ_SCOPES, get_store

MAX_TUPLES_PER_WRITE: Final = 1000


class TupleKey(RequestModel):
    object: Annotated[str, AfterValidator(validate_object)]
    relation: Annotated[str, AfterValidator(validate_relation)]
    user: Annotated[str, AfterValidator(validate_user)]

    def key(self) -> tuple[str, str, str]:
        return (self.object, self.relation, self.user)


class WriteBody(RequestModel):
    writes: list[TupleKey] = Field(default_factory=list)
    deletes: list[TupleKey] = Field(default_factory=list)

    @model_validator(mode="after")
    def _bounds(self) -> WriteBody:
        total = len(self.writes) + len(self.deletes)
        if not 1 <= total <= MAX_TUPLES_PER_WRITE:
            raise ValueError(
                f"writes and deletes must hold 1 to {MAX_TUPLES_PER_WRITE} tuples in all, got {total}"
            )
        return self


def check_unique(body: WriteBody) -> None:
    """Raises InvalidRequest naming the first tuple that repeats an earlier one (in ``writes``
    or ``deletes``, or across them: a call may not both write and delete a tuple)."""
    seen: dict[tuple[str, str, str], str] = {}
    for name, items in (("writes", body.writes), ("deletes", body.deletes)):
        for i, t in enumerate(items):
            where = f"{name}.{i}"
            if t.key() in seen:
                raise InvalidRequest.field(where, f"repeats {seen[t.key()]}")
            seen[t.key()] = where


def _columns(items: list[TupleKey]) -> tuple[list[str], list[str], list[str]]:
    return ([t.object for t in items], [t.relation for t in items], [t.user for t in items])


async def write_tuples(
    conn: asyncpg.Connection, project_id: str, store_id: str, body: WriteBody
) -> dict[str, int]:
    """Apply ``body`` atomically; returns ``{"written", "deleted", "revision"}``.

    Raises StoreNotFound when the store is absent or another project's.
    """
    async with conn.transaction():
        current = await conn.fetchval(
            "SELECT revision FROM stores WHERE id = $1 AND project_id = $2 FOR UPDATE",
            store_id, project_id,
        )
        if current is None:
            raise StoreNotFound()
        revision = current + 1
        deleted = await conn.fetch(
            """DELETE FROM tuples t
               USING unnest($2::text[], $3::text[], $4::text[]) AS d(object, relation, subject)
               WHERE t.store_id = $1 AND t.object = d.object AND t.relation = d.relation
                 AND t.subject = d.subject
               RETURNING t.object, t.relation, t.subject""",
            store_id, *_columns(body.deletes),
        ) if body.deletes else []
        written = await conn.fetch(
            """INSERT INTO tuples (store_id, object, relation, subject, revision)
               SELECT $1, w.object, w.relation, w.subject, $5
               FROM unnest($2::text[], $3::text[], $4::text[]) AS w(object, relation, subject)
               ON CONFLICT DO NOTHING
               RETURNING object, relation, subject""",
            store_id, *_columns(body.writes), revision,
        ) if body.writes else []
        if not deleted and not written:
            return {"written": 0, "deleted": 0, "revision": current}
        applied = [("delete", r) for r in deleted] + [("write", r) for r in written]
        await conn.execute(
            """INSERT INTO tuple_changes (store_id, revision, seq, operation, object, relation,
                                          subject)
               SELECT $1, $2, c.seq, c.operation, c.object, c.relation, c.subject
               FROM unnest($3::text[], $4::text[], $5::text[], $6::text[])
                    WITH ORDINALITY AS c(operation, object, relation, subject, seq)""",
            store_id, revision, [op for op, _ in applied], [r["object"] for _, r in applied],
            [r["relation"] for _, r in applied], [r["subject"] for _, r in applied],
        )
        await conn.execute(
            "UPDATE stores SET revision = $2, updated_at = now() WHERE id = $1", store_id, revision
        )
        await conn.execute("SELECT pg_notify($1, $2)", changes.CHANNEL, changes.payload(store_id, revision))
    return {"written": len(written), "deleted": len(deleted), "revision": revision}


_FILTERS: Final = (("object", "object", validate_object), ("relation", "relation",
                   validate_relation), ("user", "subject", validate_user))


async def list_tuples(
    pool: asyncpg.Pool, project_id: str, store_id: str, query: Any, *, secret: bytes
) -> dict[str, Any]:
    """A page of the store's tuples ordered by (object, relation, user), filtered by exact
    ``object``, ``relation`` and ``user`` when given; cursors are bound to the store and signed
    with ``secret``. Raises StoreNotFound, InvalidRequest."""
    listing = Listing(f"tuples:{store_id}", project_id, secret)
    page = parse_page(query, listing, key_len=3)
    await get_store(pool, project_id, store_id)
    where: list[str] = ["store_id = $1"]
    args: list[object] = [store_id]
    for param, column, validate in _FILTERS:
        value = query.get(param)
        if value is not None:
            try:
                validate(value)
            except TupleFormatError as exc:
                raise InvalidRequest.field(param, str(exc)) from None
            args.append(value)
            where.append(f"{column} = ${len(args)}")
    if page.after is not None:
        args.extend(str(v) for v in page.after)
        n = len(args)
        where.append(f"(object, relation, subject) > (${n - 2}, ${n - 1}, ${n})")
    args.append(page.limit + 1)
    rows = await pool.fetch(
        f"""SELECT object, relation, subject AS "user", revision, created_at FROM tuples
            WHERE {' AND '.join(where)} ORDER BY object, relation, subject
            LIMIT ${len(args)}::int""",
        *args,
    )
    return page_body([dict(r) for r in rows], page, listing, key=["object", "relation", "user"])


async def post_write(request: web.Request) -> web.Response:
    principal = await authenticate(request, "authz:write")
    body = await parse_body(request, WriteBody)
    check_unique(body)
    async with request.app[PG_POOL].acquire() as conn:
        result = await write_tuples(conn, principal.project_id, request.match_info["store_id"],
                                    body)
    return json_response(request, result)


async def get_tuples(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    body = await list_tuples(request.app[PG_POOL], principal.project_id,
                             request.match_info["store_id"], request.query,
                             secret=request.app[CURSOR_SECRET])
    return json_response(request, body)
