"""Compliance SQL: data-subject requests (``dsr_requests``, migration 0013), the rows a deletion
removes, the history it anonymizes in batches, and what an export gathers; incidents and
maintenance windows (``incidents``, ``maintenance_windows``, migration 0014)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

import asyncpg

from common.db import Params

DSR_COLUMNS: Final = (
    "id, project_id, request_type, user_email, notes, due_days, status, created_at, due_at, fulfilled_at, "
    "output_artifact_url, result, user_id, deleted_at, locked_until, output_sha256"
)
REDACTED: Final = "[deleted]"
"""What an anonymized e-mail or user id reads as (SPEC.md 4 rule 2)."""


# --- requests ---------------------------------------------------------------------------------


async def insert(conn: asyncpg.Connection, *, dsr_id: str, project_id: str, request_type: str,
                 user_email: str, notes: str | None, due_days: int) -> asyncpg.Record:
    """A new pending request, due ``due_days`` after this statement's time."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO dsr_requests (id, project_id, request_type, user_email, notes, due_days,
                                      due_at)
            VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(days => $6))
            RETURNING {DSR_COLUMNS}""",
        dsr_id, project_id, request_type, user_email, notes, due_days)
    return row


async def find(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, dsr_id: str, *,
               lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {DSR_COLUMNS} FROM dsr_requests WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if lock else ""), dsr_id, project_id)
    return row


LISTED: Final = "(SELECT *, id AS dsr_id FROM dsr_requests) d"
"""The listing's ``FROM`` (alias ``d``): requests keyed by ``dsr_id``, as the API names it."""


DSR_OVERDUE: Final = "(status <> 'fulfilled' AND due_at < now())"


async def start_deletion(conn: asyncpg.Connection, dsr_id: str, *, user_id: str | None,
                         result: dict[str, Any], lease: timedelta) -> asyncpg.Record:
    """The request is ``in_progress``: the user's rows are gone as of now (``deleted_at``), its
    history is anonymized by whoever holds the lease."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE dsr_requests SET status = 'in_progress', user_id = $2, deleted_at = now(),
                                    result = $3, locked_until = now() + $4
            WHERE id = $1 RETURNING {DSR_COLUMNS}""", dsr_id, user_id, result, lease)
    return row


async def take_lease(conn: asyncpg.Connection | asyncpg.Pool, dsr_id: str,
                     lease: timedelta) -> asyncpg.Record | None:
    """The lease of an ``in_progress`` deletion whose lease lapsed (or is ours to extend: the
    caller just started it), or None when another process holds it or it is finished."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""UPDATE dsr_requests SET locked_until = now() + $2
            WHERE id = $1 AND status = 'in_progress'
              AND (locked_until IS NULL OR locked_until < now())
            RETURNING {DSR_COLUMNS}""", dsr_id, lease)
    return row


LAPSED: Final = """
SELECT id, project_id FROM dsr_requests
WHERE status = 'in_progress' AND (locked_until IS NULL OR locked_until < now())
ORDER BY locked_until NULLS FIRST LIMIT $1"""
"""Deletions whose anonymizing process died (its lease lapsed)."""


async def progress(conn: asyncpg.Connection, dsr_id: str, table: str, count: int,
                   lease: timedelta) -> None:
    """Add ``count`` rows of ``table`` anonymized, and extend the lease, in the batch's
    transaction."""
    await conn.execute(
        """UPDATE dsr_requests
           SET result = jsonb_set(result, ARRAY['anonymized', $2],
                                  to_jsonb(coalesce((result #>> ARRAY['anonymized', $2])::bigint, 0) + $3)),
               locked_until = now() + $4
           WHERE id = $1""", dsr_id, table, count, lease)


async def finish(conn: asyncpg.Connection, dsr_id: str, *, result: dict[str, Any] | None = None,
                 output_artifact_url: str | None = None, output_sha256: str | None = None,
                 document: bytes | None = None) -> asyncpg.Record:
    """The request is fulfilled now; ``result`` replaces the stored one when given."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE dsr_requests SET status = 'fulfilled', fulfilled_at = now(), locked_until = NULL,
                                    result = coalesce($2, result), output_artifact_url = $3,
                                    output_sha256 = $4, document = $5
            WHERE id = $1 RETURNING {DSR_COLUMNS}""",
        dsr_id, result, output_artifact_url, output_sha256, document)
    return row


async def document(conn: asyncpg.Connection | asyncpg.Pool, dsr_id: str) -> bytes | None:
    """The export document as stored (the bytes its digest is of)."""
    value: bytes | None = await conn.fetchval("SELECT document FROM dsr_requests WHERE id = $1",
                                              dsr_id)
    return value


# --- deletion: the user's rows, in one transaction ---------------------------------------------

SUBJECT: Final = """
SELECT id, email, phone_number FROM users
WHERE project_id = $1 AND lower(email) = lower($2) FOR UPDATE"""
"""The project's user of the e-mail, locked: a sign-in waiting on the row fails once it is gone
(its session's foreign key) instead of leaving a row behind."""

# (name in the answer, statement over the named values {project}, {user} (null: no user), {email},
# {phone}).
# Children first, so each count is the table's own (nothing is left to a cascade).
DELETIONS: Final = (
    ("webhook_deliveries", """
DELETE FROM webhook_deliveries d USING audit_events e
WHERE d.project_id = {project} AND d.status = 'pending' AND e.project_id = {project} AND e.id = d.event_id
  AND e.created_at = d.event_created_at
  AND (e.user_id = {user} OR e.actor_id = {user}
       OR (e.metadata ? 'user_email' AND lower(e.metadata ->> 'user_email') = lower({email})))"""),
    ("refresh_tokens", """
DELETE FROM refresh_tokens WHERE session_id IN (SELECT id FROM sessions WHERE user_id = {user})"""),
    ("step_up_challenges", "DELETE FROM step_up_challenges WHERE user_id = {user}"),
    ("recovery_requests", "DELETE FROM recovery_requests WHERE user_id = {user}"),
    ("sessions", "DELETE FROM sessions WHERE user_id = {user}"),
    ("oauth_identities", """
DELETE FROM oauth_identities
WHERE user_id = {user} OR (project_id = {project} AND lower(email) = lower({email}))"""),
    ("passkeys", "DELETE FROM passkeys WHERE user_id = {user}"),
    ("webauthn_challenges", "DELETE FROM webauthn_challenges WHERE user_id = {user}"),
    ("magic_link_tokens", """
DELETE FROM magic_link_tokens
WHERE user_id = {user}
   OR (project_id = {project} AND (lower(destination) = lower({email}) OR destination = {phone}))"""),
    ("messages", """
DELETE FROM messages
WHERE project_id = {project} AND (lower(destination) = lower({email}) OR destination = {phone})"""),
    ("scim_group_members", "DELETE FROM scim_group_members WHERE user_id = {user}"),
    ("scim_users", "DELETE FROM scim_users WHERE user_id = {user}"),
    ("memberships", "DELETE FROM memberships WHERE user_id = {user}"),
    ("invitations", "DELETE FROM invitations WHERE project_id = {project} AND lower(email) = lower({email})"),
    ("risk_known", "DELETE FROM risk_known WHERE user_id = {user}"),
    ("risk_last_locations", "DELETE FROM risk_last_locations WHERE user_id = {user}"),
    ("users", "DELETE FROM users WHERE id = {user}"),
    # An export made earlier holds a copy of everything: its document goes, its digest and URL
    # stay as the record that it was made.
    ("export_documents", """
UPDATE dsr_requests SET document = NULL
WHERE project_id = {project} AND request_type = 'export' AND lower(user_email) = lower({email})
  AND document IS NOT NULL"""),
)
FORGET_INVITER: Final = """
UPDATE invitations SET created_by = NULL WHERE project_id = {project} AND created_by = {user}"""
"""Invitations the user sent to others stay (they are the organization's), without its id."""


class _Named(dict[str, str]):
    """``str.format_map`` over this gives each ``{name}`` its ``$n`` of ``p`` (by name)."""

    def __init__(self, p: Params) -> None:
        super().__init__()
        self.p = p

    def __missing__(self, name: str) -> str:
        return self.p[name]


def named(statement: str) -> tuple[str, Params]:
    """``statement`` with each ``{name}`` a placeholder, and the ``Params`` that binds them."""
    p = Params()
    return statement.format_map(_Named(p)), p


async def delete_subject(conn: asyncpg.Connection, *, project_id: str, user_id: str | None,
                         email: str, phone: str | None) -> dict[str, int]:
    """Delete every row of :data:`DELETIONS` that names the user or its contacts, in ``conn``'s
    transaction; the count per table."""
    values = {"project": project_id, "user": user_id, "email": email, "phone": phone}
    counts = {}
    for name, statement in DELETIONS:
        sql, p = named(statement)
        status = await conn.execute(sql, *p.bind_from(values))
        counts[name] = int(status.split()[-1])
    if user_id is not None:
        sql, p = named(FORGET_INVITER)
        await conn.execute(sql, *p.bind_from(values))
    return counts


# --- deletion: anonymizing the history, in batches ----------------------------------------------


def like_regex(text: str) -> str:
    """A PostgreSQL regular expression (ARE) matching ``text`` literally: every character that
    is not a letter or digit escaped (``\\`` before a non-alphanumeric is that character)."""
    return "".join(c if c.isalnum() else "\\" + c for c in text)


def naming_events(p: Params, *, project_id: str, selectors: list[str], limit: int) -> str:
    """The keys ``(created_at, id)`` of at most ``limit`` events of the project that any of
    ``selectors`` (SQL over alias ``e`` whose values ``p`` holds) chooses, newest first."""
    branches = " UNION ".join(
        f"(SELECT e.created_at, e.id FROM audit_events e"
        f" WHERE e.project_id = {p(project_id)} AND ({selector}))" for selector in selectors)
    return f"SELECT created_at, id FROM ({branches}) k ORDER BY created_at DESC, id DESC LIMIT {p(limit)}"


def anonymize_events(p: Params, *, project_id: str, user_id: str | None, email: str,
                     keys: list[tuple[datetime, str]]) -> str:
    """The batch statement: the project's events of ``keys`` lose the user: ``user_id`` (its id
    in ``user_id``, ``actor_id``, ``target_id`` becomes null) and ``email`` (any case; in the
    description and every metadata value, as the id too, it becomes :data:`REDACTED`). An
    event that was the user's (by ``user_id`` or ``actor_id``) also loses its client address,
    user agent and identity-provider subject (the columns, and metadata ``ip``, ``user_agent``,
    ``device``, ``subject``). Events are
    found by primary key: the indexes that chose them hold an entry per row version until
    VACUUM, and a statement reading them again for each batch would read every earlier
    batch's entries too."""
    email_re = p(like_regex(email))

    def scrub(expr: str) -> str:
        out = f"regexp_replace({expr}, {email_re}, '{REDACTED}', 'gi')"
        return out if user_id is None else f"regexp_replace({out}, {p(user_id)}, '{REDACTED}', 'g')"

    def forget(column: str) -> str:
        if user_id is None:
            return scrub(f"e.{column}")
        return f"CASE WHEN e.{column} = {p(user_id)} THEN NULL ELSE {scrub('e.' + column)} END"

    own = "FALSE" if user_id is None else f"(e.user_id = {p(user_id)} OR e.actor_id = {p(user_id)})"
    user = "e.user_id" if user_id is None else \
        f"CASE WHEN e.user_id = {p(user_id)} THEN NULL ELSE e.user_id END"
    return f"""
UPDATE audit_events e SET
    user_id = {user},
    actor_id = {forget('actor_id')},
    target_id = {forget('target_id')},
    ip = CASE WHEN {own} THEN NULL ELSE e.ip END,
    user_agent = CASE WHEN {own} THEN NULL ELSE e.user_agent END,
    description = {scrub('e.description')},
    metadata = CASE WHEN {own}
                    THEN {scrub('e.metadata::text')}::jsonb - 'ip' - 'user_agent' - 'device' - 'subject'
                    ELSE {scrub('e.metadata::text')}::jsonb END
FROM unnest({p([k[0] for k in keys])}::timestamptz[], {p([k[1] for k in keys])}::text[])
     AS batch (created_at, id)
WHERE e.created_at = batch.created_at AND e.id = batch.id AND e.project_id = {p(project_id)}"""


TUPLE_EVENTS: Final = """
SELECT e.created_at, e.id FROM audit_events e
WHERE e.project_id = $1 AND e.created_at = ANY($2::timestamptz[]) AND e.target_id = ANY($3::text[])
  AND e.action = 'authz.tuples.written' AND strpos(e.metadata::text, $4) > 0"""
"""The ``authz.tuples.written`` events of the stores ``$3`` written at the times ``$2`` (a
revision's event has its transaction's time, as its change-log rows) that name ``$4`` (the
user's id) in their metadata: found by the project's time index."""


def by_user(p: Params, user_id: str) -> str:
    return f"e.user_id = {p(user_id)}"


def by_group_member(p: Params, user_id: str) -> str:
    """A directory group's change (``scim.group.synced``) that added or removed the user: it
    names members in its metadata only (its action's index finds the project's few)."""
    uid = p(user_id)
    return (f"e.action = 'scim.group.synced' AND (e.metadata -> 'members_added' ? {uid}"
            f" OR e.metadata -> 'members_removed' ? {uid})")


def by_actor(p: Params, user_id: str) -> str:
    return f"e.actor_id = {p(user_id)}"


def by_email_field(p: Params, email: str, before: datetime) -> str:
    """Events whose metadata names the e-mail as ``user_email``, written ``before`` the
    deletion: the same address registered again afterwards is another user's."""
    return (f"e.metadata ? 'user_email' AND lower(e.metadata ->> 'user_email') = lower({p(email)})"
            f" AND e.created_at < {p(before)}")


ANONYMIZE_DECISIONS: Final = """
WITH batch AS (SELECT id FROM risk_decisions WHERE project_id = $1 AND user_id = $2 LIMIT $3)
UPDATE risk_decisions d
SET user_id = NULL,
    inputs = d.inputs - 'ip' - 'user_agent' - 'device' - 'place' - 'last_sign_in'
FROM batch WHERE d.id = batch.id"""
"""At most ``$3`` of the user's risk decisions lose the user and what described the sign-in's
client (address, user agent, device, place, the previous sign-in); scores, signals and the
decision stay."""


# --- export ------------------------------------------------------------------------------------

EXPORT_USER: Final = """
SELECT id, email, email_verified, phone_number, phone_verified, name, metadata, created_at,
       updated_at, last_sign_in_at
FROM users WHERE project_id = $1 AND lower(email) = lower($2)"""
EXPORT_PARTS: Final = (
    ("identities", """
SELECT provider, issuer, subject, email, created_at, last_used_at FROM oauth_identities
WHERE user_id = {user} ORDER BY created_at"""),
    ("passkeys", """
SELECT id, credential_id, public_key, aaguid::text AS aaguid, transports, name, sign_count,
       backup_eligible, backup_state, created_at, last_used_at
FROM passkeys WHERE user_id = {user} ORDER BY id"""),
    ("memberships", """
SELECT id, organization_id, role, status, created_at, updated_at FROM memberships
WHERE user_id = {user} ORDER BY id"""),
    ("sessions", """
SELECT id, organization_id, status, auth_method, ip, user_agent, created_at, expires_at,
       last_refreshed_at, revoked_at, revoke_reason
FROM sessions WHERE user_id = {user} ORDER BY id"""),
    ("risk_decisions", """
SELECT id, session_id, method, score, decision, signals, reasons, inputs, created_at
FROM risk_decisions WHERE project_id = {project} AND user_id = {user} ORDER BY id"""),
    ("step_up_challenges", """
SELECT id, decision_id, method, organization_id, status, satisfied_by, session_id, created_at,
       expires_at, used_at
FROM step_up_challenges WHERE user_id = {user} ORDER BY id"""),
    ("recovery_requests", """
SELECT id, channel, destination, reason, status, decision_note, decided_at, created_at
FROM recovery_requests WHERE user_id = {user} ORDER BY id"""),
    ("directory_users", """
SELECT organization_id, user_name, external_id, resource, created_at, updated_at
FROM scim_users WHERE user_id = {user} ORDER BY organization_id"""),
    ("directory_groups", """
SELECT g.organization_id, g.id AS group_id, g.display_name, m.display
FROM scim_group_members m JOIN scim_groups g ON g.id = m.group_id
WHERE m.user_id = {user} ORDER BY g.organization_id, g.id"""),
    # What a deletion forgets (authz.forget_subject_in): the tuples naming user:<id> as their
    # user, their userset user's object, or their object. Reads the project's stores' tuples.
    ("tuples", """
SELECT t.store_id, t.object, t.relation, t.subject AS "user", t.created_at
FROM stores s JOIN tuples t ON t.store_id = s.id
WHERE s.project_id = {project}
  AND (t.subject = 'user:' || {user} OR t.object = 'user:' || {user}
       OR starts_with(t.subject, 'user:' || {user} || '#'))
ORDER BY t.store_id, t.object, t.relation, t.subject"""),
)
"""What an export gathers besides the user row and the audit events (statements over the named
values ``{user}``, ``{project}``):
public parts only (no token hash, no secret)."""


def export_events(columns: str) -> str:
    """The user's audit events (by ``user_id`` or as the actor), oldest first."""
    return f"""
SELECT {columns} FROM audit_events e
WHERE e.project_id = $2 AND e.user_id = $1
UNION ALL
SELECT {columns} FROM audit_events e
WHERE e.project_id = $2 AND e.actor_id = $1 AND e.user_id IS DISTINCT FROM $1
ORDER BY created_at, id"""


# --- incidents ---------------------------------------------------------------------------------

INCIDENT_COLUMNS: Final = (
    "id, project_id, severity, title, description, personal_data, affected_projects, status, "
    "detected_at, notify_by, notified_at, created_at, updated_at, resolved_at"
)
INCIDENT_FIELDS: Final = frozenset({"severity", "title", "description", "personal_data",
                                    "affected_projects", "notify_by", "notified_at"})
"""The columns a change may set (the service's names, never user input)."""
INCIDENT_OVERDUE: Final = "(notify_by IS NOT NULL AND notified_at IS NULL AND notify_by < now())"


async def insert_incident(conn: asyncpg.Connection, *, incident_id: str, project_id: str,
                          severity: str, title: str, description: str | None,
                          personal_data: bool, affected_projects: list[str],
                          detected_at: datetime, notify_by: datetime | None) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO incidents (id, project_id, severity, title, description, personal_data,
                                   affected_projects, detected_at, notify_by)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {INCIDENT_COLUMNS}""",
        incident_id, project_id, severity, title, description, personal_data, affected_projects,
        detected_at, notify_by)
    return row


async def find_incident(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        incident_id: str, *, lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {INCIDENT_COLUMNS} FROM incidents WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if lock else ""), incident_id, project_id)
    return row


async def update_incident(conn: asyncpg.Connection, incident_id: str, changes: dict[str, Any],
                          *, resolve: bool) -> asyncpg.Record:
    """Set ``changes`` (columns of :data:`INCIDENT_FIELDS`) and, with ``resolve``, resolve it
    now."""
    assert INCIDENT_FIELDS.issuperset(changes)
    p = Params()
    sets = [f"{column} = {p(value)}" for column, value in changes.items()]
    if resolve:
        sets += ["status = 'resolved'", "resolved_at = now()"]
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE incidents SET {', '.join([*sets, 'updated_at = now()'])}
            WHERE id = {p(incident_id)} RETURNING {INCIDENT_COLUMNS}""", *p.values)
    return row


# --- maintenance windows -----------------------------------------------------------------------

WINDOW_COLUMNS: Final = (
    "id, project_id, title, description, status, starts_at, ends_at, started_at, completed_at, "
    "created_at, updated_at"
)
WINDOW_FIELDS: Final = frozenset({"title", "description", "starts_at", "ends_at"})
"""The columns a change may set besides the status (the service's names, never user input)."""


async def insert_window(conn: asyncpg.Connection, *, window_id: str, project_id: str, title: str,
                        description: str | None, starts_at: datetime,
                        ends_at: datetime) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO maintenance_windows (id, project_id, title, description, starts_at, ends_at)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING {WINDOW_COLUMNS}""",
        window_id, project_id, title, description, starts_at, ends_at)
    return row


async def find_window(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, window_id: str,
                      *, lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {WINDOW_COLUMNS} FROM maintenance_windows WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if lock else ""), window_id, project_id)
    return row


async def update_window(conn: asyncpg.Connection, window_id: str, changes: dict[str, Any], *,
                        status: str | None) -> asyncpg.Record:
    """Set ``changes`` (columns of :data:`WINDOW_FIELDS`) and move to ``status`` now (its
    ``started_at`` or ``completed_at``) when given."""
    assert WINDOW_FIELDS.issuperset(changes)
    p = Params()
    sets = [f"{column} = {p(value)}" for column, value in changes.items()]
    if status == "in_progress":
        sets += ["status = 'in_progress'", "started_at = now()"]
    elif status == "completed":
        sets += ["status = 'completed'", "completed_at = now()"]
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE maintenance_windows SET {', '.join([*sets, 'updated_at = now()'])}
            WHERE id = {p(window_id)} RETURNING {WINDOW_COLUMNS}""", *p.values)
    return row


IN_PROGRESS: Final = """
SELECT id, started_at, ends_at FROM maintenance_windows
WHERE status = 'in_progress' ORDER BY started_at, id LIMIT $1"""
"""Every project's started windows, oldest first (the partial index
``maintenance_windows_in_progress``): what ``GET /readyz`` shows. Ids and times only: the
probe answers anyone who reaches it, and a title is a project's own text."""
