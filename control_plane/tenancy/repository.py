"""Tenancy SQL: tenants, projects and their domains, API keys."""

from __future__ import annotations

from typing import Any, Final

import asyncpg

from common.access_tokens import Alg
from common.ids import new_id
from control_plane.tenancy.schemas import ApiKey

KEY_COLUMNS: Final = "id, name, prefix, last_four, scopes, created_at, revoked_at, created_by_key_id"
_PROJECT: Final = """
SELECT p.id, p.name, p.environment, p.tenant_id, p.created_at, p.signing_alg, p.cors_origins,
       ARRAY(SELECT d.domain FROM project_domains d WHERE d.project_id = p.id ORDER BY d.domain)
           AS domains
FROM projects p WHERE p.id = $1
"""


def api_key(row: asyncpg.Record) -> ApiKey:
    return ApiKey(**row)


async def insert_tenant_and_project(conn: asyncpg.Connection, *, tenant_id: str, tenant_name: str,
                                    project_id: str, project_name: str, environment: str) -> None:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant_id, tenant_name)
    await conn.execute(
        "INSERT INTO projects (id, tenant_id, name, environment) VALUES ($1, $2, $3, $4)",
        project_id, tenant_id, project_name, environment,
    )


async def insert_key(conn: asyncpg.Connection, *, project_id: str, name: str, prefix: str,
                     secret_hash: str, last_four: str, scopes: list[str],
                     created_by_key_id: str | None) -> ApiKey:
    row = await conn.fetchrow(
        f"""INSERT INTO api_keys (id, project_id, name, prefix, secret_hash, last_four, scopes,
                                  created_by_key_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {KEY_COLUMNS}""",
        new_id("key"), project_id, name, prefix, secret_hash, last_four, scopes,
        created_by_key_id,
    )
    assert row is not None
    return api_key(row)


async def lock_key(conn: asyncpg.Connection, project_id: str,
                   key_id: str) -> tuple[ApiKey, str] | None:
    """The project's key ``key_id`` locked for the transaction, with its secret's hash."""
    row = await conn.fetchrow(
        f"SELECT {KEY_COLUMNS}, secret_hash FROM api_keys WHERE id = $1 AND project_id = $2 FOR UPDATE",
        key_id, project_id,
    )
    if row is None:
        return None
    values = dict(row)
    digest = values.pop("secret_hash")
    return ApiKey(**values), digest


async def mark_key_revoked(conn: asyncpg.Connection, key_id: str) -> ApiKey:
    row = await conn.fetchrow(
        f"UPDATE api_keys SET revoked_at = now() WHERE id = $1 RETURNING {KEY_COLUMNS}", key_id)
    assert row is not None
    return api_key(row)


async def operator_project(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str, *,
                           create: bool) -> asyncpg.Record | None:
    """The tenant's operator project (id, name, environment; None: it has none, or no such
    tenant); made first when ``create``. Two first operators at once: one insert wins on the
    unique index, the other waits for it and then reads the winner's row in a statement of its
    own (a statement's snapshot predates a row committed while it waited)."""
    if create:
        made: asyncpg.Record | None = await conn.fetchrow(
            """INSERT INTO projects (id, tenant_id, name, environment, kind)
               SELECT $1, t.id, t.name || ' operators', 'operators', 'operators'
               FROM tenants t WHERE t.id = $2
               ON CONFLICT (tenant_id) WHERE kind = 'operators' DO NOTHING
               RETURNING id, name, environment""", new_id("proj"), tenant_id)
        if made is not None:
            return made
    found: asyncpg.Record | None = await conn.fetchrow(
        """SELECT id, name, environment FROM projects
           WHERE tenant_id = $1 AND kind = 'operators'""", tenant_id)
    return found


async def project_kind(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> str | None:
    """``application`` or ``operators``; None for an unknown project."""
    kind: str | None = await conn.fetchval("SELECT kind FROM projects WHERE id = $1", project_id)
    return kind


async def application_projects(conn: asyncpg.Connection | asyncpg.Pool,
                               tenant_id: str) -> list[asyncpg.Record]:
    """The tenant's projects but its operator project (id, name, environment), oldest first."""
    rows: list[asyncpg.Record] = await conn.fetch(
        """SELECT id, name, environment FROM projects
           WHERE tenant_id = $1 AND kind = 'application' ORDER BY id""", tenant_id)
    return rows


async def get_project(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> dict[str, Any]:
    """The project's own columns and its domains (the fields of ``Project`` but ``webauthn``,
    which is the passkeys domain's)."""
    row = await conn.fetchrow(_PROJECT, project_id)
    assert row is not None  # an authenticated key's project exists (FK, cascade on delete)
    return dict(row)


async def lock_project_alg(conn: asyncpg.Connection, project_id: str) -> Alg:
    alg: Alg = await conn.fetchval(
        "SELECT signing_alg FROM projects WHERE id = $1 FOR UPDATE", project_id)
    return alg


async def domains_of_others(conn: asyncpg.Connection, project_id: str,
                            domains: list[str]) -> list[str]:
    """Which of ``domains`` another project holds, sorted."""
    rows = await conn.fetch(
        """SELECT domain FROM project_domains
           WHERE domain = ANY($1::text[]) AND project_id <> $2 ORDER BY domain""",
        domains, project_id,
    )
    return [r["domain"] for r in rows]


async def domains_of(conn: asyncpg.Connection, project_id: str) -> set[str]:
    rows = await conn.fetch("SELECT domain FROM project_domains WHERE project_id = $1", project_id)
    return {r["domain"] for r in rows}


async def replace_domains(conn: asyncpg.Connection, project_id: str, *, added: list[str],
                          removed: list[str]) -> None:
    """Remove and add domains of the project. Raises asyncpg.UniqueViolationError when another
    project claimed one of ``added`` meanwhile."""
    await conn.execute(
        "DELETE FROM project_domains WHERE project_id = $1 AND domain = ANY($2::text[])",
        project_id, removed,
    )
    await conn.execute(
        "INSERT INTO project_domains (domain, project_id) SELECT unnest($1::text[]), $2",
        added, project_id,
    )


async def cors_origins(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> list[str] | None:
    """The project's ``cors_origins``; None for an unknown project."""
    found: list[str] | None = await conn.fetchval(
        "SELECT cors_origins FROM projects WHERE id = $1", project_id)
    return found


async def project_of_domain(conn: asyncpg.Connection | asyncpg.Pool, host: str) -> str | None:
    """The project that configured ``host`` as one of its domains, if any."""
    found: str | None = await conn.fetchval(
        "SELECT project_id FROM project_domains WHERE domain = $1", host)
    return found


async def set_cors_origins(conn: asyncpg.Connection, project_id: str, origins: list[str]) -> None:
    await conn.execute("UPDATE projects SET cors_origins = $2 WHERE id = $1", project_id, origins)
