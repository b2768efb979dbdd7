"""Store and tuple rules.

A store belongs to one project; any store of another project is ``store_not_found`` for this
project's keys, exactly like a store that does not exist.

A write (``write_tuples``) applies 1 to 1,000 writes and deletes in one transaction: writing an
existing tuple or deleting an absent one is a no-op, so a write sent twice leaves the same tuples
as once. Each effective call takes the store's next revision under the store row lock, records
its changes in ``tuple_changes`` at that revision, and notifies engines (``pg_notify``,
delivered at commit). A call that changes nothing keeps the current revision.

Audit (issue 10: the spec names no ``authz`` action, and a store created or a permission granted
is what security reviewers look for): creating a store records ``authz.store.created``, and each
effective write one ``authz.tuples.written`` event (never one per tuple: a bulk load would bury
the log), both in the change's own transaction. The event holds the revision, the counts and the
first ``AUDITED_CHANGES`` changes; the revision's full list is in ``tuple_changes``. A write that
changes nothing, and a replayed one, record none.

A data-subject deletion forgets a subject (``forget_subject_in``: every tuple naming it goes from
every store of the project, and the change log keeps no earlier row naming it); see its
docstring for how the engines that follow the log stay exact.

Every write has a key, the client's ``Idempotency-Key`` or one made up for the request, and its
outcome is recorded under that key in its own transaction (``tuple_writes``; for a write that
changed nothing only when the client gave a key). Under the store row lock, a key already
recorded answers its recorded outcome instead of writing again. That one rule serves two cases:

* a client retrying with the same key gets the first answer (Stripe's ``Idempotency-Key``);
* when the connection is lost while ``COMMIT`` is in flight (PostgreSQL restarting), the write
  is run again under the same key for up to ``SETTLE_SECONDS``: it answers the committed
  outcome if the first try committed, and writes it if it did not. Only when PostgreSQL stays
  away longer is the answer 503 ``db_unavailable`` with ``details.outcome = "unknown"``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Final

import asyncpg

from common.db import CommitInDoubt, delete_in_batches, is_connection_error, transaction
from common.errors import DbUnavailable, IdempotencyKeyReused, StoreNotFound
from common.ids import is_id
from control_plane.audit import service as audit
from control_plane.authz import repository
from control_plane.authz.schemas import (
    Forgotten,
    Store,
    StoredTuple,
    TuplesQuery,
    WriteBody,
    Written,
)
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, page_of, position

log = logging.getLogger("authio.authz")

AUDITED_CHANGES: Final = 100
"""How many of a write's changes its audit event lists (in order; ``changes_truncated`` says
when there were more)."""
SETTLE_SECONDS: Final = 5.0
"""How long a write whose commit is in doubt waits for PostgreSQL to tell its outcome."""


async def create_store(conn: asyncpg.Connection, actor: Actor, *, name: str) -> Store:
    """Create a store at revision 0, with its ``authz.store.created`` event, and tell engines
    about it (they load it ahead of checks)."""
    assert actor.project_id is not None
    async with conn.transaction():
        store = await repository.insert_store(conn, actor.project_id, name)
        await audit.record(conn, actor, action="authz.store.created", target_type="store",
                           target_id=store.id, description=f"Created the store {name!r}",
                           metadata={"name": name})
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


async def write_tuples(pool: asyncpg.Pool, actor: Actor, *, store_id: str, body: WriteBody,
                       idempotency_key: str | None = None) -> tuple[Written, bool]:
    """Apply ``body`` atomically, once per key; returns the outcome and whether it is the
    recorded outcome of an earlier request with ``idempotency_key``.

    Raises InvalidRequest (a repeated tuple), StoreNotFound, IdempotencyKeyReused (the key was
    used for other tuples), DbUnavailable (the outcome is unknown: PostgreSQL did not come back
    within ``SETTLE_SECONDS`` of a lost commit), or connection errors (nothing was written)."""
    body.check_unique()
    assert actor.project_id is not None
    if not is_id(store_id, "store"):
        raise StoreNotFound()
    write = _Write(actor, store_id, body, idempotency_key)
    try:
        async with pool.acquire() as conn:
            return await write.run(conn)
    except CommitInDoubt:
        log.warning("connection lost while committing a tuple write to %s; reading back its "
                    "outcome", store_id, exc_info=True)
    outcome, _ = await _settle(pool, write)
    return outcome, False  # this request's own write, read back


async def write_tuples_in(conn: asyncpg.Connection, actor: Actor, *, store_id: str,
                          body: WriteBody) -> Written:
    """Apply ``body`` in the caller's transaction (a savepoint of it), as ``write_tuples`` does
    (the store's next revision, the change log the engines follow, ``authz.tuples.written``):
    for a rule whose own change and the tuples it implies must commit together (SCIM groups).
    The store's row stays locked until the caller commits. Raises InvalidRequest (a repeated
    tuple), StoreNotFound."""
    body.check_unique()
    assert actor.project_id is not None
    if not is_id(store_id, "store"):
        raise StoreNotFound()
    outcome, _ = await _Write(actor, store_id, body, None).run(conn)
    return outcome


async def _settle(pool: asyncpg.Pool, write: _Write) -> tuple[Written, bool]:
    """Run ``write`` again under its key until PostgreSQL answers, for ``SETTLE_SECONDS``."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + SETTLE_SECONDS, 0.05
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                async with pool.acquire() as conn:
                    return await write.run(conn)
        except TimeoutError:
            break
        except Exception as exc:
            if not is_connection_error(exc):
                raise
        if loop.time() + delay >= deadline:
            break
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
    raise DbUnavailable(
        "The connection to the database was lost while this write was committing, and the "
        "database did not answer in time to tell whether it took effect. Retry it with the same "
        "Idempotency-Key to learn its outcome (without one, retrying is safe too: writing an "
        "existing tuple or deleting an absent one changes nothing).",
        details={"outcome": "unknown"})


class _Write:
    """One tuple write under its key (the client's, or one made up for this request)."""

    __slots__ = ("actor", "body", "key", "keyed", "project_id", "request", "store_id")

    def __init__(self, actor: Actor, store_id: str, body: WriteBody, key: str | None) -> None:
        assert actor.project_id is not None
        self.actor, self.project_id, self.store_id, self.body = actor, actor.project_id, store_id, body
        self.key, self.keyed = key or str(uuid.uuid4()), key is not None
        self.request = body.digest()

    async def run(self, conn: asyncpg.Connection) -> tuple[Written, bool]:
        """One transaction: the recorded outcome of the key, or the write and its record.
        Raises CommitInDoubt when the connection is lost while committing.

        Two requests with one key at once (a client retrying before its first try was
        answered): the second waits for the store lock, and the row lock's re-check (READ
        COMMITTED) does not show it the outcome the first committed meanwhile, so its own record
        meets the first's. Its transaction is rolled back and run once more, and that statement's
        new snapshot answers the first's outcome."""
        try:
            return await self._once(conn)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != repository.WRITES_KEY:
                raise
        return await self._once(conn)

    async def _once(self, conn: asyncpg.Connection) -> tuple[Written, bool]:
        store_id, body = self.store_id, self.body
        async with transaction(conn):
            locked = await repository.lock_revision(conn, self.project_id, store_id, self.key)
            if locked is None:
                raise StoreNotFound()
            current, prior = locked
            if prior is not None:
                if prior[0] != self.request:
                    raise IdempotencyKeyReused()
                return prior[1], True
            revision = current + 1
            deleted = await repository.delete_tuples(conn, store_id, body.deletes)
            written = await repository.insert_tuples(conn, store_id, body.writes, revision)
            if deleted or written:
                applied = [("delete", r) for r in deleted] + [("write", r) for r in written]
                await repository.record_changes(conn, store_id, revision, applied,
                                                write_key=self.key, request=self.request)
                outcome = Written(len(written), len(deleted), revision)
                await self._audit(conn, outcome, applied)
            else:
                outcome = Written(0, 0, current)
                if self.keyed:
                    await repository.record_write(conn, store_id, self.key, self.request, outcome)
        return outcome, False

    async def _audit(self, conn: asyncpg.Connection, outcome: Written,
                     applied: list[tuple[str, asyncpg.Record]]) -> None:
        listed = [{"operation": op, "object": r["object"], "relation": r["relation"],
                   "user": r["subject"]} for op, r in applied[:AUDITED_CHANGES]]
        await audit.record(
            conn, self.actor, action="authz.tuples.written", target_type="store",
            target_id=self.store_id,
            description=(f"Wrote {outcome.written} and deleted {outcome.deleted} tuple(s) at "
                         f"revision {outcome.revision}"),
            metadata={"revision": outcome.revision, "written": outcome.written,
                      "deleted": outcome.deleted, "changes": listed,
                      "changes_truncated": len(applied) > AUDITED_CHANGES,
                      **({"idempotency_key": self.key} if self.keyed else {})})


REDACTED_ID: Final = "[deleted]"
"""What a forgotten subject's id reads as in the change log (``user:[deleted]``): ``[`` and ``]``
are in no valid id (``common.tuples``), so no tuple written through the API can be it."""


def _redacted(subject: str, value: str) -> str:
    """``value`` (an object or a user) with ``subject`` (``type:id``) as ``type:[deleted]``."""
    if value == subject or value.startswith(subject + "#"):
        return subject.partition(":")[0] + ":" + REDACTED_ID + value[len(subject):]
    return value


async def forget_subject_in(conn: asyncpg.Connection, actor: Actor, *,
                            subject: str) -> list[Forgotten]:
    """Forget ``subject`` (``type:id``, e.g. ``user:user_...``) in every store of the actor's
    project, in the caller's transaction (a data-subject deletion): the tuples naming it (as
    their object, their user, or their userset user's object ``type:id#relation``) are deleted,
    and the rows of the change log that named it are redacted (``type:[deleted]``). Returns
    what was done in each store that named it, in store id order.

    The engines load a store from the ``tuples`` table and then follow the log above the
    revision they loaded (``engine.registry``), so an engine may still have to read any row
    above its cursor, redacted or not. Hence, per store, under its row lock, one new revision
    (``authz.tuples.written``, by ``actor``; ``deleted`` counts the tuples deleted) that deletes:

    * every key naming ``subject`` that is in the table, or anywhere in the log: an engine
      behind a redacted delete still drops the key it holds (these rows name the subject: they
      are the deletion itself, and an engine that has not read them yet needs them);
    * every redacted key: what an engine replaying redacted writes added is dropped too (no
      tuple written through the API is one).

    Any engine, whatever its cursor, then holds none of them at this revision. The log is read
    before the lock (its rows up to the revision then current), and only the rest under it."""
    project_id = actor.project_id
    assert project_id is not None
    done = []
    for store_id, head in await repository.project_stores(conn, project_id):
        rows = await repository.naming_changes(conn, store_id, subject, after=-1, upto=head)
        current = await repository.lock_store(conn, project_id, store_id)
        if current is None:
            continue  # deleted meanwhile
        if current > head:
            rows += await repository.naming_changes(conn, store_id, subject, after=head,
                                                    upto=current)
        logged = list(dict.fromkeys((r["object"], r["relation"], r["subject"]) for r in rows))
        deleted = await repository.delete_naming(conn, store_id, subject, logged)
        if not rows and not deleted:
            continue
        present = [(r["object"], r["relation"], r["subject"]) for r in deleted]
        phantoms = [(_redacted(subject, o), rel, _redacted(subject, u)) for o, rel, u in logged]
        revision = current + 1
        await repository.redact_changes(conn, store_id, [
            (r["revision"], r["seq"], _redacted(subject, r["object"]),
             _redacted(subject, r["subject"])) for r in rows])
        at = await repository.record_deletes(conn, store_id, revision,
                                             list(dict.fromkeys([*present, *logged, *phantoms])))
        listed = [{"operation": "delete", "object": o, "relation": rel, "user": u}
                  for o, rel, u in present[:AUDITED_CHANGES]]
        await audit.record(
            conn, actor, action="authz.tuples.written", target_type="store", target_id=store_id,
            description=(f"Wrote 0 and deleted {len(present)} tuple(s) at revision {revision} "
                         "(a data-subject deletion)"),
            metadata={"revision": revision, "written": 0, "deleted": len(present),
                      "changes": listed, "changes_truncated": len(present) > AUDITED_CHANGES,
                      "redacted_changes": len(rows)})
        times = {r["created_at"] for r in rows} | {at}
        done.append(Forgotten(store_id, revision, len(present), len(rows), sorted(times)))
    return done


async def purge_writes(pool: asyncpg.Pool) -> int:
    """Forget write outcomes a day old; how many were deleted."""
    return await delete_in_batches(pool, repository.PURGE_WRITES)


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
