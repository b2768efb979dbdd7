"""Data-subject request rules (SPEC.md 2 "DSR", 4 rules 2 and 3, 8; DESIGN.md "compliance").

* :func:`create_dsr`: a pending request, due ``due_days`` after the call (``dsr.created``). An
  e-mail the project does not know is accepted like any other (no enumeration): its fulfilment
  finds nothing held.
* :func:`fulfil`: once. A second call answers the first result without doing anything again.
  - **Deletion.** One transaction hard-deletes every row that names the user or its contacts
    (``repository.DELETIONS``: the user, its identities, passkeys, sessions and refresh tokens,
    step-up and WebAuthn challenges, memberships, invitations to the address, magic links and
    messages to it, pending webhook deliveries of events about it, its known devices and last
    locations). Its live sessions are revoked first through the revocation outbox, so the edge
    answers ``revoked`` at once. The request is then ``in_progress`` while the history (audit
    events, risk decisions) is anonymized in batches of :data:`BATCH` rows, each batch its own
    transaction with its progress, so audit writes are never held up for long. A process that
    dies mid-way leaves its lease (:data:`LEASE`) to lapse, and the workers (``tasks``) resume
    the batches; scrubbing twice changes nothing. The last batch is followed by
    ``dsr.fulfilled``, which names no one.
  - **Export.** The JSON document of what the project holds about the user (its row,
    identities, passkeys' public parts, memberships, sessions, audit events, risk decisions,
    step-up challenges; never a token hash or secret), answered with its SHA-256 and stored
    with ``output_artifact_url``, which the call must give.

Anonymized means (SPEC.md 4 rule 2): ``user_id`` null, metadata ``user_email`` ``[deleted]``;
beyond the rule, the e-mail and the user's id are removed wherever else they appear (any
metadata value, the description, actor and target) and the user's own events lose their client
address and user agent. Events that merely mention the address (an invitation to it) lose the
address and keep the rest. The request itself keeps the e-mail and the user's id: it is the
record that the request was honoured.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
import orjson

from common.db import Params
from common.errors import InvalidRequest, NotFound
from common.ids import is_id, new_id
from control_plane.audit import service as audit
from control_plane.compliance import repository
from control_plane.compliance.schemas import Dsr, DsrBody, DsrQuery, FulfilBody, Fulfilment
from control_plane.sessions import service as sessions
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, page_by_id

log = logging.getLogger("authio.compliance")

LISTING: Final = "dsr_requests"
BATCH: Final = 2000
"""History rows anonymized per transaction."""
LEASE: Final = timedelta(seconds=60)
"""How long a process may go without a batch before another takes the deletion over."""
HISTORY: Final = ("audit_events", "risk_decisions")
LANES: Final = 2
"""Connections anonymizing a user's events side by side."""
ROUND: Final = 100_000
"""Events whose keys are read at once (then anonymized in batches)."""


def _dsr(row: asyncpg.Record) -> Dsr:
    overdue = row["status"] != "fulfilled" and row["due_at"] < datetime.now(UTC)
    return Dsr(dsr_id=row["id"], request_type=row["request_type"], user_email=row["user_email"],
               notes=row["notes"], due_days=row["due_days"], status=row["status"],
               overdue=overdue, created_at=row["created_at"], due_at=row["due_at"],
               fulfilled_at=row["fulfilled_at"], output_artifact_url=row["output_artifact_url"],
               result=row["result"])


async def create_dsr(conn: asyncpg.Connection, actor: Actor, body: DsrBody) -> Dsr:
    """A pending request with ``dsr.created``."""
    assert actor.project_id is not None
    dsr_id = new_id("dsr")
    async with conn.transaction():
        row = await repository.insert(conn, dsr_id=dsr_id, project_id=actor.project_id,
                                      request_type=body.request_type, user_email=body.user_email,
                                      notes=body.notes, due_days=body.due_days)
        await audit.record(
            conn, actor, action="dsr.created", target_type="dsr", target_id=dsr_id,
            description=f"Data-subject {body.request_type} request {dsr_id}",
            metadata={"request_type": body.request_type, "user_email": body.user_email,
                      "due_days": body.due_days, "due_at": row["due_at"].isoformat()})
    return _dsr(row)


async def _find(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, dsr_id: str, *,
                lock: bool = False) -> asyncpg.Record:
    row = await repository.find(conn, project_id, dsr_id, lock=lock) if is_id(dsr_id, "dsr") else None
    if row is None:
        raise NotFound("No data-subject request with that id in this project.")
    return row


async def describe(pool: asyncpg.Pool, project_id: str, dsr_id: str) -> Dsr:
    """The request. Raises NotFound (another project's too)."""
    return _dsr(await _find(pool, project_id, dsr_id))


async def list_dsrs(pool: asyncpg.Pool, listing: Listing, query: DsrQuery) -> Page[Dsr]:
    """A page of the project's requests, oldest first. Raises InvalidRequest (cursor)."""
    return await page_by_id(
        pool, listing, query, table=repository.LISTED, alias="d", id_column="dsr_id",
        columns=repository.DSR_COLUMNS, row=_dsr,
        where=lambda p: repository.list_condition(p, status=query.status,
                                                  request_type=query.type,
                                                  overdue=query.overdue))


def _answer(row: asyncpg.Record, document: bytes | None = None) -> Fulfilment:
    """What a fulfilment answers, from the request as stored."""
    result = row["result"] or {}
    return Fulfilment(dsr=_dsr(row), user_found=bool(result.get("user_found")),
                      deleted=result.get("deleted"), anonymized=result.get("anonymized"),
                      document=orjson.loads(document) if document is not None else None,
                      sha256=row["output_sha256"])


async def fulfil(pool: asyncpg.Pool, actor: Actor, dsr_id: str, body: FulfilBody) -> Fulfilment:
    """Fulfil the request (module docstring), or answer how it was fulfilled, or how far a
    deletion another process is finishing has come (``in_progress``). Raises NotFound,
    InvalidRequest (``output_artifact_url``: required for an export, refused for a deletion)."""
    assert actor.project_id is not None
    ours = None
    async with pool.acquire() as conn, conn.transaction():
        row = await _find(conn, actor.project_id, dsr_id, lock=True)
        if row["status"] == "fulfilled":
            return _answer(row, await repository.document(conn, dsr_id))
        if row["request_type"] == "export":
            if body.output_artifact_url is None:
                raise InvalidRequest.field("output_artifact_url", "is required to fulfil an export")
            return await _export(conn, actor, row, body.output_artifact_url)
        if body.output_artifact_url is not None:
            raise InvalidRequest.field("output_artifact_url", "is only taken by an export")
        if row["status"] == "pending":
            ours = await _delete(conn, row)
    if ours is None:  # in progress: resumed here if the process at it died
        ours = await repository.take_lease(pool, dsr_id, LEASE)
    if ours is None:
        return _answer(await _find(pool, actor.project_id, dsr_id))
    return _answer(await anonymize(pool, actor, ours))


async def _delete(conn: asyncpg.Connection, row: asyncpg.Record) -> asyncpg.Record:
    """The deletion's transaction (module docstring); the request is then ``in_progress``, its
    lease this process's."""
    project_id, email = row["project_id"], row["user_email"]
    user = await conn.fetchrow(repository.SUBJECT, project_id, email)
    user_id = user["id"] if user is not None else None
    revoked = 0
    if user_id is not None:
        revoked = await sessions.revoke_user_sessions(conn, user_id=user_id, reason="dsr_deletion")
    deleted = await repository.delete_subject(
        conn, project_id=project_id, user_id=user_id, email=email,
        phone=user["phone_number"] if user is not None else None)
    result = {"user_found": user_id is not None, "sessions_revoked": revoked, "deleted": deleted,
              "anonymized": dict.fromkeys(HISTORY, 0)}
    return await repository.start_deletion(conn, row["id"], user_id=user_id, result=result,
                                           lease=LEASE)


async def anonymize(pool: asyncpg.Pool, actor: Actor, row: asyncpg.Record) -> asyncpg.Record:
    """Anonymize the history of the ``in_progress`` deletion ``row`` (whose lease the caller
    holds) batch after batch, then mark it fulfilled with ``dsr.fulfilled``; the request as it
    ends. An event already scrubbed no longer matches, so rounds go on until none is found."""
    dsr_id, project_id = row["id"], row["project_id"]
    user_id, email, before = row["user_id"], row["user_email"], row["deleted_at"]

    async with pool.acquire() as conn:
        mention = await audit.mentions(conn, email)
    selectors: list[Callable[[Params], str]] = [
        # Events written before the deletion that name the address: as metadata
        # ``user_email`` (its own index), or in the text a ``q`` search reads (trigrams).
        lambda p: repository.by_email_field(p, email, before),
        lambda p: f"{mention(p)} AND e.created_at < {p(before)}",
    ]
    if user_id is not None:
        selectors += [lambda p: repository.by_user(p, user_id),
                      lambda p: repository.by_actor(p, user_id)]

    async def scrub(keys: list[tuple[datetime, str]]) -> None:
        for start in range(0, len(keys), BATCH):
            batch = keys[start:start + BATCH]
            async with pool.acquire() as conn, conn.transaction():
                p = Params()
                await conn.execute(repository.anonymize_events(
                    p, project_id=project_id, user_id=user_id, email=email, keys=batch), *p.values)
                await repository.progress(conn, dsr_id, "audit_events", len(batch), LEASE)

    # Rounds: the keys of what names the user (a scrubbed event no longer matches, so a round
    # finds only what is left, or what a request racing the deletion wrote), then those
    # events in batches, LANES of them side by side (PostgreSQL's index upkeep is most of it).
    scrubbed: set[tuple[datetime, str]] = set()
    while True:
        async with pool.acquire() as conn:
            p = Params()
            sql = repository.naming_events(p, project_id=project_id,
                                           selectors=[s(p) for s in selectors], limit=ROUND)
            keys = [(r["created_at"], r["id"]) for r in await conn.fetch(sql, *p.values)]
        if not keys:
            break
        if scrubbed.issuperset(keys):  # scrubbed and still matching: nothing more this can change
            log.error("data-subject deletion %s: %d events still name the user after "
                      "anonymization", dsr_id, len(keys))
            break
        scrubbed.update(keys)
        await asyncio.gather(*(scrub(keys[lane::LANES]) for lane in range(LANES)))
    if user_id is not None:
        while True:
            async with pool.acquire() as conn, conn.transaction():
                status = await conn.execute(repository.ANONYMIZE_DECISIONS, project_id, user_id,
                                            BATCH)
                count = int(status.split()[-1])
                if count:
                    await repository.progress(conn, dsr_id, "risk_decisions", count, LEASE)
            if count < BATCH:
                break

    async with pool.acquire() as conn, conn.transaction():
        done = await repository.finish(conn, dsr_id)
        result = done["result"]
        await audit.record(
            conn, actor, action="dsr.fulfilled", project_id=project_id, target_type="dsr",
            target_id=dsr_id, description=f"Fulfilled data-subject deletion request {dsr_id}",
            metadata={"request_type": "deletion", "user_found": result["user_found"],
                      "deleted": result["deleted"], "anonymized": result["anonymized"]})
    log.info("data-subject deletion %s fulfilled: %s", dsr_id, result)
    return done


def _plain(value: Any) -> Any:
    """A stored value as the export's JSON holds it: bytes as base64url (no padding)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.urlsafe_b64encode(bytes(value)).rstrip(b"=").decode()
    return value


async def _export(conn: asyncpg.Connection, actor: Actor, row: asyncpg.Record,
                  url: str) -> Fulfilment:
    """Gather the document (module docstring), store it with its digest and the URL, and
    record ``dsr.fulfilled``, in ``conn``'s transaction."""
    project_id, email = row["project_id"], row["user_email"]
    user = await conn.fetchrow(repository.EXPORT_USER, project_id, email)
    document: dict[str, Any] = {"user": dict(user) if user is not None else None,
                                "dsr_id": row["id"], "project_id": project_id}
    values = {"user": user["id"] if user is not None else None, "project": project_id}
    for name, statement in repository.EXPORT_PARTS:
        sql, p = repository.named(statement)
        rows = await conn.fetch(sql, *p.bind_from(values)) if user is not None else []
        document[name] = [{k: _plain(v) for k, v in r.items()} for r in rows]
    events = await conn.fetch(repository.export_events(audit.EVENT_COLUMNS),
                              user["id"], project_id) if user is not None else []
    document["audit_events"] = [dict(e) for e in events]
    raw = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(raw).hexdigest()
    counts = {k: len(v) for k, v in document.items() if isinstance(v, list)}
    result = {"user_found": user is not None, "sha256": digest, "counts": counts}
    done = await repository.finish(conn, row["id"], result=result, output_artifact_url=url,
                                   output_sha256=digest, document=raw)
    await audit.record(
        conn, actor, action="dsr.fulfilled", target_type="dsr", target_id=row["id"],
        description=f"Fulfilled data-subject export request {row['id']}",
        metadata={"request_type": "export", "output_artifact_url": url, "sha256": digest,
                  "counts": counts})
    return _answer(done, raw)
