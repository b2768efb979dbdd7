"""Store and tuple rules.

A store belongs to one project; any store of another project is ``store_not_found`` for this
project's keys, exactly like a store that does not exist.

A write (``write_tuples``) applies 1 to 1,000 writes and deletes in one transaction: writing an
existing tuple or deleting an absent one is a no-op. Each effective call takes the store's next
revision under the store row lock, records its changes in ``tuple_changes`` at that revision,
and notifies engines (``pg_notify``, delivered at commit). A call that changes nothing keeps the
current revision.
"""

from __future__ import annotations

import asyncpg

from common.errors import StoreNotFound
from common.ids import is_id
from control_plane.authz import repository
from control_plane.authz.schemas import Store, StoredTuple, TuplesQuery, WriteBody, Written
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, page_of, position


async def create_store(conn: asyncpg.Connection, actor: Actor, *, name: str) -> Store:
    """Create a store at revision 0 and tell engines about it (they load it ahead of checks)."""
    assert actor.project_id is not None
    async with conn.transaction():
        store = await repository.insert_store(conn, actor.project_id, name)
        await repository.notify(conn, store.id, 0)
    return store


async def find_store(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                     store_id: str) -> Store:
    """The store. Raises StoreNotFound when it is absent or another project's (or ``store_id``
    is no store id: then without a query)."""
    store = await repository.find_store(conn, project_id, store_id) if is_id(
        store_id, "store") else None
    if store is None:
        raise StoreNotFound()
    return store


async def write_tuples(conn: asyncpg.Connection, actor: Actor, *, store_id: str,
                       body: WriteBody) -> Written:
    """Apply ``body`` atomically. Raises InvalidRequest (a repeated tuple), StoreNotFound."""
    body.check_unique()
    assert actor.project_id is not None
    if not is_id(store_id, "store"):
        raise StoreNotFound()
    async with conn.transaction():
        current = await repository.lock_revision(conn, actor.project_id, store_id)
        if current is None:
            raise StoreNotFound()
        revision = current + 1
        deleted = await repository.delete_tuples(conn, store_id, body.deletes)
        written = await repository.insert_tuples(conn, store_id, body.writes, revision)
        if not deleted and not written:
            return Written(0, 0, current)
        applied = [("delete", r) for r in deleted] + [("write", r) for r in written]
        await repository.record_changes(conn, store_id, revision, applied)
    return Written(len(written), len(deleted), revision)


async def list_tuples(pool: asyncpg.Pool, tuples: Listing, store_id: str,
                      query: TuplesQuery) -> Page[StoredTuple]:
    """A page of the store's tuples; cursors are bound to the store. Raises StoreNotFound,
    InvalidRequest (cursor)."""
    at = position(query, tuples, key_len=3)
    await find_store(pool, tuples.project_id, store_id)
    filters = {column: value for column, value in (
        ("object", query.object), ("relation", query.relation), ("subject", query.user))
        if value is not None}
    rows = await repository.list_tuples(pool, store_id, filters=filters, after=at.after,
                                        limit=at.limit + 1)
    return page_of(rows, at, tuples, key=lambda t: [t.object, t.relation, t.user])
