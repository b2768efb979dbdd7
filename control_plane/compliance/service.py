"""Data-subject request rules (SPEC.md 2 "DSR", 4 rules 2 and 3, 8; DESIGN.md "compliance").

* :func:`create_dsr`: a pending request, due ``due_days`` after the call (``dsr.created``). An
  e-mail the project does not know is accepted like any other (no enumeration): its fulfilment
  finds nothing held.
* :func:`fulfil`: once. A second call answers the first result without doing anything again.
  - **Deletion.** One transaction hard-deletes every row that names the user or its contacts
    (``repository.DELETIONS``: the user, its identities, passkeys, sessions and refresh tokens,
    step-up and WebAuthn challenges, recovery requests, SCIM directory records and group
    memberships, memberships, invitations to the address, magic links and messages to it,
    pending webhook deliveries of events about it, its known devices and last locations). Its
    live sessions are revoked first through the revocation outbox, so the edge answers
    ``revoked`` at once. In the same transaction every tuple naming ``user:<id>`` (its directory
    groups' among them) goes from every store of the project, through each store's change log
    (``authz.forget_subject_in``: a revision that deletes them, so the engines stop granting;
    the log's earlier rows naming it are redacted to ``user:[deleted]``, counted as
    ``anonymized.tuple_changes``), and the ``authz.tuples.written`` events of those revisions
    are anonymized there and then (``deleted.tuples`` counts the tuples; the events count in
    ``anonymized.audit_events``). The deleting revision's own change-log rows keep naming
    ``user:<id>`` (the opaque id, never the address): an engine that has not read them yet needs
    them to drop the tuples, like the request's record keeps the id. The request is then
    ``in_progress`` while the history (audit events, risk decisions) is anonymized in batches of
    :data:`BATCH` rows, each batch its own transaction with its progress, so audit writes are
    never held up for long. A process that dies mid-way leaves its lease (:data:`LEASE`) to
    lapse, and the workers (``tasks``) resume the batches; scrubbing twice changes nothing. The
    last batch is followed by ``dsr.fulfilled``, which names no one.
  - **Export.** The JSON document of what the project holds about the user (its row,
    identities, passkeys' public parts, memberships, sessions, audit events, risk decisions,
    step-up challenges, recovery requests, SCIM directory records and directory groups, the
    tuples naming ``user:<id>`` in the project's stores; never a token hash or secret),
    answered with its SHA-256 and stored with ``output_artifact_url``, which the call must
    give.

Anonymized means (SPEC.md 4 rule 2): ``user_id`` null, metadata ``user_email`` ``[deleted]``;
beyond the rule, the e-mail and the user's id are removed wherever else they appear (any
metadata value, the description, actor and target) and the user's own events lose their client
address, user agent and identity-provider subject. Events that merely mention the address (an invitation to it) lose the
address and keep the rest. The request itself keeps the e-mail and the user's id: it is the
record that the request was honoured.

Incidents and maintenance windows (SPEC.md 6 ``incident.*``, ``maintenance.*``, 8 breach
notification), each change with its audit event in its transaction, so webhook subscribers and
streams receive them like any event:

* :func:`create_incident` (``incident.created``), :func:`update_incident` (``incident.updated``
  naming the fields that changed, or ``incident.resolved``; a change that changes nothing, such
  as resolving a resolved incident, records nothing). Every event carries the incident's
  notification deadline (:func:`notify_by`) and whether it is overdue.
* :func:`schedule_window` (``maintenance.scheduled``), :func:`update_window`
  (``maintenance.started``, ``maintenance.completed``; ``maintenance.updated`` for a change of
  title, description or times alone). Windows go scheduled, in progress, completed, in that
  order only.
* :class:`MaintenanceBoard`: every project's started windows, as ``GET /readyz`` shows them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
import orjson

from common.db import Params
from common.errors import InvalidRequest, NotFound
from common.ids import is_id, new_id
from control_plane.audit import service as audit
from control_plane.authz import service as authz
from control_plane.authz.schemas import Forgotten
from control_plane.compliance import repository
from control_plane.compliance.schemas import (
    LATER_THAN_STARTS,
    Dsr,
    DsrBody,
    DsrQuery,
    FulfilBody,
    Fulfilment,
    Incident,
    IncidentBody,
    IncidentPatch,
    IncidentQuery,
    MaintenanceWindow,
    Severity,
    WindowBody,
    WindowPatch,
    WindowQuery,
)
from control_plane.sessions import service as sessions
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, listing_condition, page_by_id

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
        where=lambda p: listing_condition(
            p, {"status": query.status, "request_type": query.type}, overdue=query.overdue,
            overdue_when=repository.DSR_OVERDUE))


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
            ours = await _delete(conn, actor, row)
    if ours is None:  # in progress: resumed here if the process at it died
        ours = await repository.take_lease(pool, dsr_id, LEASE)
    if ours is None:
        return _answer(await _find(pool, actor.project_id, dsr_id))
    return _answer(await anonymize(pool, actor, ours))


async def _delete(conn: asyncpg.Connection, actor: Actor, row: asyncpg.Record) -> asyncpg.Record:
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
    anonymized = dict.fromkeys(HISTORY, 0)
    if user_id is not None:
        # After the rows above (memberships, directory groups): a SCIM change holding one of
        # them waits for this transaction, not the other way round (the stores are locked last).
        forgotten = await authz.forget_subject_in(conn, actor, subject=f"user:{user_id}")
        deleted["tuples"] = sum(f.deleted for f in forgotten)
        anonymized["tuple_changes"] = sum(f.redacted for f in forgotten)
        anonymized["audit_events"] = await _scrub_tuple_events(conn, project_id, user_id, email,
                                                               forgotten)
    result = {"user_found": user_id is not None, "sessions_revoked": revoked, "deleted": deleted,
              "anonymized": anonymized}
    return await repository.start_deletion(conn, row["id"], user_id=user_id, result=result,
                                           lease=LEASE)


async def _scrub_tuple_events(conn: asyncpg.Connection, project_id: str, user_id: str, email: str,
                              forgotten: list[Forgotten]) -> int:
    """Anonymize, in the deletion's transaction, the ``authz.tuples.written`` events of the
    revisions whose change-log rows named the user (now redacted) and of the revisions that
    deleted its tuples: they list tuples naming it in their metadata, and nothing else leads to
    them afterwards (they carry no ``user_id``; each has its revision's time). How many."""
    if not forgotten:
        return 0
    keys = [(r["created_at"], r["id"]) for r in await conn.fetch(
        repository.TUPLE_EVENTS, project_id, sorted({t for f in forgotten for t in f.times}),
        [f.store_id for f in forgotten], user_id)]
    if keys:
        p = Params()
        await conn.execute(repository.anonymize_events(
            p, project_id=project_id, user_id=user_id, email=email, keys=keys), *p.values)
    return len(keys)


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
                      lambda p: repository.by_actor(p, user_id),
                      lambda p: repository.by_group_member(p, user_id)]

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


def _rfc3339(value: datetime | None) -> str | None:
    """A time as the API writes it (UTC, ``Z``), for an event's metadata."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --- incidents ---------------------------------------------------------------------------------

INCIDENTS_LISTING: Final = "incidents"
SEV1_NOTICE: Final = timedelta(hours=4)
"""SPEC.md 8: the highest-severity incidents are notified within 4 hours of detection."""
BREACH_NOTICE: Final = timedelta(hours=72)
"""SPEC.md 8: personal-data breaches are notified within 72 hours of detection (GDPR art. 33)."""


def notify_by(severity: Severity, personal_data: bool, detected_at: datetime) -> datetime | None:
    """The notification deadline of an incident: the earliest that applies of ``detected_at`` +
    :data:`SEV1_NOTICE` (``sev1``) and + :data:`BREACH_NOTICE` (personal data); None when
    neither does."""
    deadlines = []
    if severity == "sev1":
        deadlines.append(detected_at + SEV1_NOTICE)
    if personal_data:
        deadlines.append(detected_at + BREACH_NOTICE)
    return min(deadlines, default=None)


def _overdue(row: asyncpg.Record) -> bool:
    deadline = row["notify_by"]
    return deadline is not None and row["notified_at"] is None and deadline < datetime.now(UTC)


def _incident(row: asyncpg.Record) -> Incident:
    return Incident(id=row["id"], severity=row["severity"], title=row["title"],
                    description=row["description"], personal_data=row["personal_data"],
                    affected_projects=list(row["affected_projects"]), status=row["status"],
                    detected_at=row["detected_at"], notify_by=row["notify_by"],
                    notified_at=row["notified_at"], overdue=_overdue(row),
                    created_at=row["created_at"], updated_at=row["updated_at"],
                    resolved_at=row["resolved_at"])


def _incident_facts(row: asyncpg.Record) -> dict[str, Any]:
    """What every incident event carries: the deadline and whether it is overdue among them."""
    return {"severity": row["severity"], "title": row["title"],
            "personal_data": row["personal_data"],
            "affected_projects": list(row["affected_projects"]), "status": row["status"],
            "detected_at": _rfc3339(row["detected_at"]), "notify_by": _rfc3339(row["notify_by"]),
            "notified_at": _rfc3339(row["notified_at"]), "overdue": _overdue(row)}


async def create_incident(conn: asyncpg.Connection, actor: Actor, body: IncidentBody) -> Incident:
    """An open incident with its notification deadline (``incident.created``); detected now
    unless ``body.detected_at`` says when, affecting the caller's project unless
    ``body.affected_projects`` names others."""
    assert actor.project_id is not None
    incident_id = new_id("inc")
    detected_at = body.detected_at or datetime.now(UTC)
    affected = list(dict.fromkeys(body.affected_projects or [actor.project_id]))
    async with conn.transaction():
        row = await repository.insert_incident(
            conn, incident_id=incident_id, project_id=actor.project_id, severity=body.severity,
            title=body.title, description=body.description, personal_data=body.personal_data,
            affected_projects=affected, detected_at=detected_at,
            notify_by=notify_by(body.severity, body.personal_data, detected_at))
        await audit.record(
            conn, actor, action="incident.created", target_type="incident",
            target_id=incident_id, description=f"Opened {body.severity} incident {incident_id}",
            metadata=_incident_facts(row))
    return _incident(row)


async def _find_incident(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                         incident_id: str, *, lock: bool = False) -> asyncpg.Record:
    row = None
    if is_id(incident_id, "inc"):
        row = await repository.find_incident(conn, project_id, incident_id, lock=lock)
    if row is None:
        raise NotFound("No incident with that id in this project.")
    return row


async def describe_incident(pool: asyncpg.Pool, project_id: str, incident_id: str) -> Incident:
    """The incident. Raises NotFound (another project's too)."""
    return _incident(await _find_incident(pool, project_id, incident_id))


async def list_incidents(pool: asyncpg.Pool, listing: Listing,
                         query: IncidentQuery) -> Page[Incident]:
    """A page of the project's incidents, oldest first. Raises InvalidRequest (cursor)."""
    return await page_by_id(
        pool, listing, query, table="incidents", columns=repository.INCIDENT_COLUMNS,
        row=_incident,
        where=lambda p: listing_condition(
            p, {"status": query.status, "severity": query.severity}, overdue=query.overdue,
            overdue_when=repository.INCIDENT_OVERDUE))


async def update_incident(conn: asyncpg.Connection, actor: Actor, *, incident_id: str,
                          body: IncidentPatch) -> Incident:
    """Change what ``body`` names; ``status`` ``resolved`` resolves it (``incident.resolved``,
    else ``incident.updated``, metadata ``changed`` naming the fields that changed). A new
    severity or ``personal_data`` moves the deadline. Nothing changed (a resolved incident
    resolved again): no event. Raises NotFound, InvalidRequest (``notified`` with
    ``notified_at``; ``notified_at`` before ``detected_at``)."""
    assert actor.project_id is not None
    given = body.model_fields_set
    if {"notified", "notified_at"} <= given:
        raise InvalidRequest.field("notified", "give notified or notified_at, not both")
    async with conn.transaction():
        before = await _find_incident(conn, actor.project_id, incident_id, lock=True)
        wanted: dict[str, Any] = {name: getattr(body, name) for name in
                                  ("title", "description", "severity", "personal_data")
                                  if name in given}
        if body.affected_projects is not None:
            wanted["affected_projects"] = list(dict.fromkeys(body.affected_projects))
        if "notified" in given:
            wanted["notified_at"] = (before["notified_at"] or datetime.now(UTC)) if body.notified \
                else None
        elif "notified_at" in given:
            if body.notified_at is not None and body.notified_at < before["detected_at"]:
                raise InvalidRequest.field("notified_at", "must not be earlier than detected_at")
            wanted["notified_at"] = body.notified_at
        changes = {name: value for name, value in wanted.items() if value != before[name]}
        deadline = notify_by(changes.get("severity", before["severity"]),
                             changes.get("personal_data", before["personal_data"]),
                             before["detected_at"])
        if deadline != before["notify_by"]:
            changes["notify_by"] = deadline
        resolve = body.status == "resolved" and before["status"] != "resolved"
        if not changes and not resolve:
            return _incident(before)
        row = await repository.update_incident(conn, incident_id, changes, resolve=resolve)
        changed = sorted([*changes, *(["status"] if resolve else [])])
        action, verb = ("incident.resolved", "Resolved") if resolve else \
            ("incident.updated", "Updated")
        await audit.record(
            conn, actor, action=action, target_type="incident", target_id=incident_id,
            description=f"{verb} {row['severity']} incident {incident_id}",
            metadata={**_incident_facts(row), "changed": changed})
    return _incident(row)


# --- maintenance windows -----------------------------------------------------------------------

WINDOWS_LISTING: Final = "maintenance_windows"
NEXT_STATUS: Final = {"scheduled": "in_progress", "in_progress": "completed"}
"""The one status each status may move to (completed is the end)."""
WINDOW_EVENTS: Final = {"in_progress": ("maintenance.started", "Started"),
                        "completed": ("maintenance.completed", "Completed")}


def _window(row: asyncpg.Record) -> MaintenanceWindow:
    return MaintenanceWindow(id=row["id"], title=row["title"], description=row["description"],
                             status=row["status"], starts_at=row["starts_at"],
                             ends_at=row["ends_at"], started_at=row["started_at"],
                             completed_at=row["completed_at"], created_at=row["created_at"],
                             updated_at=row["updated_at"])


def _window_facts(row: asyncpg.Record) -> dict[str, Any]:
    return {"title": row["title"], "status": row["status"],
            "starts_at": _rfc3339(row["starts_at"]), "ends_at": _rfc3339(row["ends_at"]),
            "started_at": _rfc3339(row["started_at"]),
            "completed_at": _rfc3339(row["completed_at"])}


async def schedule_window(conn: asyncpg.Connection, actor: Actor,
                          body: WindowBody) -> MaintenanceWindow:
    """A scheduled window (``maintenance.scheduled``)."""
    assert actor.project_id is not None
    window_id = new_id("mw")
    async with conn.transaction():
        row = await repository.insert_window(
            conn, window_id=window_id, project_id=actor.project_id, title=body.title,
            description=body.description, starts_at=body.starts_at, ends_at=body.ends_at)
        await audit.record(
            conn, actor, action="maintenance.scheduled", target_type="maintenance_window",
            target_id=window_id, description=f"Scheduled maintenance window {window_id}",
            metadata=_window_facts(row))
    return _window(row)


async def _find_window(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, window_id: str,
                       *, lock: bool = False) -> asyncpg.Record:
    row = None
    if is_id(window_id, "mw"):
        row = await repository.find_window(conn, project_id, window_id, lock=lock)
    if row is None:
        raise NotFound("No maintenance window with that id in this project.")
    return row


async def describe_window(pool: asyncpg.Pool, project_id: str,
                          window_id: str) -> MaintenanceWindow:
    """The window. Raises NotFound (another project's too)."""
    return _window(await _find_window(pool, project_id, window_id))


async def list_windows(pool: asyncpg.Pool, listing: Listing,
                       query: WindowQuery) -> Page[MaintenanceWindow]:
    """A page of the project's windows, oldest first. Raises InvalidRequest (cursor)."""
    return await page_by_id(
        pool, listing, query, table="maintenance_windows", columns=repository.WINDOW_COLUMNS,
        row=_window, where=lambda p: listing_condition(p, {"status": query.status}))


async def update_window(conn: asyncpg.Connection, actor: Actor, *, window_id: str,
                        body: WindowPatch) -> MaintenanceWindow:
    """Change what ``body`` names (``schemas.WindowPatch``): ``status`` starts
    (``maintenance.started``) or completes (``maintenance.completed``) the window; other changes
    alone are ``maintenance.updated``; each event's ``changed`` names what changed, and a body
    that changes nothing (the status it has) records nothing. Raises NotFound, InvalidRequest
    naming ``status`` (not the next status), ``starts_at`` (once started), ``ends_at`` (not
    after ``starts_at``) or the field a completed window was asked to change."""
    assert actor.project_id is not None
    given = body.model_fields_set
    async with conn.transaction():
        before = await _find_window(conn, actor.project_id, window_id, lock=True)
        current = before["status"]
        target = body.status if body.status not in (None, current) else None
        if target is not None and NEXT_STATUS.get(current) != target:
            raise InvalidRequest.field(
                "status", f"cannot go from {current} to {target} (a window goes scheduled, "
                          "in_progress, completed, in that order)")
        changes: dict[str, Any] = {
            name: getattr(body, name) for name in ("title", "description", "starts_at", "ends_at")
            if name in given and getattr(body, name) != before[name]}
        if changes and current == "completed":
            raise InvalidRequest.field(min(changes), "cannot change once the window is completed")
        if "starts_at" in changes and current != "scheduled":
            raise InvalidRequest.field("starts_at", "cannot change once the window has started")
        if changes.get("ends_at", before["ends_at"]) <= changes.get("starts_at",
                                                                    before["starts_at"]):
            if "ends_at" in changes:
                raise InvalidRequest.field("ends_at", LATER_THAN_STARTS)
            raise InvalidRequest.field("starts_at", "must be earlier than ends_at")
        if not changes and target is None:
            return _window(before)
        row = await repository.update_window(conn, window_id, changes, status=target)
        action, verb = WINDOW_EVENTS[target] if target is not None else \
            ("maintenance.updated", "Updated")
        await audit.record(
            conn, actor, action=action, target_type="maintenance_window", target_id=window_id,
            description=f"{verb} maintenance window {window_id}",
            metadata={**_window_facts(row),
                      "changed": sorted([*changes, *(["status"] if target else [])])})
    return _window(row)


BOARD_SECONDS: Final = 5.0
"""How long ``GET /readyz`` shows the windows it read before reading them again."""
BOARD_TIMEOUT: Final = 0.5
"""How long a probe waits for the read (then it shows what it knew)."""
BOARD_LIMIT: Final = 100
"""The most windows shown (the oldest started first)."""


class MaintenanceBoard:
    """Every project's started maintenance windows, as ``GET /readyz`` shows them under
    ``detail.maintenance``: ``{"in_progress": [{"id", "started_at", "ends_at"}],
    "as_of": when they were read}``. Informative only: readiness never depends on it.

    A probe comes every few seconds from each orchestrator replica, so the windows are read
    (one statement over a partial index of the started windows) at most once per
    :data:`BOARD_SECONDS`, by one probe while the others wait for it; a window started or
    completed through this process is shown at once (:meth:`forget`), through another one
    within :data:`BOARD_SECONDS`. A read that fails or takes longer than :data:`BOARD_TIMEOUT`
    (PostgreSQL away) leaves the last windows read, with their ``as_of``."""

    def __init__(self, *, ttl: float = BOARD_SECONDS) -> None:
        self._ttl = ttl
        self._shown: dict[str, Any] = {"in_progress": [], "as_of": None}
        self._read_at = -float("inf")
        self._generation = 0
        self._failing = False
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Read again at the next probe (a window changed)."""
        self._generation += 1
        self._read_at = -float("inf")

    def _fresh(self) -> bool:
        return time.monotonic() - self._read_at < self._ttl

    async def detail(self, pool: asyncpg.Pool | None) -> dict[str, Any]:
        """What the probe shows (the class's docstring)."""
        if self._fresh() or pool is None:
            return self._shown
        async with self._lock:
            if self._fresh():
                return self._shown
            generation, started = self._generation, time.monotonic()
            try:
                async with asyncio.timeout(BOARD_TIMEOUT):
                    rows = await pool.fetch(repository.IN_PROGRESS, BOARD_LIMIT)
            except Exception as exc:  # never the probe's failure
                if not self._failing:
                    log.warning("maintenance windows not read for /readyz: %r", exc)
                self._failing, self._read_at = True, started
                return self._shown
            self._failing = False
            self._shown = {"in_progress": [dict(r) for r in rows], "as_of": datetime.now(UTC)}
            # A window changed during the read: the next probe reads again.
            self._read_at = started if generation == self._generation else -float("inf")
            return self._shown
