"""GET and PATCH /v1/projects/me: the project of the calling API key.

``PATCH`` (scope ``keys:write``) sets the project's token settings: ``signing_alg`` (SPEC.md 2:
EdDSA default, RS256 available; a change rotates to a key of the new algorithm at once, the old
key staying published for its overlap window) and ``domains``, the hosts that name the project on
public endpoints (DESIGN.md "project of public endpoints"; a domain belongs to one project only).
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

import asyncpg
from aiohttp import web
from pydantic import field_validator

from common.appkeys import PG_POOL, SETTINGS
from common.errors import DomainInUse
from common.http import json_response
from common.schemas import RequestModel, parse_body
from common.settings import Settings
from control_plane import audit, signing_keys
from control_plane.appkeys import KMS, TOKENS
from control_plane.kms import LocalKms
from control_plane.principal import authenticate

_SELECT: Final = """
SELECT p.id, p.name, p.environment, p.tenant_id, p.created_at, p.signing_alg,
       ARRAY(SELECT d.domain FROM project_domains d WHERE d.project_id = p.id ORDER BY d.domain)
           AS domains
FROM projects p WHERE p.id = $1
"""
MAX_DOMAINS: Final = 100
_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


async def get_project(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> dict[str, Any]:
    """The project row as the API shows it (``id``, ``name``, ``environment``, ``tenant_id``,
    ``created_at``, ``signing_alg``, ``domains`` sorted)."""
    row = await conn.fetchrow(_SELECT, project_id)
    assert row is not None  # an authenticated key's project exists (FK, cascade on delete)
    return dict(row)


async def get_me(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    project = await get_project(request.app[PG_POOL], principal.project_id)
    return json_response(request, project)


def normalize_domain(value: str) -> str:
    """A host name as matched against the request's host: lower-cased, trailing dot dropped,
    internationalized names in their ASCII (IDNA ``xn--``) form; LDH labels of 1 to 63
    characters, at most 253 in all; no IP address, port, scheme or path. Raises ValueError."""
    text = value.strip().lower().removesuffix(".")
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"{value!r} is not a valid host name") from None
    labels = text.split(".")
    if (
        not text or len(text) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ValueError(f"{value!r} is not a host name such as auth.example.com (no scheme, port, "
                         "path or IP address)")
    return text


class PatchProjectBody(RequestModel):
    signing_alg: Literal["EdDSA", "RS256"] | None = None
    domains: list[str] | None = None

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if len(v) > MAX_DOMAINS:
            raise ValueError(f"at most {MAX_DOMAINS} domains")
        return sorted({normalize_domain(d) for d in v})


async def update_project(
    conn: asyncpg.Connection, kms: LocalKms, settings: Settings, actor: audit.Actor, *,
    project_id: str, body: PatchProjectBody,
) -> dict[str, Any]:
    """Apply ``body`` in one transaction: replace the project's domain set, change
    ``signing_alg`` (rotating to a key of the new algorithm, ``signing_key.rotated``), and record
    ``project.updated`` with what changed (nothing changed: no event). Returns the changes
    (``domains: {added, removed}``, ``signing_alg: {from, to, kid}``).

    Raises DomainInUse (409) when another project has one of the domains.
    """
    changes: dict[str, Any] = {}
    async with conn.transaction():
        current = await conn.fetchval(
            "SELECT signing_alg FROM projects WHERE id = $1 FOR UPDATE", project_id
        )
        if body.domains is not None:
            taken = await conn.fetch(
                """SELECT domain FROM project_domains
                   WHERE domain = ANY($1::text[]) AND project_id <> $2 ORDER BY domain""",
                body.domains, project_id,
            )
            if taken:
                raise _in_use([r["domain"] for r in taken])
            existing = {r["domain"] for r in await conn.fetch(
                "SELECT domain FROM project_domains WHERE project_id = $1", project_id
            )}
            added, removed = sorted(set(body.domains) - existing), sorted(existing - set(body.domains))
            await conn.execute(
                "DELETE FROM project_domains WHERE project_id = $1 AND domain = ANY($2::text[])",
                project_id, removed,
            )
            try:
                await conn.execute(
                    """INSERT INTO project_domains (domain, project_id)
                       SELECT unnest($1::text[]), $2""",
                    added, project_id,
                )
            except asyncpg.UniqueViolationError:  # claimed by another project meanwhile
                raise _in_use(added) from None
            if added or removed:
                changes["domains"] = {"added": added, "removed": removed}
        if body.signing_alg is not None and body.signing_alg != current:
            key = await signing_keys.rotate_now(
                conn, kms, settings, actor, project_id=project_id, alg=body.signing_alg,
                reason="signing_alg_changed",
            )
            changes["signing_alg"] = {"from": current, "to": body.signing_alg, "kid": key["kid"]}
        if changes:
            await audit.record(
                conn, actor, action="project.updated", project_id=project_id,
                target_type="project", target_id=project_id,
                description=f"Updated the project's {' and '.join(sorted(changes))}",
                metadata={"changes": changes},
            )
    return changes


def _in_use(domains: list[str]) -> DomainInUse:
    return DomainInUse(f"Another project already uses {', '.join(domains)}.",
                       details={"domains": domains})


async def patch_me(request: web.Request) -> web.Response:
    """``PATCH /v1/projects/me`` (``keys:write``): optional ``signing_alg`` (``"EdDSA"`` or
    ``"RS256"``) and ``domains`` (host names; replaces the set). 200 with the project."""
    principal = await authenticate(request, "keys:write")
    body = await parse_body(request, PatchProjectBody)
    async with request.app[PG_POOL].acquire() as conn:
        changes = await update_project(
            conn, request.app[KMS], request.app[SETTINGS],
            audit.actor_from_request(request, principal), project_id=principal.project_id,
            body=body,
        )
        project = await get_project(conn, principal.project_id)
    if "signing_alg" in changes:
        request.app[TOKENS].forget(principal.project_id)
    return json_response(request, project)
