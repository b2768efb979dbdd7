"""Stores and tuples SQL: ``stores`` (the revision), ``tuples``, the ``tuple_changes`` log the
engine follows, announced with ``pg_notify`` (``common.changes``) in the writing transaction,
and ``tuple_writes``, each write's outcome by its key."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from common import changes
from common.db import Params
from common.ids import new_id
from common.tuples import TupleKey
from control_plane.authz.schemas import Store, StoredTuple, Written

STORE_COLUMNS: Final = "id, name, revision, created_at, updated_at"


def store(row: asyncpg.Record) -> Store:
    return Store(**row)


async def notify(conn: asyncpg.Connection, store_id: str, revision: int) -> None:
    """Tell engines the store reached ``revision`` (delivered when the transaction commits)."""
    await conn.execute("SELECT pg_notify($1, $2)", changes.CHANNEL,
                       changes.payload(store_id, revision))


async def insert_store(conn: asyncpg.Connection, project_id: str, name: str) -> Store:
    row = await conn.fetchrow(
        f"INSERT INTO stores (id, project_id, name) VALUES ($1, $2, $3) RETURNING {STORE_COLUMNS}",
        new_id("store"), project_id, name,
    )
    assert row is not None
    return store(row)


async def find_store(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                     store_id: str) -> Store | None:
    row = await conn.fetchrow(
        f"SELECT {STORE_COLUMNS} FROM stores WHERE id = $1 AND project_id = $2",
        store_id, project_id,
    )
    return store(row) if row is not None else None


async def lock_revision(conn: asyncpg.Connection, project_id: str, store_id: str,
                        write_key: str) -> tuple[int, tuple[bytes, Written] | None] | None:
    """The store's revision, its row locked (revisions then commit in order with no gaps), and
    the recorded request digest and outcome of the write ``write_key``, if one committed; None
    when there is no such store in the project. One round trip: the lock is held until commit,
    and every one saved is a write more per second on a busy store."""
    row = await conn.fetchrow(
        """SELECT s.revision, w.request_hash, w.written, w.deleted, w.revision AS write_revision
           FROM stores s
           LEFT JOIN tuple_writes w ON w.store_id = s.id AND w.write_key = $3
           WHERE s.id = $1 AND s.project_id = $2
           FOR UPDATE OF s""",
        store_id, project_id, write_key,
    )
    if row is None:
        return None
    prior = None if row["request_hash"] is None else (
        bytes(row["request_hash"]), Written(row["written"], row["deleted"], row["write_revision"]))
    return row["revision"], prior


def _columns(items: list[TupleKey]) -> tuple[list[str], list[str], list[str]]:
    return ([t.object for t in items], [t.relation for t in items], [t.user for t in items])


async def delete_tuples(conn: asyncpg.Connection, store_id: str,
                        items: list[TupleKey]) -> list[asyncpg.Record]:
    """Delete those of ``items`` that exist; the deleted ones (``object, relation, subject``)."""
    if not items:
        return []
    rows: list[asyncpg.Record] = await conn.fetch(
        """DELETE FROM tuples t
           USING unnest($2::text[], $3::text[], $4::text[]) AS d(object, relation, subject)
           WHERE t.store_id = $1 AND t.object = d.object AND t.relation = d.relation
             AND t.subject = d.subject
           RETURNING t.object, t.relation, t.subject""",
        store_id, *_columns(items),
    )
    return rows


async def insert_tuples(conn: asyncpg.Connection, store_id: str, items: list[TupleKey],
                        revision: int) -> list[asyncpg.Record]:
    """Insert those of ``items`` that do not exist yet; the inserted ones."""
    if not items:
        return []
    rows: list[asyncpg.Record] = await conn.fetch(
        """INSERT INTO tuples (store_id, object, relation, subject, revision)
           SELECT $1, w.object, w.relation, w.subject, $5
           FROM unnest($2::text[], $3::text[], $4::text[]) AS w(object, relation, subject)
           ON CONFLICT DO NOTHING
           RETURNING object, relation, subject""",
        store_id, *_columns(items), revision,
    )
    return rows


_OUTCOME_COLUMNS: Final = "store_id, write_key, request_hash, revision, written, deleted"
WRITES_KEY: Final = "tuple_writes_pkey"
"""The constraint that holds one outcome per (store, key)."""


async def record_changes(conn: asyncpg.Connection, store_id: str, revision: int,
                         applied: list[tuple[str, asyncpg.Record]], *, write_key: str,
                         request: bytes) -> None:
    """Log the ``applied`` (operation, tuple) changes at ``revision``, in order, move the store
    to ``revision``, record the write's outcome under ``write_key`` and announce it: one
    statement (data-modifying CTEs all run, referenced or not)."""
    ops = [op for op, _ in applied]
    await conn.execute(
        f"""WITH changes AS (
              INSERT INTO tuple_changes (store_id, revision, seq, operation, object, relation,
                                         subject)
              SELECT $1, $2, c.seq, c.operation, c.object, c.relation, c.subject
              FROM unnest($3::text[], $4::text[], $5::text[], $6::text[])
                   WITH ORDINALITY AS c(operation, object, relation, subject, seq)
            ), moved AS (
              UPDATE stores SET revision = $2, updated_at = now() WHERE id = $1
            ), outcome AS (
              INSERT INTO tuple_writes ({_OUTCOME_COLUMNS}) VALUES ($1, $7, $8, $2, $9, $10)
            )
            SELECT pg_notify($11, $12)""",
        store_id, revision, ops, [r["object"] for _, r in applied],
        [r["relation"] for _, r in applied], [r["subject"] for _, r in applied],
        write_key, request, ops.count("write"), ops.count("delete"),
        changes.CHANNEL, changes.payload(store_id, revision),
    )


async def record_write(conn: asyncpg.Connection, store_id: str, key: str, request: bytes,
                       outcome: Written) -> None:
    """Remember the outcome of a write that changed nothing under ``key`` (in its
    transaction)."""
    await conn.execute(
        f"INSERT INTO tuple_writes ({_OUTCOME_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)",
        store_id, key, request, outcome.revision, outcome.written, outcome.deleted)


# --- forgetting a subject (a data-subject deletion) ------------------------------------------


async def project_stores(conn: asyncpg.Connection, project_id: str) -> list[tuple[str, int]]:
    """The project's stores and their revisions, in id order."""
    rows = await conn.fetch("SELECT id, revision FROM stores WHERE project_id = $1 ORDER BY id",
                            project_id)
    return [(r["id"], r["revision"]) for r in rows]


async def lock_store(conn: asyncpg.Connection, project_id: str, store_id: str) -> int | None:
    """The store's revision, its row locked until commit (None: no longer there)."""
    revision: int | None = await conn.fetchval(
        "SELECT revision FROM stores WHERE id = $1 AND project_id = $2 FOR UPDATE",
        store_id, project_id)
    return revision


async def naming_changes(conn: asyncpg.Connection, store_id: str, subject: str, *, after: int,
                         upto: int) -> list[asyncpg.Record]:
    """The store's change-log rows above revision ``after`` up to ``upto`` that name
    ``subject`` (``type:id``) as the object, the user, or the object of a userset user
    (``type:id#relation``), in log order: ``revision, seq, object, relation, subject,
    created_at``. Reads the store's whole log in that range (the log has no index but its
    primary key; a data-subject deletion is rare)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        """SELECT revision, seq, object, relation, subject, created_at FROM tuple_changes
           WHERE store_id = $1 AND revision > $2 AND revision <= $3
             AND (object = $4 OR subject = $4 OR starts_with(subject, $5))
           ORDER BY revision, seq""",
        store_id, after, upto, subject, subject + "#")
    return rows


async def delete_naming(conn: asyncpg.Connection, store_id: str, subject: str,
                        keys: list[tuple[str, str, str]]) -> list[asyncpg.Record]:
    """Delete the store's tuples whose user or object is ``subject``, and those of ``keys``
    ``(object, relation, subject)`` (a userset user's tuples, found in the change log): each by
    an index. The deleted ones (``object, relation, subject``)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        """DELETE FROM tuples WHERE store_id = $1 AND (subject = $2 OR object = $2)
           RETURNING object, relation, subject""", store_id, subject)
    if keys:
        rows += await conn.fetch(
            """DELETE FROM tuples t
               USING unnest($2::text[], $3::text[], $4::text[]) AS k(object, relation, subject)
               WHERE t.store_id = $1 AND t.object = k.object AND t.relation = k.relation
                 AND t.subject = k.subject
               RETURNING t.object, t.relation, t.subject""",
            store_id, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys])
    return rows


async def redact_changes(conn: asyncpg.Connection, store_id: str,
                         rows: list[tuple[int, int, str, str]]) -> None:
    """Set the object and user of the store's change-log rows ``(revision, seq, object,
    subject)``."""
    if rows:
        await conn.execute(
            """UPDATE tuple_changes c SET object = r.object, subject = r.subject
               FROM unnest($2::bigint[], $3::int[], $4::text[], $5::text[])
                    AS r(revision, seq, object, subject)
               WHERE c.store_id = $1 AND c.revision = r.revision AND c.seq = r.seq""",
            store_id, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
            [r[3] for r in rows])


async def record_deletes(conn: asyncpg.Connection, store_id: str, revision: int,
                         deletes: list[tuple[str, str, str]]) -> datetime:
    """Log ``deletes`` ``(object, relation, subject)`` at ``revision``, in order, move the store
    to it and announce it (one statement, as :func:`record_changes`; no write outcome: no
    client key). Returns the rows' ``created_at``: the transaction's time."""
    logged: datetime = await conn.fetchval(
        """WITH changes AS (
              INSERT INTO tuple_changes (store_id, revision, seq, operation, object, relation,
                                         subject)
              SELECT $1, $2, c.seq, 'delete', c.object, c.relation, c.subject
              FROM unnest($3::text[], $4::text[], $5::text[])
                   WITH ORDINALITY AS c(object, relation, subject, seq)
            ), moved AS (
              UPDATE stores SET revision = $2, updated_at = now() WHERE id = $1
            )
            SELECT now() FROM (SELECT pg_notify($6, $7)) AS notified""",
        store_id, revision, [d[0] for d in deletes], [d[1] for d in deletes],
        [d[2] for d in deletes], changes.CHANNEL, changes.payload(store_id, revision))
    return logged


PURGE_WRITES: Final = """
DELETE FROM tuple_writes WHERE (store_id, write_key) IN (
    SELECT store_id, write_key FROM tuple_writes
    WHERE created_at < now() - interval '1 day' LIMIT $1)"""
"""Write outcomes a day old (an ``Idempotency-Key`` is honoured for 24 hours), in batches of
``$1``."""


async def list_tuples(conn: asyncpg.Connection | asyncpg.Pool, store_id: str, *,
                      filters: dict[str, str], after: tuple[str, ...] | None,
                      limit: int) -> list[StoredTuple]:
    """Up to ``limit`` tuples of the store after the key ``after``, in (object, relation,
    subject) order; ``filters`` maps ``object``, ``relation``, ``subject`` to exact values."""
    p = Params()
    where = [f"store_id = {p(store_id)}"]
    where += [f"{column} = {p(value)}" for column, value in filters.items()]
    if after is not None:
        where.append(f"(object, relation, subject) > ({p(after[0])}, {p(after[1])}, {p(after[2])})")
    rows = await conn.fetch(
        f"""SELECT object, relation, subject AS "user", revision, created_at FROM tuples
            WHERE {' AND '.join(where)} ORDER BY object, relation, subject
            LIMIT {p(limit)}::int""",
        *p.values,
    )
    return [StoredTuple(**r) for r in rows]
