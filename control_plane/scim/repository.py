"""SCIM SQL (migration 0018): ``scim_tokens``, ``scim_users``, ``scim_groups`` and
``scim_group_members``, and the organization's SCIM view of its members (``memberships`` with
their ``users`` and what the directory said of them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import asyncpg

from common.db import Params, Statement
from control_plane.audit import service as audit
from control_plane.organizations import service as organizations
from control_plane.users import service as users
from control_plane.users.schemas import USER_FIELDS

USER_NAME_INDEX: Final = "scim_users_user_name"
DISPLAY_NAME_INDEX: Final = "scim_groups_display_name"

# --- tokens ------------------------------------------------------------------------------------


async def put_token(conn: asyncpg.Connection, *, token_id: str, org_id: str, project_id: str,
                    token_hash: bytes, sealed: bytes, store_id: str | None,
                    keep_store: bool) -> str | None:
    """The organization's token, replacing the one it had (which then finds nothing); the store
    is ``store_id``, or the one it had with ``keep_store``. Returns the store."""
    store: str | None = await conn.fetchval(
        """INSERT INTO scim_tokens (organization_id, id, project_id, token_hash, token_sealed,
                                    store_id)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (organization_id) DO UPDATE
           SET id = EXCLUDED.id, token_hash = EXCLUDED.token_hash,
               token_sealed = EXCLUDED.token_sealed, created_at = now(),
               store_id = CASE WHEN $7 THEN scim_tokens.store_id ELSE EXCLUDED.store_id END
           RETURNING store_id""",
        org_id, token_id, project_id, token_hash, sealed, store_id, keep_store)
    return store


async def caller(conn: asyncpg.Connection | asyncpg.Pool, token_hash: bytes) -> asyncpg.Record | None:
    """``id``, ``organization_id``, ``project_id``, ``store_id`` of the token with that hash,
    and ``project_name``."""
    row: asyncpg.Record | None = await conn.fetchrow(
        """SELECT t.id, t.organization_id, t.project_id, t.store_id, p.name AS project_name
           FROM scim_tokens t JOIN projects p ON p.id = t.project_id
           WHERE t.token_hash = $1""", token_hash)
    return row


async def token_store(conn: asyncpg.Connection, org_id: str) -> str | None:
    """The store the organization's SCIM token names (None: no token, or no store)."""
    store: str | None = await conn.fetchval(
        "SELECT store_id FROM scim_tokens WHERE organization_id = $1", org_id)
    return store


# --- users -------------------------------------------------------------------------------------

USER_FROM: Final = """memberships m JOIN users u ON u.id = m.user_id
LEFT JOIN scim_users s ON s.organization_id = m.organization_id AND s.user_id = m.user_id"""
USER_DOC: Final = """coalesce(s.resource, jsonb_strip_nulls(jsonb_build_object(
    'userName', coalesce(u.email, u.phone_number, u.id), 'displayName', nullif(u.name, ''),
    'emails', CASE WHEN u.email IS NULL THEN NULL
                   ELSE jsonb_build_array(jsonb_build_object('value', u.email, 'primary', true))
              END)))"""
"""A member's SCIM document: what the directory said, or, for a member it never named, one
made of the user (its e-mail address as ``userName``)."""
USER_COLUMNS: Final = f"""m.user_id AS id, m.id AS membership_id, m.status, m.created_at,
greatest(m.updated_at, u.updated_at, s.updated_at) AS updated_at, u.email, u.name,
s.user_id IS NOT NULL AS synced, {USER_DOC} AS doc"""


async def find_user(conn: asyncpg.Connection | asyncpg.Pool, org_id: str, user_id: str, *,
                    lock: bool = False) -> asyncpg.Record | None:
    """The member's row of the view (``USER_COLUMNS``); its membership locked with ``lock``."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {USER_COLUMNS} FROM {USER_FROM}
            WHERE m.organization_id = $1 AND m.user_id = $2"""
        + (" FOR UPDATE OF m" if lock else ""), org_id, user_id)
    return row


async def lock_user(conn: asyncpg.Connection, org_id: str,
                    user_id: str) -> asyncpg.Record | None:
    """The member's row of the view (``USER_COLUMNS``) and its user's columns (``user_<field>``
    for each of ``USER_FIELDS``), its membership and its user locked for a change."""
    user = ", ".join(f"u.{f} AS user_{f}" for f in USER_FIELDS)
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {USER_COLUMNS}, {user} FROM {USER_FROM}
            WHERE m.organization_id = $1 AND m.user_id = $2 FOR UPDATE OF m, u""",
        org_id, user_id)
    return row


async def write_user(conn: asyncpg.Connection, *, user_changes: list[str], put: bool,
                     event: bool, values: Mapping[str, object]) -> asyncpg.Record:
    """One statement for a change of a member locked by :func:`lock_user`: its user's
    ``user_changes`` with ``user.updated`` (``users.update_from``, none when empty), what the
    directory says of it (``put``: the parameters ``org_id``, ``user_id``, ``user_name``,
    ``external_id``, ``resource``) and ``scim.user.synced`` (``event``, parameters
    ``scim_event_*``; only with ``put``). Returns ``doc`` (the stored resource, or null
    without ``put``) and ``updated_at`` (the latest of the rows written). Raises
    asyncpg.UniqueViolationError (``USER_NAME_INDEX``, or the users' e-mail address index)."""
    assert put or not event
    p = Params()
    ctes, times = [], []
    if user_changes:
        ctes.append(users.update_from(p, user_changes))
        times.append("(SELECT updated_at FROM user_update)")
    if put:
        ctes.append(f"""s AS (
    INSERT INTO scim_users (organization_id, user_id, user_name, external_id, resource)
    VALUES ({p["org_id"]}, {p["scim_user_id"]}, {p["user_name"]}, {p["external_id"]},
            {p["resource"]})
    ON CONFLICT (organization_id, user_id) DO UPDATE
    SET user_name = EXCLUDED.user_name, external_id = EXCLUDED.external_id,
        resource = EXCLUDED.resource, updated_at = now()
    RETURNING resource, updated_at)""")
        times.append("(SELECT updated_at FROM s)")
    if event:
        ctes.append(f"scim_event AS ({audit.insert_from('s', p, name='scim_event')})")
    doc = "(SELECT resource FROM s)" if put else "NULL::jsonb"
    row: asyncpg.Record = await conn.fetchrow(
        f"""WITH {", ".join(ctes)}
            SELECT {doc} AS doc, greatest({", ".join(times)}) AS updated_at""",
        *p.bind(values))
    return row


async def list_rows(conn: asyncpg.Pool, *, columns: str, table: str, where: str, params: Params,
                    order: str, offset: int, limit: int) -> tuple[int, list[asyncpg.Record]]:
    """The number of rows of ``table`` matching ``where`` and a page of them (``columns``), in
    ``order``, from ``offset``."""
    total: int = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {where}", *params.values)
    if limit == 0 or offset >= total:
        return total, []
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""SELECT {columns} FROM {table} WHERE {where} ORDER BY {order}
            OFFSET {int(offset)} LIMIT {int(limit)}""", *params.values)
    return total, rows


async def put_user(conn: asyncpg.Connection, *, org_id: str, user_id: str, user_name: str,
                   external_id: str | None, resource: dict[str, Any]) -> None:
    """Keep what the directory said of the member. Raises asyncpg.UniqueViolationError
    (``USER_NAME_INDEX``) for a ``userName`` another member has."""
    await conn.execute(
        """INSERT INTO scim_users (organization_id, user_id, user_name, external_id, resource)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (organization_id, user_id) DO UPDATE
           SET user_name = EXCLUDED.user_name, external_id = EXCLUDED.external_id,
               resource = EXCLUDED.resource, updated_at = now()""",
        org_id, user_id, user_name, external_id, resource)


def _provision_statement() -> Statement:
    p = Params()
    sql = f"""WITH {users.create_from(p)},
{organizations.membership_from("u", p)},
s AS (
    INSERT INTO scim_users (organization_id, user_id, user_name, external_id, resource)
    SELECT membership.organization_id, membership.user_id, {p["user_name"]}::text,
           {p["external_id"]}::text, {p["resource"]}::jsonb
    FROM membership
    RETURNING resource, updated_at
), scim_event AS ({audit.insert_from("s", p, name="scim_event")})
SELECT membership.user_id AS id, membership.id AS membership_id, membership.status,
       membership.created_at, greatest(membership.updated_at, u.updated_at, s.updated_at)
       AS updated_at, u.email, u.name, true AS synced, s.resource AS doc
FROM u, membership, s"""
    return Statement(sql, p)


PROVISION: Final = _provision_statement()
"""A new user of the project made a member of the organization as the directory describes
it, in one statement (one round trip, atomic without a transaction of its own): the user with
its enrollment link, message and ``user.created`` (``users.create_from``), its membership and
``membership.created`` (``organizations.membership_from``), what the directory said of it and
``scim.user.synced`` (parameters ``scim_event_*``). When the project has a user with that
e-mail address already, nothing is written and there is no row."""


async def provision(conn: asyncpg.Connection | asyncpg.Pool,
                    values: Mapping[str, object]) -> asyncpg.Record | None:
    """Run :data:`PROVISION`: the member's row of the view (``USER_COLUMNS``' names), or None
    when the e-mail address is an existing user's. Raises asyncpg.UniqueViolationError
    (``USER_NAME_INDEX``: the ``userName`` is another member's), asyncpg.ForeignKeyViolationError
    (the organization is gone)."""
    row: asyncpg.Record | None = await conn.fetchrow(PROVISION.sql, *PROVISION.params.bind(values))
    return row


async def groups_of(conn: asyncpg.Connection, org_id: str, user_id: str) -> list[str]:
    """The ids of the organization's groups the member is in."""
    return [r["group_id"] for r in await conn.fetch(
        """SELECT group_id FROM scim_group_members WHERE organization_id = $1 AND user_id = $2
           ORDER BY group_id""", org_id, user_id)]


async def lock_active_members(conn: asyncpg.Connection, org_id: str) -> list[tuple[str, str]]:
    """The (group, user) pairs of the organization's groups whose member's membership is
    active, with the organization's groups and then its memberships locked (in id order)."""
    await conn.execute("SELECT 1 FROM scim_groups WHERE organization_id = $1 ORDER BY id "
                       "FOR UPDATE", org_id)
    await conn.execute("SELECT 1 FROM memberships WHERE organization_id = $1 ORDER BY id "
                       "FOR UPDATE", org_id)
    rows = await conn.fetch(
        """SELECT gm.group_id, gm.user_id FROM scim_group_members gm
           JOIN memberships m ON m.organization_id = gm.organization_id AND m.user_id = gm.user_id
           WHERE gm.organization_id = $1 AND m.status = 'active'
           ORDER BY gm.group_id, gm.user_id""", org_id)
    return [(r["group_id"], r["user_id"]) for r in rows]


# --- groups ------------------------------------------------------------------------------------

GROUP_DOC: Final = """jsonb_strip_nulls(jsonb_build_object(
    'displayName', g.display_name, 'externalId', g.external_id))"""
GROUP_MEMBERS: Final = """(SELECT jsonb_build_object('value', gm.user_id, 'type', 'User') AS v
    FROM scim_group_members gm WHERE gm.group_id = g.id) AS e"""
"""The members of the group ``g`` as the rows of a filter's ``EXISTS``."""
GROUP_COLUMNS: Final = "g.id, g.display_name, g.external_id, g.created_at, g.updated_at"
_MEMBERS: Final = """(SELECT coalesce(jsonb_agg(jsonb_build_object(
        'value', gm.user_id, 'type', 'User',
        'display', coalesce(gm.display, s.resource ->> 'displayName', nullif(u.name, ''),
                            u.email))
        ORDER BY gm.user_id), '[]'::jsonb)
    FROM scim_group_members gm JOIN users u ON u.id = gm.user_id
    LEFT JOIN scim_users s ON s.organization_id = gm.organization_id AND s.user_id = gm.user_id
    WHERE gm.group_id = g.id) AS members"""


def group_columns(*, members: bool) -> str:
    """``GROUP_COLUMNS``, and the members (``value``, ``type``, ``display``) unless not wanted."""
    return GROUP_COLUMNS + (", " + _MEMBERS if members else ", NULL::jsonb AS members")


async def find_group(conn: asyncpg.Connection | asyncpg.Pool, org_id: str, group_id: str, *,
                     lock: bool = False, members: bool = True) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {group_columns(members=members)} FROM scim_groups g
            WHERE g.id = $1 AND g.organization_id = $2"""
        + (" FOR UPDATE OF g" if lock else ""), group_id, org_id)
    return row


async def insert_group(conn: asyncpg.Connection, *, group_id: str, project_id: str, org_id: str,
                       display_name: str, external_id: str | None) -> None:
    """Raises asyncpg.UniqueViolationError (``DISPLAY_NAME_INDEX``)."""
    await conn.execute(
        """INSERT INTO scim_groups (id, project_id, organization_id, display_name, external_id)
           VALUES ($1, $2, $3, $4, $5)""",
        group_id, project_id, org_id, display_name, external_id)


async def update_group(conn: asyncpg.Connection, group_id: str, *, display_name: str,
                       external_id: str | None) -> None:
    """Raises asyncpg.UniqueViolationError (``DISPLAY_NAME_INDEX``)."""
    await conn.execute(
        """UPDATE scim_groups SET display_name = $2, external_id = $3, updated_at = now()
           WHERE id = $1""", group_id, display_name, external_id)


async def touch_group(conn: asyncpg.Connection, group_id: str) -> None:
    await conn.execute("UPDATE scim_groups SET updated_at = now() WHERE id = $1", group_id)


async def delete_group(conn: asyncpg.Connection, group_id: str) -> None:
    """Delete the group (its members' rows cascade)."""
    await conn.execute("DELETE FROM scim_groups WHERE id = $1", group_id)


async def members_of(conn: asyncpg.Connection, group_id: str) -> dict[str, str | None]:
    """The group's members and the ``display`` the directory gave each."""
    return {r["user_id"]: r["display"] for r in await conn.fetch(
        """SELECT user_id, display FROM scim_group_members WHERE group_id = $1
           ORDER BY user_id""", group_id)}


async def put_members(conn: asyncpg.Connection, group_id: str, org_id: str,
                      members: Mapping[str, str | None]) -> None:
    """Add the members (user id to ``display``), or set the ``display`` of those in already."""
    if members:
        await conn.execute(
            """INSERT INTO scim_group_members (group_id, organization_id, user_id, display)
               SELECT $1, $2, m.u, m.d FROM unnest($3::text[], $4::text[]) AS m(u, d)
               ON CONFLICT (group_id, user_id) DO UPDATE SET display = EXCLUDED.display""",
            group_id, org_id, list(members), list(members.values()))


async def remove_members(conn: asyncpg.Connection, group_id: str, user_ids: Sequence[str]) -> None:
    if user_ids:
        await conn.execute(
            "DELETE FROM scim_group_members WHERE group_id = $1 AND user_id = ANY($2::text[])",
            group_id, list(user_ids))


async def member_statuses(conn: asyncpg.Connection, org_id: str,
                          user_ids: Sequence[str]) -> dict[str, str]:
    """The membership status of each of ``user_ids`` that is a member of the organization, its
    membership share-locked (it cannot be removed under us)."""
    rows = await conn.fetch(
        """SELECT user_id, status FROM memberships
           WHERE organization_id = $1 AND user_id = ANY($2::text[]) FOR KEY SHARE""",
        org_id, list(user_ids))
    return {r["user_id"]: r["status"] for r in rows}
